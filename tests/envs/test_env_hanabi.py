"""Hanabi (2 players): rules, token accounting, end of game, hidden information, clones, hostile replies."""

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pettingllms_verl.envs.hanabi.prompts import Action, parse_action
from pettingllms_verl.envs import make
from pettingllms_verl.envs.hanabi.env import (
    FULL_DECK,
    INVALID_PENALTY,
    MISPLAY_PENALTY,
    PLAY_REWARD,
    SMALL_DECK,
    USEFUL_HINT_REWARD,
    full_deck,
)


def stacked(prefix: list[str], rules: dict = SMALL_DECK, **config):
    """An env whose deck starts with ``prefix`` (p0's hand, p1's hand, then draws); the rest follows."""
    rules = {**FULL_DECK, **rules}
    rest = full_deck(rules["colors"], rules["max_rank"])
    for card in prefix:
        rest.remove(card)
    env = make("hanabi", **rules, **config)
    env.reset(0, {"seed": 0, **rules, "deck": prefix + rest})
    return env


def snapshot(env) -> tuple:
    return (
        env.deck[:],
        [h[:] for h in env.hands],
        [k[:] for k in env.knowledge],
        dict(env.fireworks),
        env.discards[:],
        env.info_tokens,
        env.fuses,
    )


def play_script(env, replies):
    """Step the seat whose turn it is with each reply; returns the step results."""
    return [env.step(env.roles[env.current], reply) for reply in replies]


def test_full_game_setup():
    env = make("hanabi")
    env.reset(7)
    counts = Counter(int(card[1]) for card in full_deck("RYGWB", 5) if card[0] == "G")
    assert counts == {1: 3, 2: 2, 3: 2, 4: 2, 5: 1} and len(full_deck("RYGWB", 5)) == 50
    assert [len(h) for h in env.hands] == [5, 5] and len(env.deck) == 40
    assert (env.info_tokens, env.fuses, env.max_score, env.score) == (8, 3, 25, 0)
    assert env.workflow("mas").turn_order == ("p0", "p1") == env.workflow("sa").turn_order


def test_seeded_deal_and_task_recreate_the_game():
    env, twin = make("hanabi"), make("hanabi")
    env.reset(3)
    twin.reset(3)
    assert env.hands == twin.hands and env.deck == twin.deck
    twin.reset(4)
    assert twin.task["deck"] != env.task["deck"]
    twin.reset(99, env.task)
    assert twin.hands == env.hands and twin.deck == env.deck and twin.task == env.task
    with pytest.raises(ValueError):
        twin.reset(0, {**env.task, "deck": env.task["deck"][:-1]})


def test_discard_with_all_info_tokens_is_illegal_and_changes_nothing():
    env = make("hanabi", **SMALL_DECK)
    env.reset(0)
    before = snapshot(env)
    result = env.step("p0", "<answer>discard 0</answer>")
    assert result.local_reward == INVALID_PENALTY and result.parse_ok and "info tokens" in result.info["invalid"]
    assert snapshot(env) == before and env.current == 1  # the forfeited turn passes


def test_hint_needs_a_token_and_a_touched_card():
    env = stacked(["R1", "R2", "R3", "Y1", "Y2", "Y3"])
    for reply in ["hint color R", "hint color G", "hint rank 4"]:  # p1 holds only yellows 1-3
        env.current = 0
        before = snapshot(env)
        assert env.step("p0", reply).local_reward == INVALID_PENALTY and snapshot(env) == before
    env.current = 0
    results = play_script(env, ["hint color Y", "hint color R"] * 4)
    assert all(r.parse_ok and "invalid" not in r.info for r in results) and env.info_tokens == 0
    before = snapshot(env)
    result = env.step("p0", "hint rank 1")
    assert result.info["invalid"] == "hint without an info token" and snapshot(env) == before


def test_hint_tells_every_card_whether_it_matches():
    env = stacked(["R1", "R2", "R3", "Y1", "R1", "Y2"])
    result = env.step("p0", "hint rank 1")
    assert result.info["touched"] == [0, 1] and result.local_reward == USEFUL_HINT_REWARD
    ranks = [k[1] for k in env.knowledge[1]]
    assert ranks == [0b001, 0b001, 0b110]  # slots 0-1: rank 1; slot 2: not 1
    text = env.observation("p1")[-1]["content"]
    assert "slot 0: colour ? (R/Y), rank 1" in text and "slot 2: colour ? (R/Y), rank ? (2/3)" in text
    assert env.step("p1", "hint rank 3").local_reward == 0.0  # R3 is not playable yet


