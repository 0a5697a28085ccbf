"""Success per method, split and seed into gains, comparisons between methods, the swap's difference in differences, Holm's adjustment and collapsed runs."""

from __future__ import annotations

import json
from pathlib import Path


from pettingllms_verl.eval import stats
from pettingllms_verl.eval.results import binomial_se
from pettingllms_verl.eval.reproduce.methods import COLLAPSE_STEPS, LAST, METHODS, SPLITS, SWAPPED, run_label


def _role_rewards(row: dict | None) -> dict[str, float]:
    return {role: stats["reward_mean"] for role, stats in (row or {}).get("roles", {}).items()}


def _row_of(evaluation: dict | None, label: str, swapped: bool) -> dict | None:
    return next((r for r in (evaluation or {}).get("rows", []) if r["label"] == label and r["swapped"] == swapped), None)


def _outcomes_of(evaluations: list[tuple[dict, str]], swapped: bool) -> dict[str, list[bool]]:
    """test problem -> its successes over the given (evaluation, run label) pairs (one per seed)."""
    merged: dict[str, list[bool]] = {}
    for evaluation, label in evaluations:
        for problem, wins in evaluation.get("outcomes", {}).get(label, {}).get(str(int(swapped)), {}).items():
            merged.setdefault(problem, []).extend(wins)
    return merged


def _mean_roles(rows: list[dict]) -> dict[str, float]:
    per_seed = [_role_rewards(row) for row in rows]
    return {role: sum(r[role] for r in per_seed) / len(per_seed) for role in sorted(set().union(*per_seed)) if all(role in r for r in per_seed)}


def aggregate(before: dict, after: dict, methods: list[str], seeds: list[int], sources: dict[str, str] | None = None,
              failed: dict[str, str] | None = None, not_evaluated: dict[str, str] | None = None,
              alike: set[str] | frozenset = frozenset(), last_step: int | None = None) -> list[dict]:
    """One row per method (and per-role swapped), per split: test success before (the evaluations of
    ``sources[method]``, ``before_sources``; default its own: one per training seed, each sampled with
    that seed) and after (each seed's run at its best step on val; ``*_last``: at its last step,
    ``last_step``, played under the label ``<run>-last`` unless that is its best step), per seed and as a
    mean over seeds with its t interval (``stats.seed_interval``); the gain over before across runs
    (Welch's t, ``stats.seed_difference``) and paired over test problems (``stats.paired_problems``); per
    role its mean reward. A swapped row's "before" is the warm start swapped (for a method in ``alike``,
    whose policies start from the same weights, the warm start itself: swapped, it is the same team),
    and its ``swap_effect`` the difference in differences over the runs: (as trained - swapped) after,
    minus the same before, a paired t by run. A seed in ``failed`` (label -> why) is listed as failed and
    left out of every figure; one in ``not_evaluated`` (label -> why: trained, not yet played after
    training) likewise, listed as such.

    ``before``, ``after``: split -> seed -> an evaluation (``read_evaluation``)."""
    failed, not_evaluated = failed or {}, not_evaluated or {}
    left_out = {**failed, **not_evaluated}
    table = []
    for method in methods:
        source = (sources or {}).get(method, method)
        for swapped in ([False, True] if method in SWAPPED else [False]):
            labels = {seed: run_label(method, seed) for seed in seeds}
            row = {"method": method, "recipe": METHODS[method][0], "name": METHODS[method][1] + (", policies swapped" if swapped else ""),
                   "swapped": swapped, "failed_seeds": {s: failed[label] for s, label in labels.items() if label in failed},
                   "not_evaluated_seeds": {s: not_evaluated[label] for s, label in labels.items() if label in not_evaluated}, "splits": {}}
            for split in after.keys() | before.keys():
                starts = {s: r for s in seeds if (r := _before_row(before.get(split, {}).get(s), source, swapped, method in alike)) is not None}
                ends = {s: r for s in seeds if labels[s] not in left_out and (r := _row_of(after.get(split, {}).get(s), labels[s], swapped)) is not None}
                lasts = {s: r for s in ends if (r := _last_row(after[split][s], labels[s], swapped, ends[s], last_step)) is not None}
                b = [r["success"] for r in starts.values()]
                b_out = _outcomes_of([(before[split][s], source) for s in starts], swapped and method not in alike)
                part = {"before_per_seed": {s: r["success"] for s, r in starts.items()}, "before": stats.seed_interval(b),
                        "before_mean": sum(b) / len(b) if b else None, "before_swapped_is_as_trained": swapped and method in alike,
                        "role_reward_before": _mean_roles(list(starts.values()))}
                for name, runs_ in (("after", ends), ("after_last", lasts)):
                    a = [r["success"] for r in runs_.values()]
                    a_out = _outcomes_of([(after[split][s], r["label"]) for s, r in runs_.items()], swapped)
                    gain = "gain" if name == "after" else "gain_last"
                    part.update({f"{name}_per_seed": {s: r["success"] for s, r in runs_.items()}, name: stats.seed_interval(a),
                                 f"{name}_mean": sum(a) / len(a) if a else None, gain: stats.seed_difference(a, b),
                                 f"{gain}_paired": stats.paired_problems(a_out, b_out)})
                    if name == "after":
                        part.update({"after_min": min(a, default=None), "after_max": max(a, default=None),
                                     "outcomes": a_out})  # for comparisons between methods; not written to reproduce.json
                part.update({
                    "after_step_per_seed": {s: r.get("step") for s, r in ends.items()},
                    "episodes_per_seed": {s: r["episodes"] for s, r in ends.items()},
                    # one evaluation's own noise (binomial): a description of it, not of another training run
                    "after_binomial_se_per_seed": {s: binomial_se(r["success"], r["episodes"]) for s, r in ends.items()},
                    "role_reward_after": _mean_roles(list(ends.values())),
                })
                row["splits"][split] = part
            table.append(row)
    for row in table:  # the swap's effect: what training added to the cost of swapping, run by run
        trained = next((r for r in table if r["method"] == row["method"] and not r["swapped"]), None) if row["swapped"] else None
        for split, part in row["splits"].items():
            part["swap_effect"] = None if trained is None else swap_effect(trained["splits"][split], part)
    return table


