"""Train/test task sets for generated puzzles: disjoint by construction and by check.

Train tasks come from seeds 0, 1, 2, ...; test tasks from seeds ``TEST_SEED_START`` + 0, 1, ....
Each split keeps only the first occurrence of a task (by ``key``), and a test task whose key
occurs in train is skipped, so the splits share no puzzle even when two seeds generate the same one.
"""

from __future__ import annotations

import json
from typing import Callable, Hashable

from pettingllms_verl.data.rows import task_row
from pettingllms_verl.envs import make

TEST_SEED_START = 1_000_000_000


def task_key(task: dict) -> str:
    return json.dumps(task, sort_keys=True)


def generate_splits(
    env_name: str,
    counts: dict[str, int],
    config: dict | None = None,
    key: Callable[[dict], Hashable] = task_key,
    log: Callable[[str], None] = print,
) -> dict[str, list[dict]]:
    """Parquet rows per split (``{"train": n, "test": m}``); raises if the splits could not be kept disjoint."""
    env = make(env_name, **(config or {}))
    seen: dict[Hashable, str] = {}
    rows: dict[str, list[dict]] = {}
    for split, count in counts.items():
        seed = TEST_SEED_START if split == "test" else 0
        rows[split] = []
        tries = 0
        while len(rows[split]) < count:
            tries += 1
            if tries > 20 * count + 1000:
                raise RuntimeError(f"{env_name}: only {len(rows[split])} distinct {split} tasks after {tries} seeds")
            env.reset(seed)
            task_id = key(env.task)
            if task_id not in seen:
                seen[task_id] = split
                rows[split].append(task_row(env_name, seed, env.task, split, len(rows[split])))
                if len(rows[split]) % max(1, count // 10) == 0:
                    log(f"{env_name} {split}: {len(rows[split])}/{count}")
            seed += 1
    by_split = {split: {key(json.loads(row["extra_info"]["task_json"])) for row in split_rows} for split, split_rows in rows.items()}
    if "train" in by_split and "test" in by_split and by_split["train"] & by_split["test"]:
        raise RuntimeError(f"{env_name}: train and test share tasks")
    return rows
