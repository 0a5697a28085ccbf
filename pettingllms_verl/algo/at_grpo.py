"""AT-GRPO: agent- and turn-wise GRPO as pure tensor functions, in the style of verl's core_algos.

A sample's reward is ``r = alpha * global + local`` (mixed in ``episodes/core.py``); its advantage is normalised within its group
g = (problem uid, turn, role, tree node), whose key reaches the estimator as one hashable entry
of ``index`` per row. Importing this module registers the estimator with verl as ``at_grpo``,
so ``algorithm.adv_estimator=at_grpo`` selects it.

Std convention: the unbiased (Bessel-corrected, ``n - 1``) group std, as verl's GRPO uses
(``torch.std`` in ``compute_grpo_outcome_advantage``, ``count - 1`` in ``group_mean_std``).
Deviation from verl's GRPO, per the AT-GRPO design: a singleton group gets advantage 0 (verl
gives it ``r / (1 + eps)``), and so does any group whose scores are all equal.
"""

from typing import Any

import numpy as np
import pandas as pd
import torch
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

AT_GRPO = "at_grpo"

__all__ = [
    "AT_GRPO",
    "compute_at_grpo_advantage",
    "group_ids",
    "group_stats",
    "permute_within_groups",
    "register_at_grpo",
    "zero_variance_frac",
]


def group_ids(index: Any) -> torch.Tensor:
    """Dense group ids ``0..G-1`` (in order of first appearance) for one hashable key per row.

    Hash-based factorisation (pandas), so two keys share an id only if they compare equal as
    Python objects: "1|t10" and "11|t0" stay apart, unlike verl's ``as_torch_index``, which
    also coerces numeric strings to ints ("01" == "1") and sorts (O(n log n)).

    Args:
        index: strings, tuples or any hashable keys: a 1-D numpy array (object or numeric),
            a list, or a 1-D torch tensor.

    Returns:
        `(torch.Tensor)` int64, shape (bs,)

    Raises:
        ValueError: index is not 1-D, or a key is None/NaN (a missing key is an upstream bug,
            and pandas would silently put every missing key into one group).
    """
    if isinstance(index, torch.Tensor):
        keys = index.detach().cpu().numpy()
    elif isinstance(index, np.ndarray):
        keys = index
    else:
        # fromiter keeps tuple keys as objects; np.asarray would turn equal-length tuples into 2-D
        keys = np.fromiter(index, dtype=object, count=len(index))
    if keys.ndim != 1:
        raise ValueError(f"group index must be 1-D (one key per row), got shape {keys.shape}")
    codes, _ = pd.factorize(keys)
    if (codes < 0).any():
        raise ValueError(f"group index has a None/NaN key at row {int(np.argmax(codes < 0))}")
    return torch.from_numpy(codes.astype(np.int64, copy=False))


def _group_moments(scores: torch.Tensor, index: Any) -> tuple[torch.Tensor, ...]:
    """Rows centred on their group mean, plus per-group count, unbiased std and an
    "informative" flag, fully vectorised (G = number of groups).

    Args:
        scores: `(torch.Tensor)` shape (bs,)
        index: one hashable group key per row.

    Returns:
        gid (bs,) int64 and centered (bs,) on ``scores.device``; count (G,) int64, std (G,),
        informative (G,) bool: the group has >= 2 samples and not all scores are equal.
        Float results are in the scores' dtype, at least float32.
    """
    gid = group_ids(index).to(scores.device)
    if gid.numel() != scores.numel():
        raise ValueError(f"index has {gid.numel()} keys for {scores.numel()} rows")
    s = scores.to(torch.promote_types(scores.dtype, torch.float32))
    count = torch.bincount(gid)  # ids are dense, so every group has count >= 1
    total = torch.zeros(count.numel(), dtype=s.dtype, device=s.device).index_add_(0, gid, s)
    centered = s - (total / count)[gid]
    m2 = torch.zeros_like(total).index_add_(0, gid, centered * centered)
    std = torch.sqrt(m2 / (count - 1).clamp_min(1))
    # Equal scores are detected exactly by max == min: their rounded mean can differ from them
    # by an ulp, which (r - mean) / (0 + eps) would blow up into a spurious advantage.
    hi = torch.full_like(total, -torch.inf).scatter_reduce_(0, gid, s, "amax")
    lo = torch.full_like(total, torch.inf).scatter_reduce_(0, gid, s, "amin")
    informative = (count > 1) & (hi > lo)
    return gid, centered, count, std, informative