def test_token_accounting_and_a_completed_firework_returns_a_token():
    hand0 = ["R1", "R2", "R3", "R4", "R5"]
    env = stacked(hand0 + ["Y1", "Y2", "Y3", "Y4", "Y5"], FULL_DECK)
    tokens = [env.info_tokens]
    for _ in range(4):  # p0 plays its next red, p1 hints red (p0's hand always holds reds)
        play_script(env, ["play 0", "hint color R"])
        tokens.append(env.info_tokens)
    assert tokens == [8, 7, 6, 5, 4] and env.fireworks["R"] == 4
    result = env.step("p0", "play 0")
    assert result.info["card"] == "R5" and result.local_reward == PLAY_REWARD
    assert env.fireworks["R"] == 5 and env.info_tokens == 5  # the 5 gave one back
    result = env.step("p1", "discard 0")
    assert env.info_tokens == 6 and env.discards == [result.info["card"]]


def test_completing_a_firework_at_max_tokens_does_not_overflow():
    env = stacked(["R1", "R2", "R3", "Y1", "Y2", "Y3"])
    play_script(env, ["play 0", "play 0", "play 0", "play 0", "play 0"])
    assert env.fireworks == {"R": 3, "Y": 2} and env.info_tokens == 8


def test_scripted_perfect_game_reaches_the_maximum_score():
    env = stacked(["R1", "R2", "R3", "Y1", "Y2", "Y3"])
    results = play_script(env, ["play 0"] * 6)
    assert [r.local_reward for r in results] == [PLAY_REWARD] * 6
    assert env.score == env.max_score == 6 and env.done and env.success and env.global_reward == 1.0
    assert env.final_turns_left == 2  # the last card was just drawn: the perfect score ended it, not the final round
    assert env.step("p0", "play 0").info["ignored"]


def test_third_fuse_ends_the_game_with_score_zero():
    env = stacked(["R1", "R1", "R1", "Y1", "Y3", "R3"], success_score=1)
    play_script(env, ["play 0", "play 0"])  # two good plays: score 2
    assert env.score == 2 and env.success
    results = play_script(env, ["play 0", "play 0"])  # R1 again, Y3 too early: two fuses lost
    assert [r.local_reward for r in results] == [MISPLAY_PENALTY] * 2 and env.fuses == 1 and not env.done
    play_script(env, ["play 0"])  # the third R1
    assert env.fuses == 0 and env.done and env.score == 0 and not env.success and env.global_reward == 0.0
    assert not env.truncated  # the rules ended it
    assert sum(env.fireworks.values()) == 2  # the fireworks stay; the standard score is 0


def test_one_final_round_after_the_last_card_is_drawn():
    env = make("hanabi", **SMALL_DECK)
    env.reset(5)
    while env.deck:  # p0 hints whatever colour p1 holds first, p1 discards
        play_script(env, [f"hint color {env.hands[1][0][0]}", "discard 0"])
    assert env.final_turns_left == 2 and not env.done and env.current == 0
    play_script(env, ["hint rank " + env.hands[1][0][1]])
    assert not env.done and env.final_turns_left == 1
    result = env.step("p1", "discard 0")  # the drawer's own last turn; nothing left to draw
    assert env.done and len(env.hands[1]) == 2 and result.info["outcome"] == "discarded"


def test_forfeited_turn_counts_toward_the_final_round():
    env = make("hanabi", **SMALL_DECK)
    env.reset(5)
    while env.deck:
        play_script(env, [f"hint color {env.hands[1][0][0]}", "discard 0"])
    play_script(env, ["nonsense", "discard 9"])
    assert env.done


def test_turn_budget_ends_the_game():
    env = make("hanabi", max_turns=2, **SMALL_DECK)
    env.reset(0)
    play_script(env, ["?", "?", "?"])
    assert not env.done
    play_script(env, ["?"])  # 2 rounds of 2 seats
    assert env.done and env.score == 0 and not env.success and env.truncated


def test_out_of_turn_replies_are_ignored():
    env = make("hanabi", **SMALL_DECK)
    env.reset(0)
    before = snapshot(env)
    assert env.step("p1", "play 0").info["ignored"] and snapshot(env) == before and env.current == 0
    with pytest.raises(ValueError):
        env.step("p2", "play 0")


