"""Learning curves and the SA-vs-MAS chart as PNG: ``python -m pettingllms_verl.eval.plots``.

Curves come from verl's file-logger JSONL (``trainer.logger=[console,file]``; one line per step):
team success in training and validation (steps where a fault ended episodes marked with a red x),
each role's reward, the parse-failure rate and the AT-GRPO group statistics. Several logs of one LABEL (seeds) are drawn as their mean with the
min-max band. The bar chart comes from the evaluation's ``results.json`` (``pettingllms-eval``):
success per environment and method, with its standard error.

  python -m pettingllms_verl.eval.plots --curves sa=logs/sa_s0.jsonl,logs/sa_s1.jsonl \\
      --curves mas=logs/mas_s0.jsonl --results eval/before/results.json --results eval/after/results.json --out plots
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict

import numpy as np

from pettingllms_verl.eval.results import LogError, read_jsonl

# panel title -> metric keys (a regular expression each; every match is one line)
PANELS = {
    "team success": [r"mas/success", r"val-core/[^/]+/reward/mean@\d+"],
    "role reward (mean)": [r"mas/[^/]+/reward_mean"],
    "parse failures (share of replies)": [r"mas/parse_failure_rate"],
    # advantages: AT-GRPO's groups, or PPO's critic (algorithm.adv_estimator=gae)
    "AT-GRPO groups, critic": [r"at_grpo/zero_variance_frac", r"at_grpo/singleton_frac", r"critic/vf_loss", r"critic/vf_explained_var"],
}
LEGEND = {"mas/success": "train success", "mas/parse_failure_rate": "parse failures"}
# share of a step's episodes ended by a fault: the success panel marks the steps that had any (a step
# over pettingllms.trainer.fault_budget never completes: the run stops on it)
FAULT_SHARE = "mas/fault_share"


def read_curves(paths: list[str]) -> dict[str, np.ndarray]:
    """metric -> array (seeds x steps) over the steps every log has; NaN where a log lacks it."""
    logs = []
    for path in paths:
        records = read_jsonl(path, required=("step", "data"))
        logs.append({int(r["step"]): r["data"] for r in records})
    steps = sorted(set.intersection(*(set(log) for log in logs)))
    if not steps:
        raise LogError(f"{', '.join(paths)}: no step common to these logs")
    keys = sorted({key for log in logs for step in steps for key in log[step]})
    curves = {"_steps": np.array(steps, dtype=float)}
    for key in keys:
        values = [[log[step].get(key, np.nan) for step in steps] for log in logs]
        try:
            curves[key] = np.array(values, dtype=float)
        except (TypeError, ValueError):
            continue  # a non-numeric value (verl logs a few strings): not a curve
    return curves


def plot_curves(runs: dict[str, list[str]], out: str) -> tuple[str, dict[str, list[str]]]:
    """``learning_curves.png``; returns its path and, per panel, the lines drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {label: read_curves(paths) for label, paths in runs.items()}
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), squeeze=False)
    legends: dict[str, list[str]] = {}
    for ax, (title, patterns) in zip(axes.flat, PANELS.items()):
        drawn = legends.setdefault(title, [])
        for label, curves in data.items():
            steps = curves["_steps"]
            for key in sorted(k for k in curves if any(re.fullmatch(p, k) for p in patterns)):
                # only the steps that logged the metric: validation runs every N steps, and a line
                # through the steps between would break at each gap
                logged = ~np.all(np.isnan(curves[key]), axis=0)
                if not logged.any():
                    continue
                values, at = curves[key][:, logged], steps[logged]
                mean = np.nanmean(values, axis=0)
                name = LEGEND.get(key, "val success" if key.startswith("val-core/") else key.split("/")[1] if key.startswith("mas/") else key.split("/")[-1])
                drawn.append(f"{label}: {name}" + (f" ({len(values)} seeds)" if len(values) > 1 else ""))
                line, = ax.plot(at, mean, marker="o", markersize=3, label=drawn[-1])
                if len(values) > 1:
                    ax.fill_between(at, np.nanmin(values, axis=0), np.nanmax(values, axis=0), color=line.get_color(), alpha=0.2)
            if title == "team success" and FAULT_SHARE in curves:
                # a step's success counts its faulted episodes as unsolved: mark where any seed had some
                faulted = np.nanmax(np.nan_to_num(curves[FAULT_SHARE], nan=0.0), axis=0) > 0
                if faulted.any():
                    drawn.append(f"{label}: episodes ended by a fault")
                    ax.scatter(steps[faulted], np.zeros(int(faulted.sum())), marker="x", color="red", zorder=3, label=drawn[-1])
        ax.set_title(title)
        ax.set_xlabel("training step")
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not in these logs", ha="center", va="center", transform=ax.transAxes, color="grey")
    fig.tight_layout()
    path = os.path.join(out, "learning_curves.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, legends


def plot_results(results_files: list[str], out: str) -> str:
    """Success per environment, one bar per method (and run and weights), with its standard error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for path in results_files:
        try:
            rows += json.load(open(path))["rows"]
        except (OSError, ValueError, KeyError) as error:
            raise LogError(f"{path}: not an evaluation's results.json ({error}); run pettingllms-eval first") from None
    if not rows:
        raise LogError(f"{', '.join(results_files)}: no rows")
    by_env: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_env[row["env"]].append(row)
    bars = sorted({_bar_name(row) for row in rows})
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(by_env) * len(bars) ** 0.5 + 3), 4.5))
    width = 0.8 / len(bars)
    envs = sorted(by_env)
    for i, name in enumerate(bars):
        found = [next((r for r in by_env[env] if _bar_name(r) == name), None) for env in envs]
        x = np.arange(len(envs)) + (i - (len(bars) - 1) / 2) * width
        ax.bar(x, [r["success"] if r else 0 for r in found], width, yerr=[r["success_se"] if r else 0 for r in found], capsize=3, label=name)
    ax.set_xticks(np.arange(len(envs)), envs)
    ax.set_ylabel("success on the test split")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.set_title("single agent vs team")
    fig.tight_layout()
    path = os.path.join(out, "success_by_method.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bar_name(row: dict) -> str:
    weights = f"step {row['step']}" if row.get("step") is not None else "base"
    return f"{row['method']}{' swapped' if row.get('swapped') else ''} [{row['label']}, {weights}]"


def parse_curves(specs: list[str]) -> dict[str, list[str]]:
    """``LABEL=PATH[,PATH...]`` (or a bare PATH: its file name is the label) -> label -> paths."""
    runs: dict[str, list[str]] = defaultdict(list)
    for spec in specs:
        label, sep, paths = spec.partition("=")
        if not sep:
            label, paths = os.path.splitext(os.path.basename(spec))[0], spec
        for path in paths.split(","):
            if not os.path.isfile(path):
                raise LogError(f"--curves {spec}: no file {path} (verl's file logger writes <VERL_FILE_LOGGER_ROOT>/<project>/<experiment>.jsonl)")
            runs[label].append(path)
    return dict(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--curves", action="append", default=[], metavar="LABEL=LOG[,LOG...]", help="verl file-logger JSONL of a run (several: seeds); repeat "
                                                                                                    "per run")
    parser.add_argument("--results", action="append", default=[], help="an evaluation's results.json (repeat: e.g. before and after training): the SA-vs-MAS "
                                                                       "bar chart")
    parser.add_argument("--out", default="plots", help="output folder (default ./plots)")
    args = parser.parse_args(argv)
    if not args.curves and not args.results:
        parser.error("give --curves and/or --results")
    os.makedirs(args.out, exist_ok=True)
    try:
        written = []
        if args.curves:
            written.append(plot_curves(parse_curves(args.curves), args.out)[0])
        if args.results:
            written.append(plot_results(args.results, args.out))
    except LogError as error:
        print(f"plots: {error}", file=sys.stderr)
        return 2
    print("wrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
