"""The CPU quickstart task: "answer with digits only", scored by the share of digits in the reply.

A random tiny model gets rewards spread over [0, 1] (verl's rule-based math reward would give it
all zeros: zero advantages, zero gradient), so GRPO has a signal to climb from step one.
"""

from __future__ import annotations

import random

DATA_SOURCE = "quickstart_digits"


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """verl ``custom_reward_function``: fraction of non-space characters of the reply that are digits."""
    chars = [c for c in solution_str if not c.isspace()]
    if not chars:
        return 0.0
    return sum(c.isdigit() for c in chars) / len(chars)


def rows(count: int, seed: int, split: str) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for index in range(count):
        numbers = " ".join(str(rng.randint(0, 99)) for _ in range(rng.randint(2, 5)))
        out.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"Continue the sequence with digits only: {numbers}"}],
                "reward_model": {"style": "rule", "ground_truth": ""},
                "extra_info": {"split": split, "index": index},
            }
        )
    return out
