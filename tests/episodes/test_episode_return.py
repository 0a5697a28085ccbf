"""The single-agent return (``episode_return``) never rewards stalling: in every environment the
same solution played fast scores at least as much as played slowly (stalled replies in between),
through the real episode runner with scripted replies."""

import asyncio

import pytest

from pettingllms_verl.envs import make
from pettingllms_verl.episodes.core import episode_return, run_episode

SUM = "a, b = map(int, input().split())\nprint(a + b)"
SUDOKU = {"puzzle": [[1, 0, 0, 0], [3, 0, 1, 2], [2, 0, 0, 3], [0, 0, 0, 0]], "solution": [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]}
STALL = "Let me think about it."  # parses as nothing: the state is unchanged, the turn is spent


def _fills(cells):
    return "<answer>" + ", ".join(f"[{r}, {c}, {v}]" for r, c, v in cells) + "</answer>"


_EMPTY = [(r, c, SUDOKU["solution"][r][c]) for r in range(4) for c in range(4) if not SUDOKU["puzzle"][r][c]]
_CODE_TASK = {"problem": "Read two integers a and b and print a + b.",
              "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}], "solution": SUM}
_PROGRAM = f"```python\n{SUM}\n```"

# env, options, task, fast replies, slow replies (the same solution with stalls in between)
CASES = {
    # the example: a 1x5 corridor, solved in one reply vs stalling three replies before finishing
    "plan_path": ("plan_path", {"max_turns": 5}, {"grid": ["....."], "start": [0, 0], "goal": [0, 4], "optimal_len": 4},
                  ["<answer>R R R R</answer>"], ["<answer>R R</answer>", STALL, STALL, STALL, "<answer>R R</answer>"]),
    "sokoban": ("sokoban", {}, {"room": ["######", "#@$ .#", "#    #", "######"], "max_steps": 6},
                ["<answer>R R</answer>"], ["<answer>R</answer>", STALL, "<answer>R</answer>"]),
    "sudoku": ("sudoku", {"max_turns": 4}, SUDOKU, [_fills(_EMPTY)], [_fills(_EMPTY[:5]), STALL, STALL, _fills(_EMPTY[5:])]),
    "math": ("math", {"max_turns": 3}, {"problem": "Write 18/24 in lowest terms.", "answer": "\\frac{3}{4}"},
             ["\\boxed{\\frac{3}{4}}"], [STALL, STALL, "\\boxed{\\frac{3}{4}}"]),
    # the single coder's first program ends the episode: stalling is all a slower solution can do
    "code": ("code", {"max_turns": 3}, _CODE_TASK, [_PROGRAM], [STALL, STALL, _PROGRAM]),
    # one agent plays both seats: a stall of each seat, then the same plays
    "hanabi": ("hanabi", {"colors": "RY", "max_rank": 3, "hand_size": 3}, None,
               ["play 0"] * 6, ["play 0", "play 0", STALL, STALL, "play 0", "play 0", "play 0", "play 0"]),
    "tictactoe": ("tictactoe", {"mode": "sa"}, None, None, None),
}


def _tictactoe_task():
    """A seeded game against the random opponent where x's top row wins both played straight and
    after a stall (the stall passes the turn: the opponent moves once more)."""
    for seed in range(500):
        task = {"seed": seed, "first": "x", "opponent": "random"}
        if all(play("tictactoe", {"mode": "sa"}, task, replies)[0].success for replies in (TOP_ROW, [STALL] + TOP_ROW)):
            return task
    raise AssertionError("no seed lets the top row win both ways")


TOP_ROW = ["<answer>0</answer>", "<answer>1</answer>", "<answer>2</answer>"]


def _hanabi_task():
    from pettingllms_verl.envs.hanabi.env import FULL_DECK, SMALL_DECK, full_deck

    rules = {**FULL_DECK, **SMALL_DECK}
    prefix = ["R1", "R2", "R3", "Y1", "Y2", "Y3"]
    rest = full_deck(rules["colors"], rules["max_rank"])
    for card in prefix:
        rest.remove(card)
    return {"seed": 0, **rules, "deck": prefix + rest}


def play(name: str, options: dict, task: dict, replies: list[str], alpha: float = 1.0):
    env = make(name, **options)
    env.reset(0, task)
    workflow = env.workflow("sa")
    script = iter(replies)

    async def generate(role, prompt_ids, n):
        return [([0], [0.0])]

    texts = []

    def decode(role, ids):
        texts.append(next(script, STALL))
        return texts[-1]

    episode = asyncio.run(run_episode(env, workflow.turn_order, workflow.max_turns, 1, alpha, generate, lambda role, m: [0], decode))
    return episode, episode_return(episode.samples, episode.final_global_reward, alpha)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_a_faster_solution_never_scores_below_a_slower_one(case, alpha):
    name, options, task, fast, slow = CASES[case]
    if name == "tictactoe":
        task, fast, slow = _tictactoe_task(), TOP_ROW, [STALL] + TOP_ROW
    task = task if task is not None else _hanabi_task()
    fast_episode, fast_return = play(name, options, task, fast, alpha)
    slow_episode, slow_return = play(name, options, task, slow, alpha)
    assert fast_episode.success and slow_episode.success, (fast_episode.end_cause, slow_episode.end_cause)
    assert len([s for s in slow_episode.samples if s.chosen]) > len([s for s in fast_episode.samples if s.chosen])
    assert fast_return >= slow_return, (fast_return, slow_return)


def test_the_old_sum_of_mixed_rewards_rewarded_stalling():
    """What the return replaced: summing alpha * global + local along the path counts the progress
    level again every turn, so stalling scored more (the issue's 1x5 Plan-Path: 2.95 vs 5.59)."""
    name, options, task, fast, slow = CASES["plan_path"]
    fast_episode, _ = play(name, options, task, fast)
    slow_episode, _ = play(name, options, task, slow)
    summed = [sum(s.reward for s in e.samples if s.chosen) for e in (fast_episode, slow_episode)]
    assert summed[0] < summed[1]


def test_the_return_counts_the_final_team_reward_once():
    name, options, task, fast, _ = CASES["plan_path"]
    episode, value = play(name, options, task, fast, alpha=2.0)
    (sample,) = [s for s in episode.samples if s.chosen]
    assert value == pytest.approx(2.0 * episode.final_global_reward + sample.local_reward)


def test_the_return_averages_the_chosen_replies_and_skips_the_rest():
    from pettingllms_verl.episodes.core import Sample

    def sample(local, chosen, placeholder=False):
        return Sample([1], [2], [0.0], 0, "plan", "", 0, local, 0.3, 0.0, True, chosen=chosen, placeholder=placeholder)

    samples = [sample(0.4, True), sample(9.0, False), sample(-0.2, True), sample(5.0, True, placeholder=True), sample(0.7, True)]
    # chosen, played replies: 0.4, -0.2, 0.7 -> mean 0.3; final team reward 0.5 counted once
    assert episode_return(samples, final_global_reward=0.5, alpha=2.0) == pytest.approx(2.0 * 0.5 + 0.3)
    assert episode_return([], final_global_reward=0.5, alpha=2.0) == pytest.approx(1.0)
