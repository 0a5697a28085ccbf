"""AT-GRPO: group keys and advantages (pure tensor functions); rewards are mixed where they are
made, per sample, in ``episodes/core.py``.

Importing this package registers the ``at_grpo`` advantage estimator with verl.
"""

from pettingllms_verl.algo import at_grpo
from pettingllms_verl.algo.at_grpo import *  # noqa: F403 - the package's names are at_grpo's own

__all__ = at_grpo.__all__
