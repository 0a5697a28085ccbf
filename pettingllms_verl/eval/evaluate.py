"""Evaluate teams: ``python -m pettingllms_verl.eval`` (console script ``pettingllms-eval``).

Each RUN is ``[LABEL=]RECIPE[@CHECKPOINT]``: the recipe fixes the environment, the workflow (SA or
MAS) and the policies; CHECKPOINT is a ``global_step_N`` folder or a run's checkpoint folder (its
step with the best validation success is taken: chosen on the val split, never on the reported
one); without it the recipe's base models play. Episodes run through ``main_ppo`` in validation
mode: the training rollout code, each role served by its policy, the recipe's engine (``hf`` on
CPU, vLLM on GPU), validation sampling (``val_kwargs``). A recipe with two policies is also
played swapped (each policy serves the other's roles).

Writes to --out: ``results.md`` / ``results.json`` (success per environment and method, per-role
reward and parse-failure rate), ``episodes.jsonl`` (every prompt, reply, parsed action, reward,
state and tree branch), ``games.jsonl`` (one result per episode), ``summary.md`` (one entry per run:
its models, checkpoint, success, time) and ``runs/<LABEL>/`` (main_ppo's log and metrics).

Examples (from the repository, where the recipes read ./artifacts):
  # the real model untrained, single agent vs team, on two environments
  # (make real-model data-plan_path_6x6 data-sokoban_6x6 builds what they read)
  pettingllms-eval --envs plan_path,sokoban --methods sa,mas --target cpu \\
      --set actor_rollout_ref.model.path=$PWD/artifacts/smollm2_135m --out eval/untrained
  # a trained per-role run (make run RECIPE=plan_path_mas_full_cpu), as trained and swapped: its last
  # step, as the CPU recipes do not validate; a run that validated may leave the default, its best step on val
  pettingllms-eval plan_path_mas_full_cpu@artifacts/checkpoints/plan_path_mas_full_cpu --select latest --out eval/l2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pettingllms_verl import envs
from pettingllms_verl.config import SECTION, load
from pettingllms_verl.eval import results, runs
from pettingllms_verl.eval.runs import EvalError, Run
from pettingllms_verl.rollout import faults

METHOD_RECIPES = {"sa": "sa_grpo", "mas": "mas_atgrpo"}  # --methods -> recipe mode (<env>_<mode>_<target>)
LABEL = re.compile(r"[A-Za-z0-9._-]+")  # a run's label: its folder's name under --out/runs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="pettingllms-eval", description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("runs", nargs="*", metavar="RUN", help="[LABEL=]RECIPE[@CHECKPOINT]")
    parser.add_argument("--envs", help="comma-separated environments (or 'all'): adds a run per --methods entry with the recipe "
                                       "<env>_<sa_grpo|mas_atgrpo>_<target>")
    parser.add_argument("--methods", default="sa,mas", help="with --envs: sa, mas or both (default sa,mas)")
    parser.add_argument("--target", default="cpu", help="with --envs: the recipes' target suffix (cpu, qwen3_1p7b, qwen3_8b; another model on CPU: cpu with "
                                                        "--set actor_rollout_ref.model.path=DIR)")
    parser.add_argument("--split", default="test", help="the data split played, beside the recipe's val file (default test)")
    parser.add_argument("--episodes", type=int, default=None, help="the first N problems of the split, the same ones for every run (default all)")
    parser.add_argument("--samples", type=int, default=1, metavar="N",
                        help="episodes per problem, sampled independently at the evaluation temperature (default 1): reports avg@N and pass@k")
    parser.add_argument("--pass-k", default=None, metavar="K[,K...]",
                        help="the k of pass@k, each at most --samples (default with --samples N > 1: 1 and N)")
    parser.add_argument("--select", choices=("best-val", "latest"), default="best-val", help="which step of a run's checkpoint folder")
    parser.add_argument("--swap", help="two policies A,B to also play swapped, or none (default: the two policies of a two-policy recipe)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="a Hydra override for every run (repeat)")
    parser.add_argument("--out", default="eval", help="output folder (default ./eval)")
    parser.add_argument("--recipes", default=str(runs.RECIPES_DIR), help="recipes folder (default: the package's, pettingllms_verl/recipes)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs played at once, each its own main_ppo (default 1; on CPU a run keeps about one core busy, so 2 suits 2 cores)")
    args = parser.parse_args(argv)
    if not args.runs and not args.envs:
        parser.error("give at least one RUN or --envs")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: need at least 1")
    if args.episodes is not None and args.episodes < 1:
        parser.error(f"--episodes {args.episodes}: need at least 1")
    if args.samples < 1:
        parser.error(f"--samples {args.samples}: need at least 1 episode per problem")
    args.pass_k = pass_ks(parser, args.pass_k, args.samples)
    return args


def pass_ks(parser: argparse.ArgumentParser, given: str | None, samples: int) -> list[int]:
    """The k of pass@k asked for: each between 1 and the episodes per problem (``--samples``)."""
    if given is None:
        return sorted({1, samples}) if samples > 1 else []
    try:
        ks = sorted({int(k) for k in given.split(",") if k.strip()})
    except ValueError:
        parser.error(f"--pass-k {given}: give whole numbers, e.g. --pass-k 1,4")
    if not ks or ks[0] < 1 or ks[-1] > samples:
        parser.error(f"--pass-k {given}: each k must be between 1 and --samples ({samples}): pass@k needs at least k episodes "
                     f"per problem; raise --samples to {max(ks or [1])} or lower k")
    return ks


def run_specs(args: argparse.Namespace) -> list[tuple[str, str, str | None]]:
    """(label, recipe, checkpoint) of every run asked for."""
    specs = []
    for spec in args.runs:
        head, _, checkpoint = spec.partition("@")
        label, _, recipe = head.rpartition("=")
        specs.append((label or recipe, recipe, checkpoint or None))
    if args.envs:
        names = envs.available() if args.envs == "all" else [name.strip() for name in args.envs.split(",") if name.strip()]
        unknown = [name for name in names if name not in envs.available()]
        if unknown:
            raise EvalError(f"--envs: unknown environment {unknown[0]!r}; environments: {', '.join(envs.available())}")
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        bad = [m for m in methods if m not in METHOD_RECIPES]
        if bad or not methods:
            raise EvalError(f"--methods {args.methods}: use sa, mas or sa,mas")
        specs += [(f"{env}_{m}", f"{env}_{METHOD_RECIPES[m]}_{args.target}", None) for env in names for m in methods]
    labels = [label for label, _, _ in specs]
    unsafe = next((label for label in labels if not LABEL.fullmatch(label) or set(label) == {"."}), None)
    if unsafe is not None:  # a label names the run's folder under --out/runs, which is cleared before it plays
        raise EvalError(f"run label {unsafe!r}: use letters, digits, '.', '_' and '-' (not '.' or '..' alone): LABEL=RECIPE[@CHECKPOINT]")
    duplicate = next((label for label in labels if labels.count(label) > 1), None)
    if duplicate:
        raise EvalError(f"run label {duplicate!r} given twice; name runs apart with LABEL=RECIPE[@CHECKPOINT]")
    return specs


def build_runs(args: argparse.Namespace) -> list[Run]:
    """Every run, checked before any starts: recipe, models, checkpoint, split."""
    recipes_dir = Path(args.recipes)
    if not recipes_dir.is_dir():
        raise EvalError(f"--recipes {recipes_dir}: no such folder (the default is the recipes shipped in the package: give a folder of recipes)")
    built = []
    overrides = [*runs.sample_overrides(args.samples), *args.overrides]  # a --set still wins
    for label, recipe, checkpoint in run_specs(args):
        cfg = runs.compose(recipe, overrides, recipes_dir)
        load(cfg.get(SECTION))  # a bad pettingllms section names its key here, not after Ray started
        if args.samples > 1:
            runs.check_sampling(cfg, f"--samples {args.samples}: run {label}")
            if int(cfg.actor_rollout_ref.rollout.val_kwargs.n) != args.samples:
                raise EvalError(f"--samples {args.samples} and --set actor_rollout_ref.rollout.val_kwargs.n="
                                f"{cfg.actor_rollout_ref.rollout.val_kwargs.n} disagree: give the episodes per problem once, with --samples")
        for group, model in runs.policy_models(cfg).items():
            runs.check_model(model, f"run {label}, policy {group}")
        step_dir = runs.resolve_checkpoint(checkpoint, args.select) if checkpoint else None
        if step_dir:
            runs.check_checkpoint(step_dir, cfg, recipe)
        data_file = runs.split_file(cfg, args.split)
        swap = None if args.swap == "none" else runs.swap_pair(cfg, args.swap.split(",") if args.swap else None)
        built.append(Run(label, recipe, cfg, runs.data_env(data_file), data_file, step_dir, overrides, swap))
    return built


def expected_episodes(run: Run, episodes: int | None) -> int:
    import pandas as pd

    rows = len(pd.read_parquet(run.data_file, columns=["data_source"]))
    n = int(run.config.actor_rollout_ref.rollout.val_kwargs.get("n", 1))
    return min(rows, episodes or rows) * n * (2 if run.swap else 1)


def count_logged(directory: str) -> int:
    total = 0
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        with open(os.path.join(directory, name), encoding="utf-8", errors="replace") as f:
            total += sum('"validate": true' in line for line in f)
    return total


def say(line: str) -> None:
    """A progress line on stdout. Runs going at once print from several threads: tqdm's lock keeps
    each line whole (``print`` writes the text and its newline apart) and redraws the bars below it."""
    from tqdm import tqdm

    tqdm.write(line)
    sys.stdout.flush()  # in order with the bars (stderr) where both go to one log


def play(run: Run, args: argparse.Namespace, out: Path, bar_position: int = 0) -> float:
    """Run main_ppo in validation mode for ``run``; returns its wall time. Raises EvalError on failure."""
    from tqdm import tqdm

    say(f"[{run.label}] {run.recipe} on {run.data_file}" + (f", checkpoint {run.checkpoint}" if run.checkpoint else ", base models")
        + (f", also swapped {run.swap}" if run.swap else ""))
    run_dir = out / "runs" / run.label
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    command = [sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", str(Path(args.recipes).resolve()), "--config-name", run.recipe,
               *runs.main_ppo_overrides(run, args.episodes, str(run_dir), args.jobs)]
    (run_dir / "command.json").write_text(json.dumps(command, indent=1))
    log_path = run_dir / "main_ppo.log"
    say(f"[{run.label}] main_ppo starting (Ray, workers, models: a minute or more before the first episode); log: {log_path}")
    started = time.perf_counter()
    with open(log_path, "w") as log, tqdm(total=expected_episodes(run, args.episodes), desc=run.label, unit="episode", position=bar_position) as bar:
        env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(run_dir / "metrics.jsonl")}
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        while process.poll() is None:
            time.sleep(2.0)
            done = count_logged(str(run_dir / "episodes"))
            if done > bar.n:
                bar.update(done - bar.n)
        bar.update(count_logged(str(run_dir / "episodes")) - bar.n)
    if process.returncode != 0:
        raise EvalError(f"run {run.label}: main_ppo exited with {process.returncode}; its log: {log_path}\n{why_it_stopped(log_path)}")
    return time.perf_counter() - started


def why_it_stopped(log_path: Path, lines: int = 40) -> str:
    """What a failed main_ppo said: from the first line of a fault stop (``faults.STOPPED``: the
    counts per cause and their first tracebacks) where there is one, else the log's last 15 lines."""
    log = open(log_path, errors="replace").readlines()
    start = next((i for i, line in enumerate(log) if faults.STOPPED in line), None)
    if start is None:
        return "".join(log[-15:])
    return log[start][log[start].index(faults.STOPPED):] + "".join(log[start + 1 : start + lines])


