"""Math problems solved by a team: a tool agent that computes with Python and a reasoner that
answers (problems of the AIME, OlympiadBench, DeepScaleR kind).

Task: ``{"problem": str, "answer": str}``, the gold final answer in LaTeX or plain text, without
``\\boxed``. Answers are compared with math-verify (``grading``), never by string equality.

Roles. MAS, each turn: ``tool`` then ``reasoner``.
- tool: one ```python block, run in the sandbox with no input; its answer is the last ``\\boxed{}``
  in its output, else the output's last non-empty line. Local reward: 1 when that answer is
  correct, 0 when wrong, ``TOOL_FAILURE_PENALTY`` when the program fails or prints nothing,
  ``PARSE_PENALTY`` without a code block.
- reasoner: sees the problem and, in MAS, the tool's program and output; answers in ``\\boxed{}``.
  Local reward: 1 correct, 0 wrong, ``PARSE_PENALTY`` without a readable ``\\boxed{}``.
Next turn each sees the other's last answer. The MAS episode ends when the reasoner's answer and
the tool's agree (equivalent), or after ``max_turns`` turns. SA is the reasoner alone: the episode
ends at its first readable answer (there is nothing to refine against), or after ``max_turns``.

Team (global) reward and success: the reasoner's latest answer is correct.
Without a task, ``reset(seed)`` takes problem ``seed % N`` of the small fixture shipped with the
package (offline tests and the tiny tokenizer's corpus).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pettingllms_verl.envs.base import (
    DEFAULT_TOOL_LIMITS, PARSE_PENALTY, TOOL_FAILURE_PENALTY, Env, StepResult, Workflow, fixture_task, ignored, sandbox_runs, workflow_for,
)
from pettingllms_verl.envs.math import prompts
from pettingllms_verl.envs.math.grading import MAX_ANSWER_CHARS, equivalent
from pettingllms_verl.envs.text import Messages, extract_code, last_boxed
from pettingllms_verl.sandbox import SandboxLimits, run_python

DEFAULT_MAX_TURNS = 3
FIXTURE = "math_fixture.jsonl"  # the offline problem set shipped with the package (simple, hand-checked answers)


def output_answer(stdout: str) -> str | None:
    """A tool program's answer: the last ``\\boxed{}`` it printed, else its last non-empty line."""
    boxed = last_boxed(stdout, MAX_ANSWER_CHARS)
    if boxed is not None:
        return boxed
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    return lines[-1] if lines and len(lines[-1]) <= MAX_ANSWER_CHARS else None


class MathEnv(Env):
    name: ClassVar[str] = "math"
    roles: ClassVar[tuple[str, ...]] = ("tool", "reasoner")
    runs_model_code: ClassVar[bool] = True
    # clone: Env's shallow copy (every per-episode field is an immutable str/int/bool/None)

    options = {
        "max_turns": "turns per episode (each turn: every role of the workflow acts once)",
        "tool_limits": "sandbox limits of the tool agent's programs (SandboxLimits fields)",
    }

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.max_turns = int(config.get("max_turns", DEFAULT_MAX_TURNS))
        self.tool_limits = SandboxLimits(**{**DEFAULT_TOOL_LIMITS, **config.get("tool_limits", {})})

    def reset(self, seed: int, task: dict | None = None) -> None:
        task = fixture_task(FIXTURE, seed) if task is None else task
        if not isinstance(task.get("problem"), str) or not isinstance(task.get("answer"), str):
            raise ValueError(f"math task needs string 'problem' and 'answer', got keys {sorted(task)}")
        self.problem, self.answer = task["problem"], task["answer"]
        self.done = self.success = self.truncated = False
        self.turn = 0
        self.tool_code: str | None = None
        self.tool_output: str | None = None
        self.tool_answer: str | None = None
        self.reasoner_answer: str | None = None
        self.tool_acted = False  # the tool steps first every MAS turn, never in SA

    @property
    def task(self) -> dict:
        return {"problem": self.problem, "answer": self.answer}

    @property
    def global_reward(self) -> float:
        return 1.0 if self.success else 0.0

    # workflow, observation and step: the Env contract's per-role dispatch, alike in shape across the
    # two-role envs and kept in each so that an env's rules read top to bottom in one file
    def workflow(self, mode: str) -> Workflow:
        return workflow_for(mode, mas=("tool", "reasoner"), sa=("reasoner",), max_turns=self.max_turns)

    def observation(self, role: str) -> Messages:
        if role == "tool":
            return prompts.tool_messages(self.problem, self.tool_code, self.tool_answer, self.reasoner_answer)
        if role == "reasoner":
            return prompts.reasoner_messages(self.problem, self.tool_code, self.tool_output, self.reasoner_answer)
        raise self.unknown_role(role)

    def step(self, role: str, text: str) -> StepResult:
        self.check_role(role)
        if self.done:
            return ignored("episode is done")
        return self._tool_step(text) if role == "tool" else self._reasoner_step(text)

    def _tool_step(self, text: str) -> StepResult:
        self.tool_acted = True
        code = extract_code(text)
        if code is None:
            return StepResult(PARSE_PENALTY, False, {"tool_status": "no_code"})
        run = run_python(code, limits=self.tool_limits)
        self.tool_code, self.tool_output = code, run.transcript()
        self.tool_answer = output_answer(run.stdout) if run.ok else None
        ran = sandbox_runs([run.status])
        if self.tool_answer is None:
            return StepResult(TOOL_FAILURE_PENALTY, True, {"tool_status": run.status if not run.ok else "no_answer", **ran})
        correct = equivalent(self.answer, self.tool_answer)
        return StepResult(1.0 if correct else 0.0, True, {"tool_status": "ok", "correct": correct, **ran})

    def _reasoner_step(self, text: str) -> StepResult:
        answer = last_boxed(text, MAX_ANSWER_CHARS)
        self.turn += 1
        if answer is None:
            result = StepResult(PARSE_PENALTY, False, {})
        else:
            self.reasoner_answer = answer
            self.success = equivalent(self.answer, answer)
            agreed = self.tool_answer is not None and equivalent(self.tool_answer, answer)
            self.done = agreed or not self.tool_acted  # SA: the first readable answer is final
            result = StepResult(1.0 if self.success else 0.0, True, {"correct": self.success, "agreed": agreed})
        self.truncated = not self.done and self.turn >= self.max_turns
        self.done = self.done or self.truncated
        return result
