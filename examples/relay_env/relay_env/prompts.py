"""What the describer and the guesser are shown, and how the guesser's reply is read."""

from __future__ import annotations

from pettingllms_verl.envs.text import Messages, answer_text

MAX_CLUE_CHARS = 200  # what the guesser is shown of a clue


def describer_messages(word: str, choices: list[str]) -> Messages:
    system = (
        "You are the describer of a word relay. Write a short clue for the secret word so the guesser, "
        "who sees only your clue and the choices, can name it. Never write the word itself."
    )
    user = f"Choices: {', '.join(choices)}\nSecret word: {word}\nYour clue:"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def guesser_messages(clue: str | None, choices: list[str]) -> Messages:
    """In SA there is no describer, so no clue: the guesser picks among the choices alone."""
    system = "You are the guesser of a word relay. Answer with one of the choices as <answer>word</answer>."
    shown = clue[:MAX_CLUE_CHARS] if clue else "(no clue)"
    user = f"Choices: {', '.join(choices)}\nClue: {shown}\nYour guess:"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse_guess(text: str, choices: list[str]) -> str | None:
    """The choice named in the reply's answer (case-insensitive), or None when it names none."""
    words = answer_text(text).strip().lower().split()
    named = [choice for choice in choices if choice.lower() in words]
    return named[-1] if named else None