def collect(run: Run, out: Path, wall_s: float, ks: list[int] = ()) -> tuple[list[dict], list[dict]]:
    """The table rows (as trained, and swapped) and the episode records of a finished run; with ``ks``
    (several episodes per problem) its avg@n and pass@k."""
    records = results.read_episode_dir(str(out / "runs" / run.label / "episodes"))
    for record in records:
        record["run"] = run.label
    rows = []
    for swapped in ([False, True] if run.swap else [False]):
        part = [r for r in records if bool(r.get("swapped")) == swapped]
        if not part:
            raise EvalError(f"run {run.label}: no {'swapped ' if swapped else ''}validation episodes in its logs ({out / 'runs' / run.label})")
        times = [(r["started_at"], r["finished_at"]) for r in part if "started_at" in r]
        span = max(t[1] for t in times) - min(t[0] for t in times) if times else 0.0
        rows.append({
            "label": run.label, "recipe": run.recipe, "env": run.env, "method": runs.method_of(run.config), "swapped": swapped,
            "step": run.step, "checkpoint": run.checkpoint, "models": runs.policy_models(run.config), "split": run.data_file,
            "swap": run.swap if swapped else None, "wall_s": wall_s, "episodes_per_s": len(part) / span if span > 0 else None,
            **results.summarize(part, ks),
        })
    return rows, records


