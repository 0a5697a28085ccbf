"""The reproduction's statistics: pure functions over success rates (scipy for the distributions).

Two sources of noise stand between a training method and a number on a test split, and a claim must
survive both:

- **training runs** differ (data order, sampling): a method's figure is the mean over its seeds, with
  a t interval from the variance between seeds (seeds - 1 degrees of freedom, ``seed_interval``); two
  sets of runs (a method against its warm start, or against another method) are compared by Welch's t
  (``seed_difference``). With one seed there is no between-run variance: no interval, no claim.
- **test problems** are a sample: the same problems are played before and after (or by two methods),
  so their difference is paired by problem, with a bootstrap over problems (``paired_problems``).

The binomial standard error of one evaluation (``results.binomial_se``) describes that evaluation's
noise alone: it says nothing about how much another training run would differ.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats

LEVEL = 0.95  # every interval's confidence level
BOOTSTRAP_RESAMPLES = 10_000
EXACT = 1e-12  # a spread below this is float rounding (0.6 - 0.5 is not 0.5 - 0.4): the figures moved alike
WELCH, PAIRED_T = "Welch's t", "paired t by run"


def no_spread(values) -> bool:
    """True when ``values`` are equal up to float rounding: no interval can be estimated from them."""
    return float(np.ptp(np.asarray(values, dtype=float))) <= EXACT


def seed_interval(values: Sequence[float], level: float = LEVEL) -> dict | None:
    """Mean over training runs with its t interval; None with fewer than two runs. ``alike``: the runs
    are equal (up to rounding), so the zero-width interval estimates nothing.

    Args:
        values: (seeds,) one figure per training run (e.g. test success).
    """
    if len(values) < 2:
        return None
    x = np.asarray(values, dtype=float)
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    se, df = sd / math.sqrt(len(x)), len(x) - 1
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return {"mean": mean, "sd": sd, "se": se, "df": df, "low": mean - half, "high": mean + half, "level": level, "runs": len(x),
            "alike": no_spread(x)}


def seed_difference(a: Sequence[float], b: Sequence[float], level: float = LEVEL, paired: bool = False) -> dict | None:
    """mean(a) - mean(b) over training runs, its interval and two-sided p: Welch's t for two independent
    sets of runs (no equal variances assumed); with ``paired``, a paired t for two figures of the same
    runs (e.g. a run's policies as trained and swapped). None unless each side has two runs or more.

    Args:
        a, b: (runs,) one figure per run of each side (their counts may differ, unless ``paired``:
            then ``a[i]`` and ``b[i]`` are of the same run).
    """
    if len(a) < 2 or len(b) < 2:
        return None
    if paired and len(a) != len(b):
        raise ValueError(f"paired runs: {len(a)} against {len(b)} figures")
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diff, name = float(a_.mean() - b_.mean()), PAIRED_T if paired else WELCH
    if (no_spread(a_) and no_spread(b_)) or (paired and no_spread(a_ - b_)):  # t undefined: every run alike, or moved alike
        return {"diff": diff, "se": 0.0, "df": None, "low": diff, "high": diff, "t": None, "p": None, "test": name, "level": level,
                "runs": (len(a_), len(b_))}
    test = stats.ttest_rel(a_, b_) if paired else stats.ttest_ind(a_, b_, equal_var=False)
    interval = test.confidence_interval(confidence_level=level)
    se = float((a_ - b_).std(ddof=1) / math.sqrt(len(a_))) if paired else math.sqrt(a_.var(ddof=1) / len(a_) + b_.var(ddof=1) / len(b_))
    return {"diff": diff, "se": se, "df": float(test.df), "low": float(interval.low), "high": float(interval.high),
            "t": float(test.statistic), "p": float(test.pvalue), "test": name, "level": level, "runs": (len(a_), len(b_))}


def paired_problems(a: Mapping[str, Sequence[bool]], b: Mapping[str, Sequence[bool]], level: float = LEVEL,
                    resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> dict | None:
    """a - b over the test problems both played, paired by problem: each problem's success rate (over
    its episodes, e.g. one per seed) under a minus under b, averaged over problems, with a percentile
    bootstrap interval over problems and the share of bootstrap means on the other side of zero
    (``p``: two-sided). None when fewer than two problems are shared; ``unshared`` counts the problems
    one side played and the other did not (left out).

    Args:
        a, b: problem id -> the successes of its episodes under each side.
    """
    shared = sorted(a.keys() & b.keys())
    if len(shared) < 2:
        return None
    d = np.array([np.mean(a[p]) - np.mean(b[p]) for p in shared], dtype=float)
    diff, unshared = float(d.mean()), len(a.keys() ^ b.keys())
    if no_spread(d):  # every problem moved alike: no resample differs
        return {"diff": diff, "low": diff, "high": diff, "p": None if abs(diff) > EXACT else 1.0, "problems": len(shared),
                "unshared": unshared, "level": level}
    boot = stats.bootstrap((d,), np.mean, n_resamples=resamples, confidence_level=level, method="percentile",
                           rng=np.random.default_rng(seed))
    means = boot.bootstrap_distribution
    p = min(1.0, 2 * min(float((means <= 0).mean()), float((means >= 0).mean())))
    return {"diff": diff, "low": float(boot.confidence_interval.low), "high": float(boot.confidence_interval.high), "p": p,
            "problems": len(shared), "unshared": unshared, "level": level}


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (controls the family-wise error rate):
    the i-th smallest of m is multiplied by (m - i + 1), made non-decreasing, capped at 1. A None
    (no test) stays None and does not count in m.

    Args:
        pvalues: (m,) the family's raw p-values, in any order.

    Returns:
        the adjusted p-values, in the order given.
    """
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted


def longest_run(flags: Sequence[bool]) -> int:
    """The most consecutive True values in ``flags`` (e.g. training steps without a gradient)."""
    best = current = 0
    for flag in flags:
        current = current + 1 if flag else 0
        best = max(best, current)
    return best
