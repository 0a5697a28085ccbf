"""Hanabi for two players: cooperative, imperfect information, standard rules.

Cards are strings ``colour letter + rank`` ("R3"). Per colour the deck holds rank 1 three times,
the top rank once and every rank between twice (standard: 1,1,1,2,2,3,3,4,4,5 over R Y G W B,
50 cards, hands of 5, 8 info tokens, 3 fuses). ``SMALL_DECK`` (2 colours, ranks 1-3: 12 cards,
hands of 3) keeps tests fast; every option is configurable.

Rules as implemented (standard, as in DeepMind's Hanabi Learning Environment):
- p0 is dealt the first ``hand_size`` cards of the deck order, p1 the next; draws follow the order.
  A played or discarded card leaves its slot, later cards move one slot left, the new card goes last.
- ``hint color C`` / ``hint rank R`` goes to the partner, costs an info token (illegal with none) and
  must touch at least one of the partner's cards. Every card is told whether it matches, so the
  partner's knowledge (possible colours/ranks per card) narrows on both sides.
- ``discard N`` regains an info token; illegal while all info tokens are held.
- ``play N``: the next rank of its colour is added to that firework (completing a firework with the
  top rank regains an info token if one is missing); otherwise the card is discarded and a fuse lost.
- The game ends when the last fuse is lost (score 0, as in the standard rules), every firework is
  complete, or after each player (the drawer included) had one more turn once the last card was drawn.
  It also ends when the turn budget (``max_turns`` rounds, default = deck size) is spent.

Illegal or unparseable replies cost ``INVALID_PENALTY``; hands, deck, tokens and fireworks stay as
they were (the public log notes the forfeit) and the turn passes (a forfeited turn, counted toward the final round) so the workflow's
fixed alternation stays valid.

Rewards: local = ``PLAY_REWARD`` for a successful play, ``MISPLAY_PENALTY`` for a lost fuse, a hint
earns ``USEFUL_HINT_REWARD`` when it touches a card playable now (else 0; without it hints would
never be rewarded at the step that gives them), a discard 0. ``global_reward`` = score / max score.
``success`` = score >= ``success_score`` (default: half the max score, rounded down).

Workflows: ``mas`` = p0 then p1 each turn (two agents, one per seat). ``sa`` = the same seat order
played by one agent: the runner maps both seats to one policy; each seat still sees only what
that seat may see.

Task: ``{"seed", "colors", "max_rank", "hand_size", "info_tokens", "fuse_tokens", "deck"}``; ``deck``
is the full deal order (the seeded shuffle, or a stacked order given in the task), so a task
recreates its game without relying on the RNG.
"""

from __future__ import annotations

import random
from typing import Any

from pettingllms_verl.envs.base import Env, StepResult, Workflow, ignored, workflow_for
from pettingllms_verl.envs.hanabi import prompts
from pettingllms_verl.envs.hanabi.prompts import Action
from pettingllms_verl.envs.text import Messages

PLAY_REWARD = 1.0
MISPLAY_PENALTY = -1.0
USEFUL_HINT_REWARD = 0.25
INVALID_PENALTY = -0.5
RECENT_EVENTS = 6  # log entries shown in the prompt (the knowledge lines carry the older hints)

FULL_DECK = {"colors": "RYGWB", "max_rank": 5, "hand_size": 5, "info_tokens": 8, "fuse_tokens": 3}
SMALL_DECK = {"colors": "RY", "max_rank": 3, "hand_size": 3}
RULE_OPTIONS = tuple(FULL_DECK)


def full_deck(colors: str, max_rank: int) -> list[str]:
    """Every card of the game, in a fixed order (the shuffle's input)."""
    copies = {rank: 3 if rank == 1 else 1 if rank == max_rank else 2 for rank in range(1, max_rank + 1)}
    return [f"{c}{rank}" for c in colors for rank in range(1, max_rank + 1) for _ in range(copies[rank])]


