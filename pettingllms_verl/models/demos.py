"""Noisy demonstrations of Plan-Path for a supervised warm start (verl's SFT trainer, `models/sft.py`).

A demonstration is one reply of one role in an episode played out with the demonstrations
themselves, so later prompts carry what the earlier replies did (the tool's program and output in
the plan agent's prompt, the position after a plan). Each reply is the right one with the
probability ``p_correct`` gives its kind, and a plausible wrong one otherwise:

- ``tool``: ``BFS_PROGRAM`` (a shortest path around the walls) or ``NAIVE_PROGRAM`` (rows then
  columns, blind to walls: right only when no wall is in the way);
- ``copy``, the plan agent with a tool output in its prompt (MAS): that output's line as it is, or
  random moves;
- ``plan``, the plan agent alone (SA): a shortest path from the solver, or random moves.

The warm policy so holds both behaviours of each role: RL has something to choose between, and a
team can get further than one agent (the tool's program solves every grid; a plan agent alone must
find the path itself). Which method gains most from RL is what ``make reproduce`` measures.
"""

from __future__ import annotations

import random

from pettingllms_verl.envs.plan_path.env import MOVE_DELTAS, bfs_distances

# Both programs read the state ({"grid", "pos", "goal"}) as JSON on stdin and print their moves in
# the answer's own format (<answer>U R</answer>): the plan agent's copy is then that line verbatim,
# an induction from "<answer>". With bare moves the tiny model learned to read its first move from
# the grid instead (both programs' first moves follow the geometry), and got it wrong in about 4 of
# 10 copies; with this format the untrained team succeeds about twice as often (benchmarks/RESULTS.md, "Bare-moves warm start").
BFS_PROGRAM = """import json
s=json.load(open(0));g=s["grid"];q=[(tuple(s["pos"]),"")];v=set()
for p,m in q:
 if list(p)==s["goal"]:print("<answer>"+" ".join(m)+"</answer>");break
 if p in v:continue
 v.add(p);r,c=p
 for d,a,b in("U",-1,0),("D",1,0),("L",0,-1),("R",0,1):
  if 0<=r+a<len(g) and 0<=c+b<len(g[0]) and g[r+a][c+b]!="#":q.append(((r+a,c+b),m+d))"""

NAIVE_PROGRAM = """import json
s=json.load(open(0));(r,c),(y,x)=s["pos"],s["goal"]
print("<answer>"+" ".join("D"*(y-r)+"U"*(r-y)+"R"*(x-c)+"L"*(c-x))+"</answer>")"""


def shortest_path(view: dict) -> list[str]:
    """One shortest move list from ``view["pos"]`` to ``view["goal"]`` (the env's BFS, walked down)."""
    grid, (r, c), goal = view["grid"], view["pos"], tuple(view["goal"])
    width = len(grid[0])
    dist = bfs_distances(list(grid), goal)
    moves = []
    while (r, c) != goal:
        for move, (dr, dc) in MOVE_DELTAS.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < len(grid) and 0 <= nc < width and dist[nr * width + nc] == dist[r * width + c] - 1 >= 0:
                moves.append(move)
                r, c = nr, nc
                break
    return moves


def _random_moves(rng: random.Random) -> list[str]:
    return [rng.choice("UDLR") for _ in range(rng.randint(1, 6))]


def _answer(moves: list[str]) -> str:
    return f"<answer>{' '.join(moves)}</answer>"


def plan_path_demos(episodes: int, p_correct: dict[str, float], seed: int = 0, env_kwargs: dict | None = None,
                    workflows: tuple[str, ...] = ("sa", "mas")) -> list[dict]:
    """``episodes`` episodes of Plan-Path played with noisy demonstrations, their workflows taken in
    turn from ``workflows``; one ``{"messages": [system, user, assistant]}`` row per reply (verl's
    multi-turn SFT format), with the ``role`` that replied. ``p_correct``: the chance of the right reply
    per kind, ``tool``, ``copy`` (plan with a tool output) and ``plan`` (plan alone)."""
    from pettingllms_verl import envs

    env = envs.make("plan_path", **(env_kwargs or {}))
    rng = random.Random(seed)
    rows = []
    for episode in range(episodes):
        workflow = env.workflow(workflows[episode % len(workflows)])
        env.reset(seed=20_000_000 + (seed % 1000) * 100_000 + episode)  # outside every data_prep split's seed range
        while not env.done:
            for role in workflow.turn_order:
                if env.done:
                    break
                kind = "tool" if role == "tool" else "copy" if env.tool_output is not None else "plan"
                right = rng.random() < p_correct[kind]
                if kind == "tool":
                    reply = f"```python\n{BFS_PROGRAM if right else NAIVE_PROGRAM}\n```"
                elif kind == "copy":  # MAS: the tool's printed moves are in the prompt
                    reply = env.tool_output.strip() if right else _answer(_random_moves(rng))
                else:
                    reply = _answer(shortest_path(env.view()) if right else _random_moves(rng))
                rows.append({"messages": [*env.observation(role), {"role": "assistant", "content": reply}], "role": role})
                env.step(role, reply)
    return rows
