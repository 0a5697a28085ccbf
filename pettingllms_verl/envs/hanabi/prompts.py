"""Hanabi prompts and reply parser.

Actions: ``play N`` / ``discard N`` (N = slot of your own hand, 0 = leftmost), ``hint color C``
(C = colour letter or name) and ``hint rank R``. The prompt is rendered from a *view* the env
builds for one player, which holds no identity of that player's own cards.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from pettingllms_verl.envs.text import Messages, answer_text, int_or_none

COLOR_NAMES = {"R": "red", "Y": "yellow", "G": "green", "W": "white", "B": "blue"}
_COLOR_WORDS = {**{name: c for c, name in COLOR_NAMES.items()}, **{c.lower(): c for c in COLOR_NAMES}}
_FILLER = {"card", "slot", "position", "index", "number", "no", "my", "the", "your", "their", "partner", "to", "on", "a", "about", "at", "of"}
_TOKEN_RE = re.compile(r"[a-z]+|[0-9]+")
MAX_TOKENS = 4000  # the last words of a runaway reply are enough to find its action

SYSTEM = (
    "You play Hanabi, a cooperative card game, with one partner. Cards have a colour ({colors}) and a rank "
    "(1-{max_rank}). Together you build one firework per colour, in rank order from 1 to {max_rank}. "
    "You see your partner's cards but not your own; hints tell you about yours. On your turn do one of:\n"
    "- play N: play the card in slot N of your hand. If it is the next rank of its firework it is added "
    "(completing a firework with a {max_rank} regains an info token); otherwise it is discarded and you lose a fuse.\n"
    "- discard N: discard your slot N and regain an info token (not allowed with all {max_info} info tokens).\n"
    "- hint color C / hint rank R: spend an info token to tell your partner every card of that colour or "
    "rank in their hand (it must match at least one).\n"
    "After a play or discard you draw a card into the last slot; later cards move one slot left. The game ends "
    "when the last fuse is lost (score 0), every firework is complete, or one round after the deck runs out. "
    "Score = sum of the fireworks. Think briefly, then end with your action, e.g. <answer>play 0</answer>."
)


class Action(NamedTuple):
    kind: str  # "play" | "discard" | "hint_color" | "hint_rank"
    value: int | str  # slot, colour letter, or rank


def parse_action(text: str) -> Action | None:
    """The last action named in the answer; None when there is none. Colours and slots are not
    range-checked here (the env decides legality)."""
    words = _TOKEN_RE.findall(answer_text(text).lower())[-MAX_TOKENS:]
    for i in range(len(words) - 1, -1, -1):
        action = _action_at(words, i)
        if action is not None:
            return action
    return None


def _action_at(words: list[str], i: int) -> Action | None:
    verb = words[i]
    if verb not in ("play", "discard", "hint", "clue"):
        return None
    args = [w for w in words[i + 1 : i + 6] if w not in _FILLER][:2]
    if verb in ("play", "discard"):
        slot = int_or_none(args[0]) if args else None
        return None if slot is None else Action(verb, slot)
    kind = args.pop(0) if args and args[0] in ("color", "colour", "rank") else None
    if not args:
        return None
    color, rank = _COLOR_WORDS.get(args[0]), int_or_none(args[0])
    if color is not None and kind != "rank":
        return Action("hint_color", color)
    if rank is not None and kind in (None, "rank"):
        return Action("hint_rank", rank)
    return None


def format_action(action: Action) -> str:
    if action.kind.startswith("hint"):
        return f"hint {action.kind[5:]} {action.value}"
    return f"{action.kind} {action.value}"


def _possible(mask: int, values) -> list:
    return [v for bit, v in enumerate(values) if mask >> bit & 1]


def describe_knowledge(knowledge: tuple[int, int], colors: str, max_rank: int) -> str:
    """What hints told about one card: ``colour R, rank ? (2/3)``."""
    colours = _possible(knowledge[0], colors)
    ranks = _possible(knowledge[1], range(1, max_rank + 1))
    colour = colours[0] if len(colours) == 1 else f"? ({'/'.join(colours)})"
    rank = str(ranks[0]) if len(ranks) == 1 else f"? ({'/'.join(map(str, ranks))})"
    return f"colour {colour}, rank {rank}"


def describe_event(event: tuple, viewer: str) -> str:
    """One public log entry ``(actor, kind, detail)`` from ``viewer``'s side."""
    actor, kind, detail = event
    who = "You" if actor == viewer else f"Partner ({actor})"
    if kind == "hint":
        target = "your partner" if actor == viewer else "you"
        return f"{who} told {target}: {detail}."
    return f"{who} {kind} {detail}."


def messages(view: dict) -> Messages:
    """Messages for the player the env's ``view`` was built for."""
    colors, max_rank = view["colors"], view["max_rank"]
    fireworks = " ".join(f"{c}{view['fireworks'][c]}" for c in colors)
    own = "\n".join(
        f"  slot {i}: {describe_knowledge(k, colors, max_rank)}" for i, k in enumerate(view["own_knowledge"])
    )
    partner = "\n".join(
        f"  slot {i}: {card}  (they know: {describe_knowledge(k, colors, max_rank)})"
        for i, (card, k) in enumerate(zip(view["partner_hand"], view["partner_knowledge"]))
    )
    history = "\n".join(f"  {describe_event(e, view['you'])}" for e in view["recent"]) or "  (none yet)"
    status = f"Info tokens: {view['info_tokens']}/{view['max_info']}. Fuses left: {view['fuses']}. Deck: {view['deck_size']} cards."
    if view["final_turns_left"] is not None:
        status += f" The deck is empty: {view['final_turns_left']} turn(s) left in the game."
    user = (
        f"You are {view['you']}. Score {view['score']}/{view['max_score']}. Fireworks: {fireworks}.\n{status}\n"
        f"Discarded: {' '.join(view['discards']) or '(none)'}\n"
        f"Your hand (hidden from you; what the hints say):\n{own or '  (empty)'}\n"
        f"Your partner's hand:\n{partner or '  (empty)'}\n"
        f"Recent actions:\n{history}\n"
        + ("It is your turn." if view["to_move"] == view["you"] else f"It is {view['to_move']}'s turn.")
    )
    system = SYSTEM.format(colors=", ".join(colors), max_rank=max_rank, max_info=view["max_info"])
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