class HanabiEnv(Env):
    name = "hanabi"
    roles = ("p0", "p1")

    options = {
        "max_turns": "turns per episode (default: the whole game, one turn per card of the deck)",
        "success_score": "score that counts as a success (default: half the maximum)",
        **{rule: "deck rule (see FULL_DECK)" for rule in RULE_OPTIONS},
    }

    def __init__(self, max_turns: int | None = None, success_score: int | None = None, **rules: Any) -> None:
        """``rules``: any of ``FULL_DECK``'s keys (defaults: the full game)."""
        unknown = set(rules) - set(RULE_OPTIONS)
        if unknown:
            raise ValueError(f"hanabi: unknown options {sorted(unknown)}; rule options: {RULE_OPTIONS}")
        rules = {**FULL_DECK, **rules}
        _check_rules(rules)
        super().__init__(max_turns=max_turns, success_score=success_score, **rules)

    def reset(self, seed: int, task: dict | None = None) -> None:
        if task is None:
            rules = {key: self.config[key] for key in RULE_OPTIONS}
            deck = full_deck(rules["colors"], rules["max_rank"])
            random.Random(seed).shuffle(deck)
            task = {"seed": int(seed), **rules, "deck": deck}
        _check_rules(task)
        if sorted(task.get("deck") or []) != sorted(full_deck(task["colors"], task["max_rank"])):
            raise ValueError("hanabi task: 'deck' must be a permutation of the full deck")
        self._task = {"seed": int(task.get("seed", seed)), **{k: task[k] for k in RULE_OPTIONS}, "deck": list(task["deck"])}
        self.colors, self.max_rank, hand_size = task["colors"], task["max_rank"], task["hand_size"]
        self.max_info, self.max_fuses = task["info_tokens"], task["fuse_tokens"]
        self.max_score = len(self.colors) * self.max_rank
        self.max_turns = self.config["max_turns"] or len(task["deck"])
        self.success_score = self.config["success_score"] or self.max_score // 2
        self.deck = task["deck"][::-1]  # draw with pop()
        self.hands = [[self.deck.pop() for _ in range(hand_size)] for _ in self.roles]
        self.unknown = ((1 << len(self.colors)) - 1, (1 << self.max_rank) - 1)  # masks of possible colours, ranks
        self.knowledge = [[self.unknown] * hand_size for _ in self.roles]
        self.fireworks = dict.fromkeys(self.colors, 0)
        self.discards: list[str] = []
        self.info_tokens, self.fuses = self.max_info, self.max_fuses
        self.current = 0
        self.actions = 0
        self.final_turns_left: int | None = len(self.roles) if not self.deck else None
        self.log: list[tuple] = []  # public events (actor, kind, detail); entries are immutable
        self.done = False
        self.success = False

    @property
    def task(self) -> dict:
        return {**self._task, "deck": list(self._task["deck"])}

    @property
    def score(self) -> int:
        return 0 if self.fuses == 0 else sum(self.fireworks.values())

    @property
    def global_reward(self) -> float:
        return self.score / self.max_score

    def workflow(self, mode: str) -> Workflow:
        return workflow_for(mode, mas=self.roles, sa=self.roles, max_turns=self.max_turns)

    def snapshot(self) -> dict:
        """Both hands (which no player sees whole) and the table."""
        table = {key: value for key, value in self.view(self.roles[0]).items() if key not in ("you", "own_knowledge", "partner_hand", "partner_knowledge")}
        return {**table, "hands": {role: list(self.hands[self._seat(role)]) for role in self.roles}}

    def view(self, role: str) -> dict:
        """Everything ``role`` may know: never its own cards, only what hints said about them."""
        me = self._seat(role)
        partner = 1 - me
        return {
            "you": role,
            "to_move": self.roles[self.current],
            "colors": self.colors,
            "max_rank": self.max_rank,
            "fireworks": dict(self.fireworks),
            "score": self.score,
            "max_score": self.max_score,
            "info_tokens": self.info_tokens,
            "max_info": self.max_info,
            "fuses": self.fuses,
            "deck_size": len(self.deck),
            "final_turns_left": self.final_turns_left,
            "discards": sorted(self.discards),
            "own_knowledge": list(self.knowledge[me]),
            "partner_hand": list(self.hands[partner]),
            "partner_knowledge": list(self.knowledge[partner]),
            "recent": self.log[-RECENT_EVENTS:],
        }

    def observation(self, role: str) -> Messages:
        return prompts.messages(self.view(role))

    def step(self, role: str, text: str) -> StepResult:
        seat = self._seat(role)
        if self.done:
            return ignored("episode is done")
        if seat != self.current:
            return ignored(f"not {role}'s turn")
        action = prompts.parse_action(text)
        if action is None:
            reward, info = INVALID_PENALTY, {"invalid": "no action"}
        elif (reason := self._illegal(seat, action)) is not None:
            reward, info = INVALID_PENALTY, {"invalid": reason, "action": prompts.format_action(action)}
        else:
            reward, info = self._apply(seat, action)
        if "invalid" in info:
            self.log.append((role, "forfeited", "the turn (invalid reply)"))
        self._end_turn()
        info.update(score=self.score, info_tokens=self.info_tokens, fuses=self.fuses)
        return StepResult(reward, action is not None, info)

    def clone(self) -> HanabiEnv:
        twin = super().clone()
        twin.deck = self.deck[:]
        twin.hands = [hand[:] for hand in self.hands]
        twin.knowledge = [cards[:] for cards in self.knowledge]
        twin.fireworks = dict(self.fireworks)
        twin.discards = self.discards[:]
        twin.log = self.log[:]
        return twin

    def playable(self, card: str) -> bool:
        return self.fireworks[card[0]] == int(card[1:]) - 1

    def _illegal(self, seat: int, action: Action) -> str | None:
        if action.kind in ("play", "discard"):
            if not 0 <= action.value < len(self.hands[seat]):
                return f"no slot {action.value} (hand has {len(self.hands[seat])} cards)"
            if action.kind == "discard" and self.info_tokens == self.max_info:
                return "discard with all info tokens held"
            return None
        if self.info_tokens == 0:
            return "hint without an info token"
        if action.kind == "hint_color" and action.value not in self.colors:
            return f"no colour {action.value} in this game"
        if not any(self._matches(card, action) for card in self.hands[1 - seat]):
            return f"{prompts.format_action(action)} touches no card"
        return None

    def _apply(self, seat: int, action: Action) -> tuple[float, dict]:
        if action.kind.startswith("hint"):
            return self._hint(seat, action)
        card = self.hands[seat].pop(action.value)
        self.knowledge[seat].pop(action.value)
        reward, lost_fuse = 0.0, ""
        if action.kind == "discard":
            self.discards.append(card)
            self.info_tokens += 1
            outcome = "discarded"
        elif self.playable(card):
            self.fireworks[card[0]] += 1
            if self.fireworks[card[0]] == self.max_rank and self.info_tokens < self.max_info:
                self.info_tokens += 1
            reward, outcome = PLAY_REWARD, "played"
        else:
            self.discards.append(card)
            self.fuses -= 1
            reward, outcome, lost_fuse = MISPLAY_PENALTY, "misplayed", " and lost a fuse"
        self.log.append((self.roles[seat], outcome, f"{card} from slot {action.value}{lost_fuse}"))
        if self.deck:
            self.hands[seat].append(self.deck.pop())
            self.knowledge[seat].append(self.unknown)
        return reward, {"action": prompts.format_action(action), "outcome": outcome, "card": card}

    def _hint(self, seat: int, action: Action) -> tuple[float, dict]:
        partner = 1 - seat
        kind = action.kind[5:]
        bit = 1 << (self.colors.index(action.value) if kind == "color" else action.value - 1)
        touched = []
        for i, card in enumerate(self.hands[partner]):
            colours, ranks = self.knowledge[partner][i]
            match = self._matches(card, action)
            if kind == "color":
                colours = bit if match else colours & ~bit
            else:
                ranks = bit if match else ranks & ~bit
            self.knowledge[partner][i] = (colours, ranks)
            if match:
                touched.append(i)
        self.info_tokens -= 1
        slots = ", ".join(map(str, touched))
        self.log.append((self.roles[seat], "hint", f"{kind} {action.value} is slot(s) {slots}"))
        useful = any(self.playable(self.hands[partner][i]) for i in touched)
        return (USEFUL_HINT_REWARD if useful else 0.0), {"action": prompts.format_action(action), "touched": touched}

    def _matches(self, card: str, action: Action) -> bool:
        return card[0] == action.value if action.kind == "hint_color" else int(card[1:]) == action.value

    def _end_turn(self) -> None:
        self.actions += 1
        self.current = 1 - self.current
        if self.final_turns_left is not None:
            self.final_turns_left -= 1
        elif not self.deck:  # the last card was just drawn: everyone, the drawer included, gets one more turn
            self.final_turns_left = len(self.roles)
        self.done = self.game_over or self.actions >= self.max_turns * len(self.roles)
        self.success = self.score >= self.success_score

    @property
    def game_over(self) -> bool:
        """Ended by the rules: the last fuse lost, every firework complete, or the final round played."""
        return self.fuses == 0 or sum(self.fireworks.values()) == self.max_score or self.final_turns_left == 0

    @property
    def truncated(self) -> bool:
        return self.done and not self.game_over

    def _seat(self, role: Any) -> int:
        self.check_role(role)
        return self.roles.index(role)


def _check_rules(rules: dict) -> None:
    colors = rules.get("colors")
    if not isinstance(colors, str) or not colors or len(set(colors)) != len(colors) or not set(colors) <= set(prompts.COLOR_NAMES):
        raise ValueError(f"hanabi: colors must be distinct letters of {''.join(prompts.COLOR_NAMES)}, got {colors!r}")
    if not 2 <= rules.get("max_rank", 0) <= 9:
        raise ValueError("hanabi: max_rank must be 2-9")
    if not all(isinstance(rules.get(k), int) and rules[k] >= 1 for k in ("hand_size", "info_tokens", "fuse_tokens")):
        raise ValueError("hanabi: hand_size, info_tokens and fuse_tokens must be positive ints")
    if 2 * rules["hand_size"] > len(full_deck(colors, rules["max_rank"])):
        raise ValueError("hanabi: the deck cannot fill both hands")
