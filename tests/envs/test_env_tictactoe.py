"""Tic-Tac-Toe: rules, rewards, the minimax opponent, clones and hostile replies."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pettingllms_verl.envs.tictactoe.prompts import parse_cell
from pettingllms_verl.envs import make
from pettingllms_verl.envs.tictactoe.env import (
    DRAW,
    INVALID_PENALTY,
    LINES,
    LOSS,
    WIN,
    free_cells,
    minimax_moves,
    winner,
)


def sa_game(opponent: str, first: str, seed: int, policy) -> tuple:
    """Play one sa game where ``policy(board, rng)`` picks x's cells; returns (env, x's rewards)."""
    env = make("tictactoe", mode="sa")
    env.reset(seed, {"seed": seed, "first": first, "opponent": opponent})
    rng, rewards = random.Random(seed), []
    while not env.done:
        rewards.append(env.step("x", f"<answer>{policy(env.board, rng)}</answer>").local_reward)
    return env, rewards


def minimax_policy(board, rng):
    return rng.choice(minimax_moves(board, "x"))


def random_policy(board, rng):
    return rng.choice(free_cells(board))


@pytest.mark.parametrize("first", ["x", "o"])
def test_minimax_never_loses_to_random_on_either_side(first):
    wins = 0
    for seed in range(150):
        as_x, _ = sa_game("random", first, seed, minimax_policy)  # minimax plays x
        as_o, _ = sa_game("minimax", first, seed, random_policy)  # minimax is the opponent (o)
        assert as_x.result("x") != "loss" and as_o.result("o") != "loss"
        wins += (as_x.result("x") == "win") + (as_o.result("o") == "win")
    assert wins > 200  # perfect play does not merely draw: it punishes random moves


@pytest.mark.parametrize("first", ["x", "o"])
def test_minimax_against_itself_always_draws(first):
    for seed in range(40):
        env, rewards = sa_game("minimax", first, seed, minimax_policy)
        assert env.outcome == "draw" and env.success and rewards[-1] == DRAW


def test_minimax_takes_a_win_and_blocks_a_loss():
    assert minimax_moves(list("xx.oo...."), "x") == [2]
    assert minimax_moves(list("oo.x....x"), "x") == [2]


@pytest.mark.parametrize("line", LINES)
def test_every_line_wins_in_self_play(line):
    env = make("tictactoe")
    env.reset(0)
    o_cells = [c for c in range(9) if c not in line][:2]
    assert winner(["o" if c in o_cells else "." for c in range(9)]) is None
    moves = [line[0], o_cells[0], line[1], o_cells[1], line[2]]
    for i, cell in enumerate(moves):
        result = env.step("xo"[i % 2], str(cell))
    assert env.done and env.outcome == "x" and env.result("o") == "loss"
    assert result.local_reward == WIN and result.info["final_rewards"] == {"x": WIN, "o": LOSS}
    assert not env.success and env.global_reward == 0.0  # mas: a decisive game is nobody's success


def test_no_winner_without_a_line():
    assert winner(list("xoxxoooxx")) is None and winner(list("xxo......")) is None


def test_illegal_and_unparseable_moves_are_penalised_board_unchanged_turn_passes():
    env = make("tictactoe")
    env.reset(0)
    env.step("x", "4")
    before = env.board[:]
    taken = env.step("o", "<answer>4</answer>")
    assert taken.local_reward == INVALID_PENALTY and taken.parse_ok and "invalid" in taken.info
    assert env.board == before and env.to_move == "x"
    garbage = env.step("x", "I resign")
    assert garbage.local_reward == INVALID_PENALTY and not garbage.parse_ok and env.board == before
    out_of_range = env.step("o", "cell 9")
    assert not out_of_range.parse_ok and env.board == before and env.to_move == "x"


def test_out_of_turn_and_after_the_end_change_nothing():
    env = make("tictactoe")
    env.reset(0)
    assert env.step("o", "4").info["ignored"] and env.board == ["."] * 9 and env.to_move == "x"
    for i, cell in enumerate([0, 3, 1, 4, 2]):
        env.step("xo"[i % 2], str(cell))
    board = env.board[:]
    assert env.step("o", "8").local_reward == 0.0 and env.board == board
    with pytest.raises(ValueError):
        env.step("z", "1")


def test_draw_is_success_and_rewards_both_players():
    env = make("tictactoe")
    env.reset(0)
    for i, cell in enumerate([0, 4, 8, 1, 7, 6, 2, 5, 3]):  # x o x o x o x o x: no line
        result = env.step("xo"[i % 2], str(cell))
    assert env.outcome == "draw" and env.success and env.global_reward == DRAW
    assert result.local_reward == DRAW and result.info["final_rewards"] == {"x": DRAW, "o": DRAW}


def test_turn_budget_ends_an_undecided_game():
    env = make("tictactoe")
    env.reset(0)
    for i in range(10):  # nobody ever names a cell: 5 turns of both roles
        env.step("xo"[i % 2], "pass")
    assert env.done and env.outcome == "unfinished" and not env.success and env.result("x") == "unfinished"
    assert env.truncated  # the only end that is not the game's own


def test_position_value_is_the_movers_outcome_under_perfect_play():
    def after(moves):
        env = make("tictactoe")
        env.reset(0)
        for i, cell in enumerate(moves):
            env.step("xo"[i % 2], str(cell))
        return env

    assert after([]).position_value("x") == DRAW  # perfect play from the empty board draws
    assert after([0, 4, 1, 8]).position_value("o") == LOSS  # o left 0-1-2 open: x wins next
    blocked = after([0, 4, 1, 2])  # o blocked it (and now threatens 2-4-6)
    assert (blocked.position_value("o"), blocked.position_value("x")) == (DRAW, DRAW)
    assert after([0, 3]).position_value("o") == LOSS and after([0, 3]).position_value("x") == WIN  # a later loss: a fork
    won = after([0, 3, 1, 4, 2])
    assert won.done and (won.position_value("x"), won.position_value("o")) == (WIN, LOSS)
    assert not won.truncated


def test_sa_loss_lands_on_the_agents_step_and_opponent_opens_when_o_starts():
    env = make("tictactoe", mode="sa")
    env.reset(3, {"seed": 3, "first": "o", "opponent": "minimax"})
    assert env.board.count("o") == 1 and env.to_move == "x"
    assert env.workflow("sa").turn_order == ("x",) and env.workflow("mas").turn_order == ("o", "x")
    while not env.done:  # x always takes the lowest free cell: minimax beats that
        result = env.step("x", str(free_cells(env.board)[0]))
    assert env.outcome == "o" and result.local_reward == LOSS and env.global_reward == LOSS and not env.success


def test_same_task_replays_the_same_game():
    def play(task):
        env = make("tictactoe", mode="sa")
        env.reset(0, task)
        for _ in range(5):
            env.step("x", str(free_cells(env.board)[-1]) if not env.done else "0")
        return env.board, env.task

    env = make("tictactoe", mode="sa", first="random")
    env.reset(11)
    board, task = play(env.task)
    assert play(task) == (board, task) and task["seed"] == 11


def test_observation_shows_board_and_turn():
    env = make("tictactoe")
    env.reset(0)
    env.step("x", "4")
    text = env.observation("o")[-1]["content"]
    assert "X" in text and "your turn (O)" in text and " 4 " not in text  # cell 4 shows X, not its number
    assert "O's turn" in env.observation("x")[-1]["content"]


def test_clones_are_independent():
    env = make("tictactoe", mode="sa")
    env.reset(0)
    env.step("x", "4")
    parent = (env.board[:], env.to_move, env.steps)
    clones = [env.clone() for _ in range(3)]
    clones[0].step("x", str(free_cells(clones[0].board)[0]))
    assert (env.board, env.to_move, env.steps) == parent and clones[1].board == parent[0]
    env.step("x", str(free_cells(env.board)[-1]))
    assert clones[2].board == parent[0]


def test_parse_cell():
    assert parse_cell("<think>maybe 3</think>I take <answer> 7 </answer>") == 7
    assert parse_cell("cells 1 and 2, final: 5") == 5
    assert parse_cell("<answer>9</answer>") is None and parse_cell("") is None and parse_cell("9" * 5000) is None


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(
        st.one_of(st.text(max_size=60), st.sampled_from(["<answer>", "</answer>", "4", "-1", "10", "<think>"]).map(lambda s: s * 3)),
        min_size=1,
        max_size=12,
    ),
    mode=st.sampled_from(["mas", "sa"]),
)
def test_fuzzed_replies_never_raise(texts, mode):
    env = make("tictactoe", mode=mode)
    env.reset(1)
    for i, text in enumerate(texts):
        role = env.to_move if mode == "mas" and i % 3 else "x"
        before = env.board[:]
        result = env.step(role, text)
        assert isinstance(result.local_reward, float)
        env.observation(role)
        changed = [c for c in range(9) if env.board[c] != before[c]]
        assert all(before[c] == "." for c in changed) and len(changed) <= (2 if mode == "sa" else 1)
