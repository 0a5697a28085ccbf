"""The Plan-Path team as a LangGraph graph (``langgraph`` + ``langchain-openai``; docs/agent-programs.md).

Two nodes, ``tool`` then ``plan``, each an agent with a ``ChatOpenAI`` model of its own whose
``model`` names the agent; the graph loops back to the tool until the puzzle is solved or out of
turns. The puzzle, its sandbox and its prompts are ``PlanPathEnv``'s, as in plan_path_openai.py.

Train it (from the repository root):
    python -m verl.trainer.main_ppo --config-name plan_path_program_cpu \\
        pettingllms.program.target=examples/agents/plan_path_langgraph.py:team
"""

from typing import TypedDict

from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

from pettingllms_verl.envs.plan_path.env import PlanPathEnv

AGENTS = ("tool", "plan")


class Turns(TypedDict):
    turns: int


async def team(task: dict, client) -> dict:
    puzzle = PlanPathEnv(**task["env_kwargs"])
    puzzle.reset(task["seed"], task["task"])
    earned: dict[str, list[float]] = {agent: [] for agent in AGENTS}

    def agent_node(agent: str):
        model = ChatOpenAI(model=agent, base_url=client.base_url, api_key=client.api_key, max_retries=0)

        async def act(state: Turns) -> Turns:
            reply = await model.ainvoke(puzzle.observation(agent))
            earned[agent].append(puzzle.step(agent, reply.content).local_reward)  # the tool's program runs in the sandbox here
            return {"turns": state["turns"] + (agent == "plan")}

        return act

    graph = StateGraph(Turns)
    for agent in AGENTS:
        graph.add_node(agent, agent_node(agent))
    graph.add_edge(START, "tool")
    graph.add_edge("tool", "plan")
    graph.add_conditional_edges("plan", lambda state: END if puzzle.done else "tool")
    await graph.compile().ainvoke({"turns": 0})
    per_agent = {agent: puzzle.global_reward + sum(rewards) / len(rewards) for agent, rewards in earned.items()}
    return {"reward": per_agent, "success": puzzle.success}  # solved is the puzzle's word, not a reward threshold
