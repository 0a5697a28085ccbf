"""Episode logs (``pettingllms.paths.episode_log_dir``, one JSON line per episode) into the evaluation's
tables: success per environment and method with per-role reward and parse-failure rate, one
game result per episode, a summary per run. Pure functions over the records; reading is defensive
(a log is written by a process that may have been killed mid-line)."""

from __future__ import annotations

import glob
import json
import math
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np

from pettingllms_verl.episodes.tags import ERRORS

REQUIRED = ("env", "seed", "success", "samples")  # what every episode record has


class LogError(ValueError):
    """An episode log that cannot be read; the message names the file (and line)."""


def read_jsonl(path: str, required: tuple[str, ...] = REQUIRED) -> list[dict]:
    """The records of one JSONL log. A last line cut short (its writer was killed) is skipped with a
    warning; an empty file or a broken line elsewhere is a ``LogError`` naming the file and line."""
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as error:
        raise LogError(f"{path}: cannot read it ({error.strerror})") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):
                print(f"warning: {path}:{number}: last line cut short (a killed writer?); skipped", file=sys.stderr)
                continue
            raise LogError(f"{path}:{number}: not a JSON line; the log is damaged (regenerate it)") from None
        missing = [key for key in required if key not in record] if isinstance(record, dict) else list(required)
        if missing:
            raise LogError(f"{path}:{number}: a record without {missing}; is this an episode log (pettingllms.paths.episode_log_dir)?")
        records.append(record)
    if not records:
        raise LogError(f"{path}: no records (empty log)")
    return records


def read_episode_dir(directory: str, validate_only: bool = True) -> list[dict]:
    """Every episode of an ``episode_log_dir`` (all its processes' files), validation episodes only by default."""
    files = sorted(glob.glob(os.path.join(directory, "episodes-*.jsonl")))
    if not files:
        raise LogError(f"{directory}: no episodes-*.jsonl files (did the run reach its episodes?)")
    records = [record for path in files for record in read_jsonl(path)]
    return [r for r in records if r.get("validate")] if validate_only else records


