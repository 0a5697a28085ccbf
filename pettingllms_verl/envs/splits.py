"""Train/val/test task sets for generated puzzles: disjoint by construction and by check.

Each split draws from its own seed range (``SEED_START``): train from 0, 1, 2, ..., val (for
choosing checkpoints) from 500,000,000 on, test (the development test split: reported, and read
when a task or a training length was chosen) from 1,000,000,000 on, confirm (the development
confirmation split: frozen before a final run, never read to choose anything, since read by several
experiments) from 1,500,000,000 on, final (a confirmation split frozen when a primary claim is
declared, read for that claim alone) from 1,750,000,000 on. Each split keeps only the first occurrence of a task (by ``key``), and a task
whose key an earlier split already holds is skipped, so the splits share no puzzle even when two
seeds generate the same one.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Hashable

from pettingllms_verl.data.rows import task_row
from pettingllms_verl.envs import make

SEED_START = {"train": 0, "val": 500_000_000, "test": 1_000_000_000, "confirm": 1_500_000_000, "final": 1_750_000_000}  # first seed of each split


def task_key(task: dict) -> str:
    return json.dumps(task, sort_keys=True)


def generate_splits(
    env_name: str,
    counts: dict[str, int],
    config: dict | None = None,
    key: Callable[[dict], Hashable] = task_key,
    log: Callable[[str], None] = print,
) -> dict[str, list[dict]]:
    """Parquet rows per split (``{"train": n, "val": v, "test": m, "confirm": c, "final": f}``, any subset); raises
    if the splits could not be kept disjoint."""
    unknown = set(counts) - set(SEED_START)
    if unknown:
        raise ValueError(f"{env_name}: unknown splits {sorted(unknown)}; use {list(SEED_START)}")
    env = make(env_name, **(config or {}))
    seen: dict[Hashable, str] = {}
    rows: dict[str, list[dict]] = {}
    for split, count in counts.items():
        seed = SEED_START[split]
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
    for a, b in itertools.combinations(by_split, 2):
        if by_split[a] & by_split[b]:
            raise RuntimeError(f"{env_name}: {a} and {b} share tasks")
    return rows
