"""The ``pettingllms`` configuration reference, generated from the typed schema's own help strings
(``config.key``), so that it cannot drift from the code:

    python -m pettingllms_verl.config_reference > docs/configuration.md

``tests/test_docs.py`` checks that the file is current and that every key has its help.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

from pettingllms_verl.config import SECTION, PettingLLMsConfig

HEADER = """# Configuration reference: the `pettingllms` section

Every recipe is a verl `ppo_trainer` config with one more section, `pettingllms`, checked against a
typed schema before Ray starts (an unknown key or a wrong type fails naming the key). This page is
generated from that schema (`python -m pettingllms_verl.config_reference > docs/configuration.md`);
the rest of a recipe is verl's own configuration. `<role>` is a role of the environment (e.g. `plan`,
`tool`), `<policy>` a name you choose.
"""


UNIONS = (typing.Union, types.UnionType)  # Optional[X] and X | None
ENTRY = {"roles": "role", "policies": "policy"}  # what a map section's keys are called in the key column


def _type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in UNIONS:
        inner = [arg for arg in args if arg is not type(None)]
        return f"{_type_name(inner[0])} or null"
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}".replace("to section", "to sections")
    if dataclasses.is_dataclass(annotation):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _default(item: dataclasses.Field) -> str:
    if item.default_factory is not dataclasses.MISSING:
        value = item.default_factory()
        if dataclasses.is_dataclass(value):
            return "(section)"
        return f"`{json.dumps(value)}`"
    return f"`{json.dumps(item.default)}`"


def rows(schema: type, prefix: str) -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) for every key of ``schema`` and of the sections under it."""
    hints = typing.get_type_hints(schema)
    found = []
    for item in dataclasses.fields(schema):
        annotation = hints[item.name]
        key = f"{prefix}.{item.name}"
        found.append((key, _type_name(annotation), _default(item), item.metadata.get("help", "")))
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        nested = [arg for arg in (args if origin in UNIONS else (annotation,)) if dataclasses.is_dataclass(arg)]
        if origin in (dict, dict) and dataclasses.is_dataclass(args[1]):
            found += rows(args[1], f"{key}.<{ENTRY.get(item.name, 'name')}>")
        elif nested:
            found += rows(nested[0], key)
    return found


def reference() -> str:
    lines = [HEADER, "| key | type | default | what it does |", "|---|---|---|---|"]
    for key, kind, default, help_text in rows(PettingLLMsConfig, SECTION):
        lines.append(f"| `{key}` | {kind} | {default} | {help_text.replace('|', '&#124;')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    print(reference(), end="")


if __name__ == "__main__":
    main()