def write_outputs(out: Path, rows: list[dict], records: list[dict], split: str) -> None:
    (out / "results.json").write_text(json.dumps({"split": split, "rows": results.table_rows(rows)}, indent=1))
    (out / "results.md").write_text(results.markdown(rows, split))
    with open(out / "episodes.jsonl", "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    with open(out / "games.jsonl", "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps({"run": record["run"], **results.game_result(record)}) + "\n")
    lines = ["# Summary per run", ""]
    for row in rows:
        lines += [
            f"## {row['label']}{' (swapped ' + ' <-> '.join(row['swap']) + ')' if row['swapped'] else ''}",
            f"- recipe `{row['recipe']}`, {row['method']}, environment {row['env']}, split `{row['split']}`",
            f"- weights: {'checkpoint `' + row['checkpoint'] + '`' if row['checkpoint'] else 'base models'}; models: "
            + ", ".join(f"{group} `{path}`" for group, path in row["models"].items()),
            f"- {row['episodes']} episodes, success {row['success']:.3f} ± {row['success_se']:.3f}, {row['turns_mean']:.2f} turns, "
            f"ended early: {row['end_causes'] or 'none'}",
            "- per role: " + "; ".join(f"{role} reward {v['reward_mean']:.3f}, parse fail {v['parse_failure_rate']:.2f} ({v['replies']} replies)"
                                      for role, v in row["roles"].items()),
            f"- run time {row['wall_s']:.0f} s (with start-up)"
            + (f", {row['episodes_per_s']:.3f} episodes/s while playing" if row["episodes_per_s"] else ""),
            "",
        ]
    (out / "summary.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # composing a recipe imports verl, which warns once per optional engine it lacks (megatron, ...)
    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
    try:
        planned = build_runs(args)
    except (EvalError, results.LogError) as error:
        print(f"pettingllms-eval: {error}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def evaluate(index: int, run: Run) -> tuple[list[dict], list[dict]]:
        return collect(run, out, play(run, args, out, bar_position=index % args.jobs), args.pass_k)

    rows, records, failed = [], [], []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each job waits on its own main_ppo process
        futures = [pool.submit(evaluate, index, run) for index, run in enumerate(planned)]
        try:
            for run, future in zip(planned, futures):  # the tables keep the order the runs were given in
                try:
                    run_rows, run_records = future.result()
                except (EvalError, results.LogError) as error:
                    print(f"pettingllms-eval: {error}", file=sys.stderr)
                    failed.append(run.label)
                    continue
                rows += run_rows
                records += run_records
        except BaseException:  # Ctrl-C or an unexpected error: start no further main_ppo
            pool.shutdown(cancel_futures=True)
            raise
    if rows:
        write_outputs(out, rows, records, args.split)
        print(results.markdown(rows, args.split))
        print(f"wrote {out}/results.md, results.json, episodes.jsonl, games.jsonl, summary.md")
    if failed:
        print(f"pettingllms-eval: failed runs: {', '.join(failed)} (see {out}/runs/<label>/main_ppo.log)", file=sys.stderr)
        return 1
    return 0

