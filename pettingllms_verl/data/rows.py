"""Dataset rows <-> environment tasks.

One parquet row is one problem. verl's ``RLHFDataset`` needs a ``prompt`` column; the episode
agent loop ignores it and rebuilds every prompt from the environment, so it only carries a short
human-readable summary. The task itself travels as a JSON string (one schema for every env).
"""

from __future__ import annotations

import json
import os
from typing import Any
from collections.abc import Iterable

EPISODE_AGENT = "pettingllms_episode"


def task_row(env: str, seed: int, task: dict, split: str, index: int, agent_name: str = EPISODE_AGENT) -> dict:
    """A parquet row for one problem of ``env``."""
    return {
        "data_source": env,
        "agent_name": agent_name,
        "prompt": [{"role": "user", "content": f"{env} problem {split}-{index}"}],
        "extra_info": {
            "env": env,
            "seed": int(seed),
            "split": split,
            "index": int(index),
            "task_json": json.dumps(task, sort_keys=True),
        },
    }


def row_task(extra_info: dict[str, Any]) -> tuple[str, int, dict]:
    """Inverse of ``task_row``: (env name, seed, task) from a row's ``extra_info``."""
    return extra_info["env"], int(extra_info["seed"]), json.loads(extra_info["task_json"])


def write_parquet(rows: Iterable[dict], path: str) -> int:
    """Write rows to ``path`` (directories created); returns the number written."""
    import pandas as pd

    rows = list(rows)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return len(rows)
