"""A math team as a LangGraph graph: a solver and a verifier (docs/agent-programs.md), like the
reference project's AutoGen math team.

The solver answers with its reasoning and a final ``\\boxed{}`` answer. The verifier reads the
problem and that solution and replies ACCEPT, or REJECT with what is wrong; a rejection goes back
to the solver with the verifier's words, for at most ``max_turns`` rounds (the recipe's
``env_kwargs``). The team's reward is 1 when the last boxed answer equals the gold one (graded by
math-verify, in the package's grading process), else 0; every call of both agents is trained on it.

Train it (from the repository root):
    python -m verl.trainer.main_ppo --config-name math_program_cpu
"""

from typing import TypedDict

from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

from pettingllms_verl.envs.math.grading import MAX_ANSWER_CHARS, equivalent
from pettingllms_verl.envs.text import last_boxed

SOLVER = "Solve the problem. Reason briefly, then give the final answer as \\boxed{...}."
VERIFIER = "Check the solution to the problem. Reply ACCEPT if its final answer is right, else REJECT and say what is wrong."


class Work(TypedDict):
    problem: str
    solution: str
    feedback: str
    verdict: str
    rounds: int


def build(client, max_rounds: int):
    solver = ChatOpenAI(model="solver", base_url=client.base_url, api_key=client.api_key, max_retries=0)
    verifier = ChatOpenAI(model="verifier", base_url=client.base_url, api_key=client.api_key, max_retries=0)

    async def solve(work: Work) -> dict:
        ask = work["problem"] + (f"\n\nA previous solution was rejected: {work['feedback']}" if work["feedback"] else "")
        reply = await solver.ainvoke([{"role": "system", "content": SOLVER}, {"role": "user", "content": ask}])
        return {"solution": reply.content, "rounds": work["rounds"] + 1}

    async def verify(work: Work) -> dict:
        reply = await verifier.ainvoke([
            {"role": "system", "content": VERIFIER},
            {"role": "user", "content": f"Problem: {work['problem']}\n\nSolution: {work['solution']}"},
        ])
        verdict = "accept" if reply.content.strip().upper().startswith("ACCEPT") else "reject"
        return {"verdict": verdict, "feedback": reply.content}

    graph = StateGraph(Work)
    graph.add_node("solver", solve)
    graph.add_node("verifier", verify)
    graph.add_edge(START, "solver")
    graph.add_edge("solver", "verifier")
    graph.add_conditional_edges("verifier", lambda work: END if work["verdict"] == "accept" or work["rounds"] >= max_rounds else "solver")
    return graph.compile()


async def team(task: dict, client) -> float:
    problem = task["task"]
    graph = build(client, int(task["env_kwargs"].get("max_turns", 2)))
    work = await graph.ainvoke({"problem": problem["problem"], "solution": "", "feedback": "", "verdict": "", "rounds": 0})
    return 1.0 if equivalent(problem["answer"], last_boxed(work["solution"], MAX_ANSWER_CHARS)) else 0.0
