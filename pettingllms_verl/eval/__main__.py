"""``python -m pettingllms_verl.eval`` (console script ``pettingllms-eval``): ``eval/evaluate.py``'s command."""

import sys

from pettingllms_verl.eval.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