def compute_at_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """AT-GRPO outcome advantage: GRPO over (problem uid, turn, role, node) groups.

    For each row i in group g, with r_i = sum of its token_level_rewards:
      a_i = (r_i - mean_g) / (std_g + epsilon)   (std_g unbiased, as in verl's GRPO)
      a_i = r_i - mean_g                         (norm_adv_by_std_in_grpo=False, Dr.GRPO style)
      a_i = 0                                    (g has one sample, or all its scores are equal)
    then broadcast over the response tokens and multiplied by response_mask.

    Args:
        token_level_rewards: `(torch.Tensor)` shape (bs, response_length)
        response_mask: `(torch.Tensor)` shape (bs, response_length)
        index: one hashable group key per row (see ``group_ids``); verl passes
            ``non_tensor_batch["uid"]``, so the trainer puts the AT-GRPO key there.
        epsilon: added to the std to avoid division by zero.
        norm_adv_by_std_in_grpo: divide by the group std.
        config: verl's ``algorithm`` config (AlgoConfig or DictConfig). verl passes the std switch
            only through it, so its ``norm_adv_by_std_in_grpo`` and ``epsilon`` (when present)
            override the arguments.
        **kwargs: verl's ``compute_advantage`` also passes ``reward_baselines`` when the batch
            has them; AT-GRPO does not use them.

    Returns:
        advantages: `(torch.Tensor)` shape (bs, response_length)
        returns: `(torch.Tensor)` shape (bs, response_length), equal to advantages (as in GRPO)
    """
    if config is not None:
        norm_adv_by_std_in_grpo = config.get("norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo)
        epsilon = config.get("epsilon", epsilon)
    with torch.no_grad():
        gid, centered, _, std, informative = _group_moments(token_level_rewards.sum(dim=-1), index)
        # one per-group factor, gathered once: 0 for uninformative groups, else 1 or 1 / (std + eps)
        scale = informative / (std + epsilon) if norm_adv_by_std_in_grpo else informative.to(std.dtype)
        scalars = centered * scale[gid]
        advantages = scalars.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask
    return advantages, advantages


def zero_variance_frac(scores: torch.Tensor, index: Any) -> float:
    """Fraction of multi-sample groups whose scores are all equal (no learning signal).

    Args:
        scores: `(torch.Tensor)` shape (bs,), one score per row.
        index: one hashable group key per row.

    Returns:
        the fraction over groups with >= 2 samples; 0.0 when there are none.
    """
    _, _, count, _, informative = _group_moments(scores, index)
    multi = count > 1
    num_multi = int(multi.sum())
    return float((multi & ~informative).sum()) / num_multi if num_multi else 0.0


def group_stats(index: Any) -> dict[str, float]:
    """Grouping metrics for logging.

    Args:
        index: one hashable group key per row.

    Returns:
        ``at_grpo/num_groups``, ``at_grpo/mean_group_size`` and ``at_grpo/singleton_frac``
        (fraction of groups with one sample, whose advantage is always 0; near 1 means the
        keys are too fine). Pair with ``zero_variance_frac`` for ``at_grpo/zero_variance_frac``.
    """
    count = torch.bincount(group_ids(index))
    num_groups = count.numel()
    return {
        "at_grpo/num_groups": float(num_groups),
        "at_grpo/mean_group_size": float(count.sum()) / num_groups if num_groups else 0.0,
        "at_grpo/singleton_frac": float((count == 1).sum()) / num_groups if num_groups else 0.0,
    }


def permute_within_groups(scores: Any, index: Any, rng: np.random.Generator) -> np.ndarray:
    """The null-training control's rewards: each group's scores shuffled among its rows at random.

    A group keeps its multiset of scores, so its mean, std and advantages' scale are unchanged and
    the update moves the policy as far as a trained step would; which reply earned which score is
    lost, so the reward carries no information about the replies. (Zeroing the advantages instead
    would give no policy-gradient step at all: no drift to control for.)

    Args:
        scores: one score per row, shape (bs,).
        index: one hashable group key per row (see ``group_ids``).
        rng: the permutations' source (seeded by the caller: the run's seed and step).

    Returns:
        `(np.ndarray)` float64, shape (bs,): the scores, permuted within each group (a group of
        one row keeps its score).
    """
    values = np.asarray(scores, dtype=np.float64)
    gid = group_ids(index).numpy()
    if gid.shape != values.shape:
        raise ValueError(f"index has {gid.size} keys for {values.size} rows")
    permuted = values.copy()
    for group in np.unique(gid):
        rows = np.flatnonzero(gid == group)
        permuted[rows] = values[rng.permutation(rows)]
    return permuted


def register_at_grpo() -> None:
    """Register ``compute_at_grpo_advantage`` with verl as ``at_grpo``; idempotent.

    verl's ``register_adv_est`` raises when a name is bound to a different function object. A
    reloaded copy of this module is ours, so its stale entry is replaced; any other function
    under the name still makes verl raise.
    """
    existing = ADV_ESTIMATOR_REGISTRY.get(AT_GRPO)
    ours = (compute_at_grpo_advantage.__module__, compute_at_grpo_advantage.__qualname__)
    if existing is not None and (existing.__module__, existing.__qualname__) == ours:
        del ADV_ESTIMATOR_REGISTRY[AT_GRPO]
    register_adv_est(AT_GRPO)(compute_at_grpo_advantage)


register_at_grpo()