def random_game_states(seed: int, rules: dict, steps: int):
    """States along a game of random (mostly legal) replies."""
    env = make("hanabi", **rules)
    env.reset(seed)
    rng = random.Random(seed)
    replies = ["play 0", "play 1", "discard 0", "discard 2", "hint rank 1", "hint rank 2", "hint color R", "hint color Y"]
    for _ in range(steps):
        if env.done:
            break
        yield env
        env.step(env.roles[env.current], rng.choice(replies))


@pytest.mark.parametrize("rules", [SMALL_DECK, {}], ids=["small", "full"])
def test_a_player_never_sees_its_own_cards(rules):
    checked = 0
    for seed in range(8):
        for env in random_game_states(seed, rules, 30):
            for seat, role in enumerate(env.roles):
                if not env.deck:
                    continue
                other = env.clone()  # same knowledge, different cards in this player's hand
                other.hands[seat] = [other.deck[i % len(other.deck)] for i in range(len(other.hands[seat]))]
                if other.hands[seat] == env.hands[seat]:
                    continue
                assert other.observation(role) == env.observation(role)
                partner = env.roles[1 - seat]
                assert other.observation(partner) != env.observation(partner)  # the partner does see them
                checked += 1
    assert checked > 100


def test_partner_cards_are_shown():
    env = stacked(["R1", "R2", "R3", "Y1", "Y2", "Y3"])
    text = env.observation("p0")[-1]["content"]
    assert all(card in text for card in ["Y1", "Y2", "Y3"])
    assert not any(card in text for card in ["R2", "R3"])


def test_clones_are_independent():
    env = make("hanabi", **SMALL_DECK)
    env.reset(2)
    env.step("p0", f"hint color {env.hands[1][0][0]}")
    parent = snapshot(env)
    clones = [env.clone() for _ in range(8)]
    play_script(clones[0], ["discard 0", "play 0", f"hint rank {clones[0].hands[1][0][1]}"])
    clones[1].hands[0].append("R9")
    clones[1].knowledge[1][0] = (0, 0)
    clones[1].fireworks["R"] = 3
    assert snapshot(env) == parent and snapshot(clones[2]) == parent and env.current == 1
    play_script(env, ["play 1"])
    assert snapshot(clones[3]) == parent


def test_parse_action_formats():
    assert parse_action("<answer>play 2</answer>") == Action("play", 2)
    assert parse_action("I think... Discard card #4") == Action("discard", 4)
    assert parse_action("hint colour red") == Action("hint_color", "R")
    assert parse_action("<answer>Hint: color B</answer>") == Action("hint_color", "B")
    assert parse_action("hint rank 3") == Action("hint_rank", 3)
    assert parse_action("give a hint number 5 to partner") == Action("hint_rank", 5)
    assert parse_action("play 1? no. <answer>hint yellow</answer>") == Action("hint_color", "Y")
    assert parse_action("play it safe") is None and parse_action("hint rank red") is None
    assert parse_action("play " + "9" * 5000) is None and parse_action("") is None


FRAGMENTS = st.sampled_from(
    ["play", "discard", "hint", "color", "rank", "R", "y", "blue", "0", "1", "2", "4", "7", "-3", "99999999",
     "<answer>", "</answer>", "<think>", " ", "\n", "#", "slot", "é", "\x00"]
)


@settings(max_examples=200, deadline=None)
@given(replies=st.lists(st.one_of(st.text(max_size=40), st.lists(FRAGMENTS, max_size=8).map(" ".join)), max_size=25),
       small=st.booleans(), seed=st.integers(0, 10_000))
def test_fuzzed_replies_never_raise_and_keep_the_rules(replies, small, seed):
    env = make("hanabi", **(SMALL_DECK if small else {}))
    env.reset(seed)
    total = len(env.deck) + sum(map(len, env.hands))
    for reply in replies:
        parse_action(reply)
        role = env.roles[env.current]
        result = env.step(role, reply)
        assert isinstance(result.local_reward, float)
        env.observation(role)
        assert 0 <= env.info_tokens <= env.max_info and 0 <= env.fuses <= env.max_fuses
        cards = len(env.deck) + sum(map(len, env.hands)) + len(env.discards) + sum(env.fireworks.values())
        assert cards == total and [len(k) for k in env.knowledge] == [len(h) for h in env.hands]
