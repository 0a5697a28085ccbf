"""A puzzle's state drawn as an image, for roles played by a vision-language model.

A grid puzzle's text prompt shows its state as rows of symbols (``#`` a wall, ``@`` the agent, ...).
``draw_grid`` paints the same rows, a square of one colour per cell, so that a role given the image
sees exactly the state a text role reads. The image goes into the chat message as a content part
(``image_part``), the form processors' chat templates and verl's multimodal path take.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping, Sequence

CELL_PIXELS = 14  # side of one cell: a patch of Qwen2-VL's vision tower; a 6 x 6 grid is an 84 x 84 image
IMAGE = "image"  # the content part type of an image in a chat message


def draw_grid(rows: Sequence[str], palette: Mapping[str, tuple[int, int, int]], cell: int = CELL_PIXELS):
    """rows of symbols -> an RGB ``PIL.Image``: cell (r, c) filled with ``palette[rows[r][c]]``.
    A symbol without a colour is refused (a state the image cannot show must not pass as shown)."""
    from PIL import Image, ImageDraw

    height, width = len(rows), max(map(len, rows))
    image = Image.new("RGB", (width * cell, height * cell), palette[" "] if " " in palette else (255, 255, 255))
    pen = ImageDraw.Draw(image)
    for r, row in enumerate(rows):
        for c, symbol in enumerate(row):
            if symbol not in palette:
                raise ValueError(f"draw_grid: no colour for symbol {symbol!r} (row {r}, column {c}); palette: {sorted(palette)}")
            pen.rectangle([c * cell, r * cell, (c + 1) * cell - 1, (r + 1) * cell - 1], fill=palette[symbol])
    return image


def image_part(image) -> dict[str, Any]:
    """A chat message's content part holding ``image``."""
    return {"type": IMAGE, IMAGE: image}


def message_images(messages: Sequence[Mapping[str, Any]]) -> list:
    """The images of a chat, in the order its template renders them."""
    return [part[IMAGE] for message in messages if not isinstance(message["content"], str)
            for part in message["content"] if part.get("type") == IMAGE]


def placeholder_texts(processor) -> tuple[str, ...]:
    """The text of a processor's image and video placeholders (Qwen2-VL: ``<|image_pad|>``,
    ``<|video_pad|>``); none without a processor."""
    return tuple(text for name in ("image_token", "video_token") if isinstance(text := getattr(processor, name, None), str) and text)


def without_text(value: Any, texts: Sequence[str]) -> Any:
    """``value`` (messages, tools: lists, dicts and strings) with every one of ``texts`` taken out of
    its strings, those that taking one out would form included (``<|image_<|image_pad|>pad|>``), in
    one pass over each string; anything else (an image) is kept as it is."""
    texts = [t for t in texts if t]
    if isinstance(value, str):
        kept: list[str] = []
        for char in value:
            kept.append(char)
            for t in texts:
                if char == t[-1] and len(kept) >= len(t) and "".join(kept[-len(t):]) == t:
                    del kept[-len(t):]
                    break
        return "".join(kept)
    if isinstance(value, list):
        return [without_text(item, texts) for item in value]
    if isinstance(value, dict):
        return {key: without_text(item, texts) for key, item in value.items()}
    return value


def chat_inputs(tokenizer, processor, messages: Sequence[Mapping[str, Any]], tools: list[dict] | None = None,
                **template_kwargs: Any) -> dict[str, Any]:
    """A chat as the model reads it, its generation prompt added: ``input_ids`` (a list), and for a
    chat with images the processor's other outputs (``pixel_values``, ``image_grid_thw``, and for
    Qwen2-VL ``mm_token_type_ids``), each image's token expanded to the tokens its vision tower fills
    (a text chat goes through the tokenizer's template). A placeholder's text within the messages'
    or tools' text (a model's reply or program output shown to a role) is taken out: it would read as
    one more image or video than the chat holds, and the prompt fail to render or the model call to run."""
    if processor is not None:
        placeholders = placeholder_texts(processor)
        messages, tools = without_text(messages, placeholders), without_text(tools, placeholders)
    images = message_images(messages)
    if not images:
        ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False,
                                            **template_kwargs)
        return {"input_ids": list(ids)}
    if processor is None:
        raise ValueError("a prompt with images, and the model has no processor (a text-only model)")
    text = processor.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False, **template_kwargs)
    inputs = processor(text=[text], images=images, return_tensors="pt")
    return {"input_ids": inputs["input_ids"][0].tolist(), **{key: value for key, value in inputs.items() if key not in ("input_ids", "attention_mask")}}


PNG_DATA_URI = "data:image/png;base64,"


def data_uri(image) -> str:
    """``image`` as a PNG data URI: how episode logs keep the images a role was shown."""
    import base64
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return PNG_DATA_URI + base64.b64encode(buffer.getvalue()).decode("ascii")