def binomial_se(p: float, n: int) -> float:
    """Standard error of a success rate measured on ``n`` episodes."""
    return math.sqrt(p * (1 - p) / n) if n else 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` episodes of one problem, ``c`` of them solved
    (Chen et al. 2021): the chance that k episodes drawn from the n without replacement hold a solved
    one, 1 - C(n - c, k) / C(n, k). k = 1 gives c / n."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@{k} from {c} solved of {n} episodes: need 0 < k <= n and 0 <= c <= n")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def problem_outcomes(records: list[dict]) -> dict[tuple[str, int], list[bool]]:
    """(environment, seed) -> the successes of that problem's episodes (the n samples of one pass)."""
    outcomes: dict[tuple[str, int], list[bool]] = defaultdict(list)
    for record in records:
        outcomes[(str(record["env"]), int(record["seed"]))].append(bool(record["success"]))
    return dict(outcomes)


def sampled(records: list[dict], ks: Sequence[int]) -> dict:
    """What n episodes per problem say: ``samples`` (n: the most any problem has), ``avg`` (avg@n: the
    mean over problems of each one's solved share, the estimate of mean@1 from n samples; ``avg_se``
    its standard error over problems, as a problem's n episodes are not independent) and per k,
    pass@k averaged over problems with its standard error over problems. A problem with fewer than k
    episodes (one lost to a killed run) cannot estimate pass@k: ``short`` counts them, left out."""
    outcomes = problem_outcomes(records)
    counts = [len(wins) for wins in outcomes.values()]
    shares = [float(np.mean(wins)) for wins in outcomes.values()]
    result = {"samples": max(counts, default=0), "problems": len(outcomes), "avg": float(np.mean(shares)) if shares else 0.0,
              "avg_se": float(np.std(shares, ddof=1) / math.sqrt(len(shares))) if len(shares) > 1 else 0.0, "pass": {}}
    for k in ks:
        values = [pass_at_k(len(wins), sum(wins), k) for wins in outcomes.values() if len(wins) >= k]
        se = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
        result["pass"][str(k)] = {"value": float(np.mean(values)) if values else None, "se": se, "problems": len(values),
                                  "short": len(outcomes) - len(values)}
    return result


def summarize(records: list[dict], ks: Sequence[int] = ()) -> dict:
    """Success, turns and end causes of a set of episodes, and per role (over the replies played,
    placeholders excluded): mean reward of its chosen replies and its parse-failure rate. With ``ks``
    (several episodes per problem): ``sampled``'s avg@n and pass@k under ``sampled``."""
    n = len(records)
    success = sum(bool(r["success"]) for r in records) / n if n else 0.0
    roles: dict[str, dict[str, list]] = defaultdict(lambda: {"reward": [], "parse_fail": []})
    for record in records:
        for sample in record["samples"]:
            if sample.get("placeholder") or not sample.get("chosen", True):
                continue
            roles[sample["role"]]["reward"].append(float(sample["local_reward"]))
            roles[sample["role"]]["parse_fail"].append(not sample["parse_ok"])
    return {
        "episodes": n,
        "success": success,
        "success_se": binomial_se(success, n),
        "turns_mean": sum(r.get("turns", 0) for r in records) / n if n else 0.0,
        "end_causes": dict(Counter(str(r.get("end_cause")) for r in records if r.get("end_cause"))),
        "faults": dict(Counter(r["end_cause"] for r in records if r.get("end_cause") in ERRORS)),
        "roles": {
            role: {
                "replies": len(values["reward"]),
                "reward_mean": sum(values["reward"]) / len(values["reward"]),
                "parse_failure_rate": sum(values["parse_fail"]) / len(values["parse_fail"]),
            }
            for role, values in sorted(roles.items())
        },
        **({"sampled": sampled(records, ks)} if ks else {}),
    }


def game_result(record: dict) -> dict:
    """One line of the game-results log: who played, how it ended, the final state's score."""
    last = record["samples"][-1] if record["samples"] else {}
    state = last.get("state") or record.get("start") or {}
    result = {
        "env": record["env"], "seed": record["seed"], "swapped": record.get("swapped", False),
        "policies": record.get("policies"), "success": bool(record["success"]), "end_cause": record.get("end_cause"),
        "turns": record.get("turns"), "final_team_reward": record.get("final_global_reward"),
    }
    for key in ("outcome", "score"):  # a game's own result (Tic-Tac-Toe's winner, Hanabi's score), when it has one
        if key in state:
            result[key] = state[key]
    if isinstance(last.get("info"), dict) and "result" in last["info"]:
        result["result"] = last["info"]["result"]
    return result


def table_rows(runs: list[dict]) -> list[dict]:
    """Flat rows (one per run and pass) of the success table, grouped by environment."""
    return sorted(runs, key=lambda r: (r["env"], r["method"], r["label"], r["swapped"]))


def markdown(rows: list[dict], split: str) -> str:
    """The success table: per environment, one line per run (and its swapped pass)."""
    out = [f"# Evaluation on the {split} split", ""]
    by_env: dict[str, list[dict]] = defaultdict(list)
    for row in table_rows(rows):
        by_env[row["env"]].append(row)
    for env, env_rows in by_env.items():
        roles = sorted({role for row in env_rows for role in row["roles"]})
        ks = sorted({int(k) for row in env_rows for k in (row.get("sampled") or {}).get("pass", {})})
        header = (["method", "run", "weights", "episodes", "success"] + [f"pass@{k}" for k in ks] + ["faults"]
                  + [f"{role} reward" for role in roles] + [f"{role} parse fail" for role in roles])
        out += [f"## {env}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in env_rows:
            method = row["method"] + (" swapped" if row["swapped"] else "")
            weights = f"step {row['step']}" if row["step"] is not None else "base"
            faults = row.get("faults")  # absent: a table written before faults were counted
            marked = " (faults)" if faults else ""
            counts = "-" if faults is None else ", ".join(f"{cause} {n}" for cause, n in sorted(faults.items())) or "none"
            sampled = row.get("sampled")
            episodes = f"{row['episodes']} ({sampled['problems']} × {sampled['samples']})" if sampled else str(row["episodes"])
            success = f"{sampled['avg']:.3f} ± {sampled['avg_se']:.3f}" if sampled else f"{row['success']:.3f} ± {row['success_se']:.3f}"
            cells = [method, row["label"], weights, episodes, success + marked]
            cells += [pass_cell((sampled or {}).get("pass", {}).get(str(k))) for k in ks]
            cells.append(counts)
            cells += [f"{row['roles'][r]['reward_mean']:.3f}" if r in row["roles"] else "-" for r in roles]
            cells += [f"{row['roles'][r]['parse_failure_rate']:.2f}" if r in row["roles"] else "-" for r in roles]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    out.append("success: share of episodes solved (± its binomial standard error), marked (faults) where some episodes "
               "ended by a fault, each counted as unsolved; faults: those episodes by cause (engine_error, env_error); "
               "reward: mean role reward of the replies played; parse fail: share of a role's replies that could not be read.")
    if any(row.get("sampled") for row in rows):
        out.append("\nWith n episodes per problem (episodes: problems × n), success is avg@n: the mean over problems of each one's solved share, the "
                   "estimate of one episode's success (mean@1) from n samples, ± its standard error over problems; pass@k: "
                   "the unbiased estimate from n samples (Chen et al. 2021) that one of k episodes solves a problem, averaged "
                   "over problems, ± its standard error over problems.")
    return "\n".join(out) + "\n"


def pass_cell(estimate: dict | None) -> str:
    if not estimate or estimate["value"] is None:
        return "-"
    short = f" ({estimate['short']} problems short)" if estimate["short"] else ""
    return f"{estimate['value']:.3f} ± {estimate['se']:.3f}{short}"
