"""The Plan-Path team with the OpenAI Agents SDK (``openai-agents``; docs/agent-programs.md).

Two ``Agent``s, each on an ``OpenAIChatCompletionsModel`` whose ``model`` names it (the gateway
speaks Chat Completions, not the Responses API), tracing off (nothing leaves the machine). The
puzzle, its sandbox and its prompts are ``PlanPathEnv``'s, as in plan_path_openai.py: each agent's
system prompt is its instructions, the rest of the messages its input.

Train it (from the repository root):
    python -m verl.trainer.main_ppo --config-name plan_path_program_cpu \\
        pettingllms.program.target=examples/agents/plan_path_agents_sdk.py:team
"""

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled

from pettingllms_verl.envs.plan_path.env import PlanPathEnv

set_tracing_disabled(True)


async def team(task: dict, client) -> dict:
    ai = client.openai()
    puzzle = PlanPathEnv(**task["env_kwargs"])
    puzzle.reset(task["seed"], task["task"])
    earned: dict[str, list[float]] = {"tool": [], "plan": []}
    while not puzzle.done:
        for name in ("tool", "plan"):
            system, *conversation = puzzle.observation(name)
            agent = Agent(name=name, instructions=system["content"], model=OpenAIChatCompletionsModel(model=name, openai_client=ai))
            result = await Runner.run(agent, input=conversation)
            earned[name].append(puzzle.step(name, result.final_output).local_reward)  # the tool's program runs in the sandbox here
    per_agent = {name: puzzle.global_reward + sum(rewards) / len(rewards) for name, rewards in earned.items()}
    return {"reward": per_agent, "success": puzzle.success}  # solved is the puzzle's word, not a reward threshold
