"""Each policy's tokenizer in the episode worker: a team may mix model families (docs/policies.md).

verl's agent-loop worker holds one tokenizer and processor, those of the first worker group's model
(``actor_rollout_ref.model``). A policy whose group runs a model with another tokenizer reads its
own from that group's model section, which the trainer hands over in ``rollout.custom.models``
(``trainer/mas_trainer.py``): each role's prompts are rendered, and its replies read, in its
policy's tokens. A text that crosses to another role (the tool's output in the planner's prompt)
travels as text and is tokenized again by the reader's tokenizer.
"""

from __future__ import annotations

import json
from typing import Any

MODELS_KEY = "models"  # rollout.custom.models: worker group -> its actor_rollout_ref.model section


class Codec:
    """One model family's tokenizer and processor: how a policy's prompts are rendered and its
    replies read (with the image and video placeholder tokens a vision-language model writes)."""

    def __init__(self, tokenizer: Any, processor: Any = None):
        from verl.utils.tokenizer.tokenizer import get_processor_token_id

        self.tokenizer = tokenizer
        self.processor = processor
        self.media_placeholders = frozenset(
            token for kind in ("image", "video") if processor is not None
            for token in [get_processor_token_id(processor, kind)] if token is not None
        )
        self._parsers: dict[str, Any] = {}

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def tool_parser(self, format_name: str) -> Any:
        """verl's tool parser for ``format_name`` (``rollout.multi_turn.format``) over this tokenizer."""
        if format_name not in self._parsers:
            from verl.experimental.agent_loop.tool_parser import ToolParser

            self._parsers[format_name] = ToolParser.get_tool_parser(format_name, self.tokenizer)
        return self._parsers[format_name]


_loaded: dict[str, Codec] = {}  # a model section (as JSON) -> its codec, loaded once per process


def tokenizer_source(model: dict) -> tuple[str, Any]:
    """What decides a model section's tokens: its tokenizer's folder and its chat-template override."""
    return str(model.get("tokenizer_path") or model.get("path")), model.get("custom_chat_template")


def codecs_of(settings: Any, rollout_config: Any, first: Codec) -> dict[str, Codec]:
    """policy -> the codec its roles use: ``first`` (the worker's own) for every policy whose model
    has the first group's tokenizer, else one loaded from its group's model section."""
    from omegaconf import DictConfig, OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    custom = rollout_config.get("custom") or {}
    models = custom.get(MODELS_KEY) or {}  # read as they come (a worker builds this loop per episode); converted only to load one
    groups = settings.groups()
    first_group = str(custom.get("policy") or next(iter(groups)))
    own = tokenizer_source(models[first_group]) if first_group in models else None
    codecs: dict[str, Codec] = {}
    for group, policies in groups.items():
        model = models.get(group)
        if model is None or tokenizer_source(model) == own:
            codec = first
        else:
            model = OmegaConf.to_container(model, resolve=True) if isinstance(model, DictConfig) else dict(model)
            key = json.dumps(model, sort_keys=True, default=str)
            if key not in _loaded:
                config = omega_conf_to_dataclass(OmegaConf.create(model), HFModelConfig)  # as verl's worker loads its own
                if model.get("custom_chat_template"):  # verl sets it on the processor alone; prompts render through the tokenizer
                    config.tokenizer.chat_template = model["custom_chat_template"]
                _loaded[key] = Codec(config.tokenizer, config.processor)
            codec = _loaded[key]
        codecs.update(dict.fromkeys(policies, codec))
    return codecs