def _before_row(evaluation: dict | None, source: str, swapped: bool, alike: bool) -> dict | None:
    """A method's warm start as ``aggregate`` reads it: swapped where asked, unless its policies start alike (the same team)."""
    return _row_of(evaluation, source, swapped and not alike)


def _last_row(evaluation: dict, label: str, swapped: bool, best: dict, last_step: int | None) -> dict | None:
    """A run at its last step: its ``LAST`` evaluation, or its best-on-val one when that is its last step."""
    found = _row_of(evaluation, label + LAST, swapped)
    if found is None and last_step is not None and best.get("step") == last_step:
        return best
    return found


def swap_effect(trained: dict, swapped: dict) -> dict | None:
    """(as trained - swapped) after training minus (as trained - swapped) before it, per run, with a
    paired t over the runs that have all four figures (``stats.seed_difference``); None under two runs."""
    seeds = sorted(trained["after_per_seed"].keys() & swapped["after_per_seed"].keys()
                   & trained["before_per_seed"].keys() & swapped["before_per_seed"].keys())
    after = [trained["after_per_seed"][s] - swapped["after_per_seed"][s] for s in seeds]
    before = [trained["before_per_seed"][s] - swapped["before_per_seed"][s] for s in seeds]
    found = stats.seed_difference(after, before, paired=True)
    return None if found is None else {**found, "after": sum(after) / len(after), "before": sum(before) / len(before)}


