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


def summarize(records: list[dict]) -> dict:
    """Success, turns and end causes of a set of episodes, and per role (over the replies played,
    placeholders excluded): mean reward of its chosen replies and its parse-failure rate."""
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
        header = ["method", "run", "weights", "episodes", "success", "faults"] + [f"{role} reward" for role in roles] + [f"{role} parse fail" for role in roles]
        out += [f"## {env}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in env_rows:
            method = row["method"] + (" swapped" if row["swapped"] else "")
            weights = f"step {row['step']}" if row["step"] is not None else "base"
            faults = row.get("faults")  # absent: a table written before faults were counted
            marked = " (faults)" if faults else ""
            counts = "-" if faults is None else ", ".join(f"{cause} {n}" for cause, n in sorted(faults.items())) or "none"
            cells = [method, row["label"], weights, str(row["episodes"]), f"{row['success']:.3f} ± {row['success_se']:.3f}{marked}", counts]
            cells += [f"{row['roles'][r]['reward_mean']:.3f}" if r in row["roles"] else "-" for r in roles]
            cells += [f"{row['roles'][r]['parse_failure_rate']:.2f}" if r in row["roles"] else "-" for r in roles]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    out.append("success: share of episodes solved (± its binomial standard error), marked (faults) where some episodes "
               "ended by a fault, each counted as unsolved; faults: those episodes by cause (engine_error, env_error); "
               "reward: mean role reward of the replies played; parse fail: share of a role's replies that could not be read.")
    return "\n".join(out) + "\n"
