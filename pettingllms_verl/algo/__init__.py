"""AT-GRPO: group keys and advantages (pure tensor functions); rewards are mixed where they are
made, per sample, in ``rollout/episode.py``.

Importing this package registers the ``at_grpo`` advantage estimator with verl.
"""

from pettingllms_verl.algo.at_grpo import (
    AT_GRPO,
    compute_at_grpo_advantage,
    group_ids,
    group_stats,
    register_at_grpo,
    zero_variance_frac,
)

__all__ = [
    "AT_GRPO",
    "compute_at_grpo_advantage",
    "group_ids",
    "group_stats",
    "register_at_grpo",
    "zero_variance_frac",
]
