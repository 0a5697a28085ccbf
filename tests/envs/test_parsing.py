"""Shared reply parsers: what they read, and that no text makes them raise."""

from hypothesis import given, settings
from hypothesis import strategies as st

from pettingllms_verl.envs.text import (
    DIRECTION_ALIASES,
    answer_text,
    extract_code,
    int_or_none,
    last_int,
    parse_int_grid,
    parse_int_tuples,
    parse_moves,
    strip_think,
)


def test_strip_think_and_answer_text():
    assert strip_think("<think>U U</think>R") == "R"
    assert strip_think("<think>never closed U U") == ""
    assert strip_think("reasoning the template opened</think> final") == " final"
    assert answer_text("x <answer>1</answer> y <answer>2</answer>") == "2"
    assert answer_text("<answer>cut off") == "cut off"
    assert answer_text("no tags") == "no tags"


def test_extract_code_takes_last_python_block():
    text = "```python\nprint(1)\n```\ntext\n```py\nprint(2)\n```\n```bash\nls\n```"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("```\nprint(3)\n```") == "print(3)\n"
    assert extract_code("```python\nprint(4)") == "print(4)"  # cut off by a token limit
    assert extract_code("```bash\nls\n```") is None
    assert extract_code("no code here") is None
    assert extract_code("```python\n\n```") is None
    assert extract_code("<think>```python\nprint(5)\n```</think>nothing") is None


def test_parse_moves_forms():
    def moves(text):
        return parse_moves(text, DIRECTION_ALIASES, max_moves=50)

    assert moves("<answer>R R D</answer>") == ["R", "R", "D"]
    assert moves('<answer>["up", "Left", "down"]</answer>') == ["U", "L", "D"]
    assert moves("<answer>URRD</answer>") == ["U", "R", "R", "D"]
    assert moves("I think we should go right then down.\nR, D") == ["R", "D"]
    assert moves("<answer>Moves: R, D</answer>") == ["R", "D"]
    assert moves("Let me think about it") is None
    assert moves("<answer>R X D</answer>") is None  # every word inside <answer> must be a move
    assert moves("") is None
    assert parse_moves("R" * 1000, DIRECTION_ALIASES, max_moves=7) == ["R"] * 7


def test_parse_int_grid_forms():
    rows = [[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]]

    def grid(text):
        return parse_int_grid(text, 4, 4, 0, 4)

    assert grid(str(rows)) == rows
    assert grid("\n".join(" ".join(map(str, r)) for r in rows)) == rows
    assert grid("\n".join("".join(map(str, r)) for r in rows)) == rows
    assert grid("\n".join(f"Row {i + 1}: {r}" for i, r in enumerate(rows))) == rows
    assert grid("<answer>\n" + "\n".join("|".join(map(str, r)) for r in rows) + "\n</answer>") == rows
    assert grid("1 2 3 4\n3 4 1 2\n2 1 4 3") is None  # three rows only
    assert grid("1 2 3 9\n3 4 1 2\n2 1 4 3\n4 3 2 1") is None  # 9 out of range
    assert grid("1 2 3 4\n3 4 1 2\n2 1 4 3\n4 3 2 " + "1" * 5000) is None


def test_parse_int_tuples_and_last_int():
    assert parse_int_tuples("fills: [0, 1, 3], (2,2,4) and [1,2]", 3, 10) == [(0, 1, 3), (2, 2, 4)]
    assert parse_int_tuples("[0, 1, " + "9" * 5000 + "]", 3, 10) == []
    assert parse_int_tuples("[0,0,1] " * 100, 3, 5) == [(0, 0, 1)] * 5
    assert last_int("I pick cell 4, no, 7", 0, 8) == 7
    assert last_int("cell 12", 0, 8) is None
    assert int_or_none("٣") is None  # non-ASCII digits are not numbers here
    assert int_or_none("-12") == -12
    assert int_or_none("--5") is None and int_or_none("1e3") is None and int_or_none("") is None


model_text = st.one_of(
    st.text(max_size=300),
    st.lists(
        st.sampled_from(
            ["```", "```python\n", "<answer>", "</answer>", "<think>", "</think>", "[", "]", "(", ")", ",", "\n",
             "U", "up", "R", "9" * 4400, "-", "0", "4", "٣", "😀", "Row 1:", " "]
        ),
        max_size=40,
    ).map("".join),
)


@settings(max_examples=300, deadline=None)
@given(model_text)
def test_parsers_never_raise(text):
    int_or_none(text)
    strip_think(text)
    answer_text(text)
    code = extract_code(text)
    assert code is None or code.strip()
    moves = parse_moves(text, DIRECTION_ALIASES, max_moves=20)
    assert moves is None or (0 < len(moves) <= 20 and set(moves) <= set("UDLR"))
    grid = parse_int_grid(text, 4, 4, 0, 4)
    assert grid is None or all(len(r) == 4 and all(0 <= v <= 4 for v in r) for r in grid)
    assert all(len(t) == 3 for t in parse_int_tuples(text, 3, 64))
    value = last_int(text, 0, 8)
    assert value is None or 0 <= value <= 8
