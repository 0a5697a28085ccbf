"""``python -m pettingllms_verl.eval.reproduce``: ``cli.main``."""

import sys

from pettingllms_verl.eval.reproduce.cli import main

if __name__ == "__main__":
    sys.exit(main())
