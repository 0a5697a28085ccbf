"""``reproduce.md``, ``reproduce.json`` and the plots, from the aggregated figures."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


from pettingllms_verl.eval import plots, stats
from pettingllms_verl.eval.reproduce.aggregation import adjust, aggregate, collapses, comparisons, split_order
from pettingllms_verl.eval.reproduce.methods import COLLAPSE_STEPS, CONTROL_OF, METHODS, SPLIT_NAMES, run_label
from pettingllms_verl.eval.reproduce.training import launch_times


def public(table: list[dict]) -> list[dict]:
    """The table as reproduce.json holds it: without the per-problem outcomes."""
    return [{**row, "splits": {split: {k: v for k, v in part.items() if k != "outcomes"} for split, part in row["splits"].items()}}
            for row in table]


def _interval_text(interval: dict | None, values: list[float]) -> str:
    if interval is not None and interval["alike"]:
        return f"{interval['mean']:.3f} (all {interval['runs']} alike: no interval)"
    if interval is not None:
        return f"{interval['mean']:.3f} [{interval['low']:.3f}, {interval['high']:.3f}]"
    return f"{values[0]:.3f} (one run)" if values else "-"


def _p_text(p: float | None, bootstrap: bool) -> str:
    if p is None:
        return ""
    if bootstrap and p == 0:  # no resample on the other side of zero: below 2/B, not 0
        return f", p < {2 / stats.BOOTSTRAP_RESAMPLES:g}"
    return f", p = {p:.3f}" if p >= 0.001 else f", p = {p:.1e}" if p > 0 else ", p < 1e-300"


def _gain_text(gain: dict | None) -> str:
    """A difference over seeds (``stats.seed_difference``) or paired over problems (``stats.paired_problems``)."""
    if gain is None:
        return "n/a (needs 2+ runs a side)"
    bootstrap = "problems" in gain
    if gain["low"] == gain["high"]:
        return f"{gain['diff']:+.3f} (every {'problem' if bootstrap else 'run'} moved alike: no interval)"
    text = f"{gain['diff']:+.3f} [{gain['low']:+.3f}, {gain['high']:+.3f}]{_p_text(gain['p'], bootstrap)}"
    if gain.get("p_holm") is not None:
        text += f" (Holm {gain['p_holm']:.3f})" if gain["p_holm"] >= 0.001 else f" (Holm {gain['p_holm']:.1e})"
    return text + (f", on the {gain['problems']} problems both played" if bootstrap and gain["unshared"] else "")


def markdown(table: list[dict], meta: dict) -> str:
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    seeds = meta["seeds"]
    level = f"{stats.LEVEL:.0%}"
    lines = [
        "# Reproduction: Plan-Path 4x4 in one turn (routes of 2-3 moves), models warm-started on noisy demonstrations",
        "",
        f"Test success (share of {meta['episodes'] or '-'} problems solved, sampled at T = 1"
        + (f"; avg@{meta['samples']}: {meta['samples']} episodes per problem" if meta.get("samples", 1) > 1 else "") + ") before training (the warm start, "
        f"evaluated once per training seed with that seed's sampling) and after {meta['steps']} steps (each run's best step on "
        f"val; its last step in the second table), training seeds {', '.join(map(str, seeds))}. After: the mean over training runs with its {level} t interval "
        "from the variance between runs (seeds - 1 degrees of freedom); before: the mean of the warm start's evaluations "
        "with the same interval, whose spread is evaluation noise alone (one warm start). Gain over seeds: after - before, "
        f"Welch's t over the two sets ({level} interval, two-sided p). Gain paired over problems: the same problems before and after, "
        f"each problem's success averaged over seeds, with a {level} bootstrap interval over problems (p: the share of "
        f"{stats.BOOTSTRAP_RESAMPLES} resamples on the other side of zero, two-sided). " +
        (f"Written again (`--report`) from saved evaluations, all made by the package's source sha256 "
         f"{meta['source_sha256'][:12]}." if meta.get("report") else
         f"This invocation took {meta['wall_s'] / 60:.0f} min, not counting the warm start and data made before it "
         "(`make reproduce` makes both) nor evaluations and training runs kept from an earlier invocation."),
    ]
    if len(seeds) < 2:
        lines += ["", "**One training seed**: the variance between training runs cannot be estimated, so no interval over "
                  "seeds and no gain over seeds is given, and no claim about training runs is made; the paired figures "
                  "describe this one run on these problems."]
    lines += ["", *primary_text(meta)]
    if meta.get("family"):
        lines += ["", f"**Secondary tests** (every other p over training runs below, {meta['family']} of them): each p is given with "
                  "its Holm adjustment over that family (`Holm`), which is the one to read for a claim; a paired p over problems "
                  "describes the runs made, not another set of runs, and is not adjusted."]
    for split in sorted({split for row in table for split in row["splits"]}, key=split_order):
        what = SPLIT_NAMES.get(split, split)
        lines += ["", f"## {what} (`{split}`{', sha256 ' + meta['split_sha256'][split][:16] if split in meta.get('split_sha256', {}) else ''})", "",
                  "| method | before | after | gain over seeds | gain paired over problems | " + " | ".join(f"seed {s}" for s in seeds)
                  + " | role reward: before -> after (mean) |",
                  "|---|---|---|---|---|" + "---|" * len(seeds) + "---|"]
        for row in table:
            part = row["splits"].get(split)
            if part is None:
                continue
            roles = ", ".join(f"{role} {fmt(part['role_reward_before'].get(role))} -> {fmt(reward)}" for role, reward in part["role_reward_after"].items())
            before = _interval_text(part["before"], list(part["before_per_seed"].values()))
            after = _interval_text(part["after"], list(part["after_per_seed"].values()))
            cells = ["left out" if s in row["failed_seeds"] or s in row["not_evaluated_seeds"] else fmt(part["after_per_seed"].get(s)) for s in seeds]
            line = [row["name"], before, after, _gain_text(part["gain"]), _gain_text(part["gain_paired"]), *cells, roles or "-"]
            lines.append("| " + " | ".join(line) + " |")
        lines += ["", f"At each run's last step ({meta['steps']}), {what.lower()}:", "",
                  "| method | after, last step | gain over seeds | gain paired over problems | " + " | ".join(f"seed {s}" for s in seeds) + " |",
                  "|---|---|---|---|" + "---|" * len(seeds)]
        for row in table:
            if (part := row["splits"].get(split)) is not None:
                cells = [fmt(part["after_last_per_seed"].get(s)) for s in seeds]
                lines.append("| " + " | ".join([row["name"], _interval_text(part["after_last"], list(part["after_last_per_seed"].values())),
                                                 _gain_text(part["gain_last"]), _gain_text(part["gain_last_paired"]), *cells]) + " |")
        swaps = [(row, part) for row in table if row["swapped"] and (part := row["splits"].get(split)) is not None]
        if swaps:
            lines += ["", "The swap's effect, (as trained - swapped) after training minus the same before it, run by run "
                      f"({stats.PAIRED_T}): what training added to the cost of swapping. A swapped warm start that costs as much "
                      "as the trained swap says the warm start, not training, made the roles apart.", ""]
            for row, part in swaps:
                effect = part["swap_effect"]
                same = " (the warm start gives both policies the same weights: swapped, it is the same team, so before = 0)" \
                    if part["before_swapped_is_as_trained"] else ""
                lines.append(f"- {row['name']}: " + ("n/a (needs 2+ runs with all four figures)" if effect is None else
                             f"after {effect['after']:+.3f}, before {effect['before']:+.3f}{same}: {_gain_text(effect)}"))
        lines += ["", f"After training on {what.lower()}, a - b (over seeds: {stats.WELCH} between methods, a {stats.PAIRED_T} "
                  "for one method's policies swapped; paired: over problems):", ""]
        lines += [f"- {c['a']} - {c['b']}: over seeds{' (' + c['seeds']['test'] + ')' if c['seeds'] else ''} {_gain_text(c['seeds'])}; "
                  f"paired {_gain_text(c['paired'])}"
                  for c in meta.get("comparisons", []) if c["split"] == split] or ["- (no pair of methods ran)"]
        noise = next(((part["episodes_per_seed"][s], part["after_binomial_se_per_seed"][s]) for row in table
                      if (part := row["splits"].get(split)) for s in part["episodes_per_seed"]), None)
        if noise:
            lines += ["", f"One evaluation's own noise (binomial, {noise[0]} episodes): about ±{noise[1]:.3f} on a success rate, "
                      "a description of that evaluation alone; a claim about training rests on the intervals over seeds."]
    lines += ["", "Role reward: the mean reward of a role's replies in the test episodes (`before/` and `after/`).",
              "", "Warm starts (sha256 of their weights; verl's SFT gives other bits on another machine, so \"before\" is measured "
              "per run and a rerun elsewhere compares gains, not levels): "
              + "; ".join(f"{METHODS[method][1]}: " + ", ".join(_warm_text(policy, start) for policy, start in policies.items())
                          for method, policies in meta["warm_starts"].items()) + "."]
    timed = {m: [t for t in per_seed.values() if t is not None] for m, per_seed in meta.get("train_wall_s", {}).items()}
    if any(timed.values()):
        lines += ["", "Training time per method (its runs' main_ppo launches, summed; --jobs at once): " + "; ".join(
            f"{METHODS[m][1]} {sum(times) / 60:.0f} min over {len(times)} runs" for m, times in timed.items() if times) + "."]
    if meta.get("collapses"):
        lines += ["", f"Collapsed runs ({COLLAPSE_STEPS} training steps in a row or more without a gradient: every group of each "
                  "step gave its replies one reward): " + "; ".join(
                      f"{METHODS[method][1]} {sum(bool(c and c['collapsed']) for c in runs_.values())} of {sum(c is not None for c in runs_.values())}"
                      + "".join(f" (seed {seed}: {c['without_gradient']} of {c['steps']} steps without, {c['longest']} in a row)"
                                for seed, c in runs_.items() if c and c["collapsed"])
                      for method, runs_ in meta["collapses"].items()) + "."]
    for method, source in meta.get("before_of", {}).items():
        why = ("untrained, a control is the team it controls for" if method in CONTROL_OF
               else "every role from the same model")
        lines += ["", f"Before training, {METHODS[method][1]} is the team of {METHODS[source][1]} ({why}): "
                  "one evaluation stands for both."]
    for row in table:
        for seed, why in sorted({**row["failed_seeds"], **row["not_evaluated_seeds"]}.items()):
            if not row["swapped"]:
                lines += ["", f"**{row['name']}, seed {seed}: left out of the figures**: {why}"]
    return "\n".join(lines) + "\n"


def _warm_text(policy: str, start) -> str:
    if isinstance(start, dict):  # {"model": folder name, "sha256": ...}
        return f"{policy} `{start['model']}` ({str(start.get('sha256'))[:12]})"
    return f"{policy} `{start}`"


def primary_text(meta: dict) -> list[str]:
    """The primary claim as declared (before any "after" existed) and what its test gave."""
    declared = meta.get("primary")
    if not declared:
        return ["**No primary claim was declared**: every test below is secondary, Holm-adjusted over the family."]
    claim = declared["claim"]
    head = (f"**Primary claim** (declared {declared['declared_at']}, before any evaluation after training existed): "
            f"{METHODS[claim['a']][1]} minus {METHODS[claim['b']][1]}, {claim['statistic']}, on the "
            f"{SPLIT_NAMES.get(claim['split'], claim['split']).lower()} (`{claim['split']}`); {claim['test']}, alpha {claim['alpha']}.")
    result = meta.get("primary_result")
    if result is None or result["seeds"] is None:
        return [head, "", "Its test: not made (needs 2+ finished runs of each method on that split)."]
    test = result["seeds"]
    holds = test["p"] is not None and test["p"] < claim["alpha"] and test["diff"] > 0
    return [head, "", f"Its test over {test['runs'][0]} and {test['runs'][1]} runs: {_gain_text(test)}: "
            + ("**it holds**." if holds else "**it does not hold** at that level.")]


def plot_table(table: list[dict], out: Path) -> str:
    """``reproduce.png``: test success per method before and after training (mean over seeds, min-max bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    labelled = set()

    def label(text: str) -> str | None:  # each legend entry once
        return None if text in labelled or labelled.add(text) else text

    split = min((split for row in table for split in row["splits"]), key=split_order, default=None)
    for i, row in enumerate(table):
        part = row["splits"].get(split) or {}
        if part.get("before_mean") is not None:
            spread = [[part["before_mean"] - min(part["before_per_seed"].values())], [max(part["before_per_seed"].values()) - part["before_mean"]]]
            ax.bar(i - 0.2, part["before_mean"], 0.4, yerr=spread, capsize=4, color="lightgrey", label=label("before (warm start; mean, min-max over seeds)"))
        if part.get("after_mean") is not None:
            spread = [[part["after_mean"] - part["after_min"]], [part["after_max"] - part["after_mean"]]]
            ax.bar(i + 0.2, part["after_mean"], 0.4, yerr=spread, capsize=4, color="tab:red" if row["swapped"] else "tab:blue",
                   label=label("after, swapped" if row["swapped"] else "after (mean, min-max over seeds)"))
    ax.set_xticks(range(len(table)), [row["name"].replace(", ", ",\n", 1) for row in table], fontsize=8)
    ax.set_ylabel(f"success on the {split} split")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "reproduce.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def curve_file(out: Path, label: str) -> Path:
    """A run's learning curve: its training log, or where an archive keeps it (``checkpoints/<run>/curve.jsonl``)."""
    log, kept = out / "logs" / f"{label}.jsonl", out / "checkpoints" / label / "curve.jsonl"
    return kept if not log.is_file() and kept.is_file() else log


def write_table(out: Path, args: argparse.Namespace, before: dict, after: dict, sources: dict[str, str], failed: dict[str, str],
                meta: dict, curves: Path | None = None) -> None:
    """reproduce.json, reproduce.md, reproduce.png and the learning curves (the runs' in ``curves``,
    default ``out``: ``logs/``, or an archive's ``checkpoints/<run>/curve.jsonl``), and the table printed.
    A run in ``failed`` or ``meta["not_evaluated"]`` is left out of the figures; the latter's curve is drawn."""
    not_evaluated = meta.get("not_evaluated", {})
    table = aggregate(before, after, args.methods, args.seeds, sources, failed, not_evaluated, set(meta.get("alike", [])), meta["steps"])
    played = next((r for split in after.values() for ev in split.values() for r in ev["rows"]), None)
    sampled = (played or {}).get("sampled") or {}
    episodes = sampled.get("problems", played["episodes"]) if played else None
    claim = (meta.get("primary") or {}).get("claim")
    found = comparisons(table, claim)
    family = adjust(table, found)
    curve_of = {label: curve_file(curves or out, label) for label in (run_label(m, s) for m in args.methods for s in args.seeds)}
    meta = {**meta, "seeds": args.seeds, "splits": args.splits, "episodes": episodes,
            "before_of": {m: source_of for m, source_of in sources.items() if source_of != m}, "comparisons": found, "failed": failed,
            "samples": sampled.get("samples", 1), "not_evaluated": not_evaluated, "family": family,
            "primary_result": next((c for c in found if c["primary"]), None),
            "collapses": {m: {s: collapses(curve_of[run_label(m, s)]) for s in args.seeds} for m in args.methods},
            "train_wall_s": {m: {s: sum(t) if (t := launch_times((curves or out) / "checkpoints" / run_label(m, s))) else None
                                 for s in args.seeds} for m in args.methods}}
    (out / "reproduce.json").write_text(json.dumps({**meta, "rows": public(table)}, indent=1))
    (out / "reproduce.md").write_text(markdown(table, meta))
    drawn = [label for label, curve in curve_of.items() if label not in failed and (label not in not_evaluated or curve.is_file())]
    logs = {m: [str(curve_of[run_label(m, s)]) for s in args.seeds if run_label(m, s) in drawn] for m in args.methods}
    curve_args = [f"--curves={m}=" + ",".join(files) for m, files in logs.items() if files]
    if plots.main([*curve_args, "--out", str(out)]) != 0:
        print("reproduce: the learning curves could not be drawn (see above); the table is written", file=sys.stderr)
    plot_table(table, out)
    print(markdown(table, meta))
    print(f"wrote {out}/reproduce.md, reproduce.json, reproduce.png, learning_curves.png")
