"""When faults stop a run instead of costing their episodes.

A fault ends its episode (``episode.ERRORS``), and while faults are rare that is right: the step
trains on the rest. When most episodes fail for one cause, a success rate measures the failure, not
the model, so the trainer tallies each training step's episodes, and each validation pass's
(an evaluation is one), and stops the run with ``RunStopped`` when

- any episode met a dead engine (``engine_dead``): every later request would fail the same way;
- the share of episodes ended by a fault exceeds ``pettingllms.trainer.fault_budget``.

The message gives the counts per cause and the first traceback of each. A stop before the update
leaves the last checkpoint as it was: ``trainer.resume_mode=auto`` continues from it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pettingllms_verl.episodes.tags import ERRORS

# The first words of a stop's message: pettingllms-eval quotes the log from the line holding them.
STOPPED = "pettingllms-verl stopped the run:"
BUDGET_KEY = "pettingllms.trainer.fault_budget"
TRACEBACK_CHARS = 4000  # of each episode's error kept in its row's tag: the end of it, where the cause is


class RunStopped(RuntimeError):
    """The run stopped on its faults; the message starts with ``STOPPED``."""


@dataclass
class FaultTally:
    """End causes of a set of episodes (one training step, or one validation pass)."""

    episodes: int = 0
    faults: Counter = field(default_factory=Counter)  # fault cause -> episodes it ended
    first_error: dict[str, str] = field(default_factory=dict)  # fault cause -> its first episode's traceback

    def add(self, end_cause: str | None, error: str | None = None) -> None:
        self.episodes += 1
        if end_cause in ERRORS:
            self.faults[end_cause] += 1
            if error:
                self.first_error.setdefault(end_cause, error)

    def add_tags(self, tags: list[dict]) -> None:
        """The episodes of a batch of rows: each episode's last row carries its end (``mas_episode_end``)."""
        for tag in tags:
            if isinstance(tag, dict) and tag.get("mas_episode_end"):
                self.add(tag.get("mas_end_cause"), tag.get("mas_error"))

    @property
    def share(self) -> float:
        return sum(self.faults.values()) / self.episodes if self.episodes else 0.0

    def check(self, budget: float, where: str) -> None:
        """Raise ``RunStopped`` if a dead engine was met or the fault share is over ``budget``."""
        counts = ", ".join(f"{cause} {n}" for cause, n in sorted(self.faults.items()))
        if self.faults["engine_dead"]:
            reason = f"a rollout server is dead ({self.faults['engine_dead']} of {self.episodes} episodes met it; {counts})"
        elif self.share > budget:
            reason = (f"{sum(self.faults.values())} of {self.episodes} episodes ended by a fault ({counts}), "
                      f"a share of {self.share:.2f}, over {BUDGET_KEY}={budget}")
        else:
            return
        tracebacks = "".join(f"\n--- first {cause} ---\n{text}" for cause, text in sorted(self.first_error.items()))
        raise RunStopped(f"{STOPPED} {where}: {reason}; no success rate is reported for it.{tracebacks}")

    def metrics(self, prefix: str = "mas/fault_share") -> dict[str, float]:
        """The share of episodes ended by a fault, in all and per cause."""
        out = {prefix: self.share}
        out.update({f"{prefix}/{cause}": self.faults[cause] / self.episodes if self.episodes else 0.0 for cause in ERRORS})
        return out
