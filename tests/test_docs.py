"""The documentation: the site builds in strict mode (a dead link or a page missing from the
navigation fails), the configuration reference is the one the schema generates, every key of the
schema has its help, and every command the README shows names things that exist."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pettingllms_verl import config_reference
from pettingllms_verl.config import PettingLLMsConfig

REPO = Path(__file__).resolve().parents[1]


def test_the_site_builds_in_strict_mode(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()


def test_the_configuration_reference_is_generated_from_the_schema():
    shipped = (REPO / "docs" / "configuration.md").read_text()
    assert shipped == config_reference.reference(), (
        "docs/configuration.md is not the schema's: python -m pettingllms_verl.config_reference > docs/configuration.md")


def test_every_key_has_its_help():
    rows = config_reference.rows(PettingLLMsConfig, "pettingllms")
    missing = [key for key, _, _, help_text in rows if not help_text.strip()]
    assert not missing, f"pettingllms_verl/config.py: keys without help (give each its config.key('one line', default)): {missing}"
    assert {"pettingllms.k", "pettingllms.group_by", "pettingllms.roles.<role>.sampling.temperature",
            "pettingllms.policies.<policy>.adapter.rank"} <= {key for key, *_ in rows}


def readme_commands() -> list[tuple[int, str]]:
    """(line, command) of every command in the README's ``bash`` blocks (comments and continuations joined)."""
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.finditer(r"```bash\n(.*?)```", text, re.S):
        first_line = text.count("\n", 0, block.start()) + 2
        pending, start = "", 0
        for offset, line in enumerate(block.group(1).splitlines()):
            code = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if not code:
                continue
            start = start or first_line + offset
            if code.endswith("\\"):
                pending += code[:-1] + " "
                continue
            commands.append((start, pending + code))
            pending, start = "", 0
    return commands


def test_the_readme_shows_commands():
    assert len(readme_commands()) >= 3


@pytest.mark.parametrize("line, command", readme_commands(), ids=lambda value: str(value)[:40])
def test_every_readme_command_names_what_exists(line, command):
    """Each command's make target, module, script and recipe exist (the quickstart itself runs in
    tests/test_quickstart_e2e.py): a renamed target or recipe fails here with the README's line."""
    where = f"README.md:{line}: {command}"
    words = shlex.split(command)
    while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value prefixes
        words = words[1:]
    if not words:
        return
    if words[0] == "make":
        targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        result = subprocess.run(["make", "-n", *targets], cwd=REPO, capture_output=True, text=True)
        assert "No rule to make target" not in result.stderr, f"{where}: {result.stderr.strip()}"
    for index, word in enumerate(words):
        if word == "-m" and index + 1 < len(words):
            module = words[index + 1]
            found = subprocess.run([sys.executable, "-c", f"import importlib.util as u; print(u.find_spec({module!r}) is not None)"],
                                   capture_output=True, text=True, cwd=REPO)
            assert found.stdout.strip() == "True", f"{where}: no module {module}"
        if word == "--config-name" and index + 1 < len(words):
            assert (REPO / "recipes" / f"{words[index + 1]}.yaml").is_file(), f"{where}: no recipe {words[index + 1]}"
        if word.endswith((".py", ".sh")) and "/" in word and not word.startswith(("$", "<")):
            assert (REPO / word).is_file(), f"{where}: no file {word}"