# (a, b): the after-training comparisons the reproduction reports, by method (and swapped)
COMPARISONS = [(("per_role", False), ("control", False)), (("mas", False), ("sa", False)), (("per_role", False), ("sa", False)),
               (("mas", False), ("mas_by_problem", False)), (("per_role", False), ("mas", False)), (("per_role", True), ("per_role", False)),
               (("real", True), ("real", False)), (("program", False), ("mas", False)), (("per_role_async", False), ("per_role", False))]


def comparisons(table: list[dict], primary: dict | None = None) -> list[dict]:
    """After training, per split, each pair of ``COMPARISONS`` present in ``table`` (and the ``primary``
    claim's, marked ``primary``): a - b across training runs (Welch's t over the seeds' figures) and
    paired over the test problems both played."""
    rows = {(row["method"], row["swapped"]): row for row in table}
    pairs = list(COMPARISONS)
    if primary and ((primary["a"], False), (primary["b"], False)) not in pairs:
        pairs.insert(0, ((primary["a"], False), (primary["b"], False)))
    found = []
    for a, b in pairs:
        if a not in rows or b not in rows:
            continue
        for split in sorted(rows[a]["splits"].keys() & rows[b]["splits"].keys(), key=split_order):
            x, y = rows[a]["splits"][split], rows[b]["splits"][split]
            if x["after_per_seed"] and y["after_per_seed"]:
                if a[0] == b[0]:  # the same runs, swapped and not: paired by seed
                    seeds = sorted(x["after_per_seed"].keys() & y["after_per_seed"].keys())
                    over_seeds = stats.seed_difference([x["after_per_seed"][s] for s in seeds], [y["after_per_seed"][s] for s in seeds], paired=True)
                else:
                    over_seeds = stats.seed_difference(list(x["after_per_seed"].values()), list(y["after_per_seed"].values()))
                found.append({"split": split, "a": rows[a]["name"], "b": rows[b]["name"], "seeds": over_seeds,
                              "paired": stats.paired_problems(x["outcomes"], y["outcomes"]),
                              "primary": bool(primary) and (a, b, split) == ((primary["a"], False), (primary["b"], False), primary["split"])})
    return found


def secondary_tests(table: list[dict], found: list[dict]) -> list[dict]:
    """Every test over training runs the tables report besides the primary claim, as the dicts that
    hold its ``p``: each method's gain over its warm start (best step and last), each swap's effect and
    each comparison between methods. They form the family Holm's adjustment is made over."""
    family = [part[key] for row in table for part in row["splits"].values()
              for key in ("gain", "gain_last", "swap_effect") if part.get(key)
              and not (key == "gain_last" and part["after_last_per_seed"] == part["after_per_seed"])]  # every run's last step its best: one test
    return family + [c["seeds"] for c in found if c["seeds"] and not c["primary"]]


def adjust(table: list[dict], found: list[dict]) -> int:
    """Holm-adjust the secondary tests in place (``p_holm`` beside each ``p``); returns the family's size."""
    family = secondary_tests(table, found)
    for test, adjusted in zip(family, stats.holm([test["p"] for test in family])):
        test["p_holm"] = adjusted
    return sum(test["p"] is not None for test in family)


def collapses(curve: Path) -> dict | None:
    """A run's steps without a gradient (``actor/grad_norm`` 0: every group of the step gave its replies one
    reward), from its curve: how many, the longest streak, and whether it reaches ``COLLAPSE_STEPS``."""
    try:
        steps = [json.loads(line) for line in curve.read_text().splitlines() if line.strip()]
        flat = [float(step["data"]["actor/grad_norm"]) == 0.0 for step in sorted(steps, key=lambda step: step["step"])
                if "actor/grad_norm" in step.get("data", {})]  # a validation-only record has none
    except (OSError, ValueError, KeyError, TypeError):
        return None
    streak = stats.longest_run(flat)
    return {"steps": len(flat), "without_gradient": sum(flat), "longest": streak, "collapsed": streak >= COLLAPSE_STEPS}


def split_order(split: str) -> tuple[int, str]:
    return (SPLITS.index(split) if split in SPLITS else len(SPLITS), split)
