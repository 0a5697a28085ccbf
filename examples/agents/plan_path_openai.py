"""The Plan-Path team as a program with the bare ``openai`` client (docs/agent-programs.md).

A tool agent writes a short Python program; it runs in the package's sandbox on the puzzle's
state, and its printed moves are tried on a copy. A plan agent reads that program and its output
and answers with the moves that are played. Each turn: the tool, then the planner, until the
puzzle is solved or the turns run out. The puzzle's rules, prompts and scoring are
``PlanPathEnv``'s, so each call sends exactly the messages the native environment renders: the
training rows are the same token ids.

Train it (from the repository root, after ``make install``):
    python -m verl.trainer.main_ppo --config-name plan_path_program_cpu
"""

from pettingllms_verl.envs.plan_path.env import PlanPathEnv


async def team(task: dict, client) -> dict:
    ai = client.openai()
    puzzle = PlanPathEnv(**task["env_kwargs"])
    puzzle.reset(task["seed"], task["task"])
    earned = {"tool": [], "plan": []}
    while not puzzle.done:
        for agent in ("tool", "plan"):
            reply = await ai.chat.completions.create(model=agent, messages=puzzle.observation(agent))
            step = puzzle.step(agent, reply.choices[0].message.content)  # the tool's program runs in the sandbox here
            earned[agent].append(step.local_reward)
    # each agent: the team's progress, plus the mean of its own replies' rewards (as the native team's return)
    per_agent = {agent: puzzle.global_reward + sum(rewards) / len(rewards) for agent, rewards in earned.items()}
    return {"reward": per_agent, "success": puzzle.success}  # solved is the puzzle's word, not a reward threshold
