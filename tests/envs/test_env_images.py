"""The grid puzzles drawn as images for the roles of ``image_roles`` (envs/images.py): the image shows
the state the text shows, cell by cell, and follows it as the episode goes; the other roles, and the
tool's program, read exactly what they read without the option."""

import json

import pytest

from pettingllms_verl import envs
from pettingllms_verl.envs.images import CELL_PIXELS, IMAGE, draw_grid, image_part, message_images, without_text
from pettingllms_verl.envs.plan_path import prompts as plan_path_prompts
from pettingllms_verl.envs.sokoban import prompts as sokoban_prompts

PUZZLES = {  # env -> (its symbol rows of a view, its palette)
    "plan_path": (plan_path_prompts.symbols, plan_path_prompts.PALETTE),
    "sokoban": (lambda view: view["room"], sokoban_prompts.PALETTE),
}


def cells_of(image, rows: list[str], palette: dict) -> list[str]:
    """The image read back into symbols: each cell's centre pixel, matched to its colour."""
    symbol_of = {colour: symbol for symbol, colour in palette.items()}
    half = CELL_PIXELS // 2
    return ["".join(symbol_of[image.getpixel((c * CELL_PIXELS + half, r * CELL_PIXELS + half))] for c in range(len(row)))
            for r, row in enumerate(rows)]


@pytest.mark.parametrize("name", sorted(PUZZLES))
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_the_image_shows_the_state_the_text_shows_and_follows_it(name, seed):
    symbols, palette = PUZZLES[name]
    env = envs.make(name, image_roles=["plan"])
    env.reset(seed=seed)
    for _ in range(3):  # the start, then after each of two plan replies
        rows = symbols(env.view())
        (image,) = message_images(env.observation("plan"))
        assert image.size == (max(map(len, rows)) * CELL_PIXELS, len(rows) * CELL_PIXELS)
        assert cells_of(image, rows, palette) == rows
        if env.done:
            break
        env.step("plan", "<answer>R D</answer>")
    assert sum(r.count("@") + r.count("+") for r in rows) == 1  # the agent is on the drawn grid


@pytest.mark.parametrize("name", sorted(PUZZLES))
def test_other_roles_and_the_tools_program_read_what_they_read_without_the_option(name):
    drawn, plain = envs.make(name, image_roles=["plan"]), envs.make(name)
    for env in (drawn, plain):
        env.reset(seed=3)
    assert drawn.observation("tool") == plain.observation("tool")  # the tool role still reads text
    assert json.dumps(drawn.view()) == json.dumps(plain.view())  # its program's stdin
    system, user = drawn.observation("plan")
    assert system == plain.observation("plan")[0]
    image_part, text_part = user["content"]
    assert image_part["type"] == IMAGE and text_part["type"] == "text"
    assert "Grid (" not in text_part["text"] and "Room:" not in text_part["text"]  # the grid is in the image alone
    # after a tool ran, the plan role's text part carries its program and output as the text prompt does
    for env in (drawn, plain):
        env.step("tool", "```python\nprint('R')\n```")
    prompts = drawn.prompts
    text, plain_text = drawn.observation("plan")[1]["content"][1]["text"], plain.observation("plan")[1]["content"]
    assert text.startswith(prompts.caption(drawn.view())) and plain_text.startswith(prompts.render(plain.view()))
    tool_part = text.removeprefix(prompts.caption(drawn.view()))
    assert "The tool agent's program:" in tool_part and tool_part == plain_text.removeprefix(prompts.render(plain.view()))


def test_a_role_the_env_does_not_have_or_an_env_that_draws_nothing_is_refused():
    with pytest.raises(ValueError, match=r"image_roles names \['coder'\], not roles of this environment \(tool, plan\)"):
        envs.make("plan_path", image_roles=["coder"])
    with pytest.raises(envs.UnknownEnvOption, match="sudoku: unknown option 'image_roles'"):
        envs.make("sudoku", image_roles=["plan"])


def test_message_helpers_and_a_symbol_without_a_colour():
    image = draw_grid(["#."], {"#": (0, 0, 0), ".": (255, 255, 255)})
    messages = [{"role": "system", "content": "rules"},
                {"role": "user", "content": [{"type": IMAGE, IMAGE: image}, {"type": "text", "text": "where"}]}]
    assert message_images(messages) == [image]
    with pytest.raises(ValueError, match=r"no colour for symbol '\?' \(row 0, column 1\)"):
        draw_grid(["#?"], {"#": (0, 0, 0)})



def test_a_placeholders_text_is_taken_out_of_every_text_and_nothing_else():
    """What a seeing role reads may hold a model's text spelling the processor's image placeholder
    (tests/vllm_tier/test_vision.py: with Qwen2-VL's processor)."""
    image = draw_grid(["#."], {"#": (0, 0, 0), ".": (255, 255, 255)})
    messages = [{"role": "system", "content": "rules <|image_pad|>"},
                {"role": "user", "content": [image_part(image), {"type": "text", "text": "printed <|image_<|image_pad|>pad|>R"}]}]
    cleaned = without_text(messages, ("<|image_pad|>", "<|video_pad|>"))
    assert cleaned[0]["content"] == "rules " and cleaned[1]["content"][1]["text"] == "printed R"  # joined pieces too
    assert cleaned[1]["content"][0] == image_part(image) and messages[1]["content"][1]["text"].endswith("pad|>R")  # a copy
    assert without_text(messages, ()) == messages and without_text([{"role": "user", "content": None}], ("<|image_pad|>",))[0]["content"] is None
    deep = 20_000  # nested spellings are undone in one pass (a pass per level would take minutes at the gateway's 4 MiB)
    assert without_text("<|image_" * deep + "<|image_pad|>" + "pad|>" * deep + "R", ("<|image_pad|>", "")) == "R"
