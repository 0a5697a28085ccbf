"""Word relay: the describer's clue must carry the secret word to the guesser without saying it.

Task: ``{"word": str, "choices": [str, ...]}``, the word among the choices.
Roles. MAS, one turn: ``describer`` then ``guesser``; SA: the guesser alone (no clue).
- describer: local reward 0, or ``LEAK_PENALTY`` when the clue contains the word (the clue is
  then withheld from the guesser).
- guesser: 1 for the right word, 0 for a wrong one, ``PARSE_PENALTY`` when it names no choice.
Team (global) reward and success: the guess is right.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from pettingllms_verl.envs import Env, StepResult, Workflow
from pettingllms_verl.envs.base import PARSE_PENALTY, ignored, workflow_for

from relay_env import prompts

WORDS = ("apple", "river", "cloud", "tiger", "piano", "candle", "garden", "rocket")
CHOICES = 4
LEAK_PENALTY = -1.0


def generate_task(seed: int) -> dict:
    rng = random.Random(seed)
    choices = rng.sample(WORDS, CHOICES)
    return {"word": rng.choice(choices), "choices": choices}


class RelayEnv(Env):
    name: ClassVar[str] = "relay"
    roles: ClassVar[tuple[str, ...]] = ("describer", "guesser")
    options = {"max_turns": "turns per episode (one is enough: the guess ends it)"}
    # clone: Env's shallow copy (every per-episode field is an immutable str/bool/tuple/None)

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.max_turns = int(config.get("max_turns", 1))

    def reset(self, seed: int, task: dict | None = None) -> None:
        task = task or generate_task(seed)
        if task.get("word") not in task.get("choices", ()):
            raise ValueError(f"relay task needs its 'word' among its 'choices', got {task}")
        self.word, self.choices = task["word"], tuple(task["choices"])
        self.clue: str | None = None
        self.guess: str | None = None
        self.done = self.success = False

    @property
    def task(self) -> dict:
        return {"word": self.word, "choices": list(self.choices)}

    @property
    def global_reward(self) -> float:
        return 1.0 if self.success else 0.0

    def workflow(self, mode: str) -> Workflow:
        return workflow_for(mode, mas=("describer", "guesser"), sa=("guesser",), max_turns=self.max_turns)

    def observation(self, role: str):
        if role == "describer":
            return prompts.describer_messages(self.word, list(self.choices))
        if role == "guesser":
            return prompts.guesser_messages(self.clue, list(self.choices))
        raise self.unknown_role(role)

    def step(self, role: str, text: str) -> StepResult:
        self.check_role(role)
        if self.done:
            return ignored("episode is done")
        if role == "describer":
            leaked = self.word in text.lower()
            self.clue = None if leaked else text.strip()
            return StepResult(LEAK_PENALTY if leaked else 0.0, True, {"leaked": leaked})
        self.guess = prompts.parse_guess(text, list(self.choices))
        self.success = self.guess == self.word
        self.done = True
        if self.guess is None:
            return StepResult(PARSE_PENALTY, False, {})
        return StepResult(1.0 if self.success else 0.0, True, {"guess": self.guess})

    def snapshot(self) -> dict:
        return {"word": self.word, "clue": self.clue, "guess": self.guess}
