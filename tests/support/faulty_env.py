"""Plan-Path with faults on cue, for runs through ``main_ppo`` (``tests/e2e/test_faults_e2e.py``): a
recipe plays it under Plan-Path's own name (``+pettingllms.envs.plan_path=<this file>:FaultyPlanPath``),
so the rows stay Plan-Path's. Every cue is deterministic: a seed, or a file the test (or the run) writes."""

import os
import time

from pettingllms_verl.envs.plan_path.env import PlanPathEnv

OVERRIDE = f"+pettingllms.envs.plan_path={os.path.abspath(__file__)}:FaultyPlanPath"  # a recipe's Plan-Path, played by this class


class FaultyPlanPath(PlanPathEnv):
    options = {
        **PlanPathEnv.options,
        "fail_seeds": "the episodes of these seeds raise at the plan role's first step (every role has acted by then)",
        "fail_once_exists": "every step raises once this path exists (a run's checkpoint tracker: from the step after it)",
        "fail_first_once": "a path: the first episode to create it (O_EXCL, across processes) raises before its first reply",
        "hold_dir": "each prompt writes <dir>/started, then waits until <dir>/go exists (up to 10 minutes)",
        "hold_after": "a path: hold_dir holds only once it exists (a run's checkpoint tracker: from the step after it)",
    }

    def reset(self, seed, task=None):
        super().reset(seed, task)
        self.episode_seed = seed

    def observation(self, role):
        # not in reset: the preflight resets an env before Ray starts, observation runs in episodes only
        once = self.config.get("fail_first_once")
        if once and self.turn == 0 and role == "tool":
            try:
                os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                raise RuntimeError(f"the environment broke before the first reply ({once})")
        hold, after = self.config.get("hold_dir"), self.config.get("hold_after")
        if hold and (not after or os.path.exists(after)):
            open(os.path.join(hold, "started"), "w").close()
            deadline = time.monotonic() + 600
            while not os.path.exists(os.path.join(hold, "go")) and time.monotonic() < deadline:
                time.sleep(0.05)
        return super().observation(role)

    def step(self, role, text):
        if role == "plan" and self.episode_seed in (self.config.get("fail_seeds") or ()):
            raise RuntimeError(f"the environment broke on seed {self.episode_seed}")
        cue = self.config.get("fail_once_exists")
        if cue and os.path.exists(cue):
            raise RuntimeError(f"the environment broke: {cue} exists")
        return super().step(role, text)
