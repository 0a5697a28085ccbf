"""The documentation: the site builds in strict mode (a dead link or a page missing from the
navigation fails), the configuration reference is the one the schema generates, every key of the
schema has its help, and every command the README and the pages under docs/ show names things that
exist: make targets, modules and their flags, scripts, recipes and their Hydra keys."""

import ast
import functools
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pettingllms_verl import config_reference
from pettingllms_verl.config import PettingLLMsConfig
from pettingllms_verl.eval import runs
from pettingllms_verl.eval.evaluate import parse_args, run_specs

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


PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]


def joined(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(line, command) of numbered lines of code, continuations (a trailing backslash) joined."""
    commands, pending, start = [], "", 0
    for number, code in lines:
        start = start or number
        if code.endswith("\\"):
            pending += code[:-1] + " "
            continue
        commands.append((start, pending + code))
        pending, start = "", 0
    return commands


def page_commands(page: str) -> list[tuple[int, str]]:
    """(line, command) of every command in a page's ``bash`` blocks (comments and continuations joined)."""
    text = (REPO / page).read_text()
    commands = []
    for block in re.finditer(r"```bash\n(.*?)```", text, re.S):
        first_line = text.count("\n", 0, block.start()) + 2
        lines = [(first_line + offset, line.split(" #", 1)[0].strip()) for offset, line in enumerate(block.group(1).splitlines())
                 if not line.lstrip().startswith("#")]
        commands += joined([(number, code) for number, code in lines if code])
    return commands


def docstring_commands(path: str) -> list[tuple[int, str]]:
    """(line, command) of the indented example commands of a CLI's docstring (what its --help prints):
    the lines from one that starts with ``pettingllms-`` or ``python `` through its continuations."""
    text = ast.get_docstring(ast.parse((REPO / path).read_text()), clean=False)
    lines, going = [], False
    for number, line in enumerate(text.splitlines(), start=1):  # the docstring opens the file's first line
        code = line.strip()
        if line.startswith("  ") and (going or code.startswith(("pettingllms-", "python "))):
            lines.append((number, code))
            going = code.endswith("\\")
    return joined(lines)


EVAL_CLI = "pettingllms_verl/eval/evaluate.py"
COMMANDS = [(page, line, command) for page in PAGES for line, command in page_commands(page)]
COMMANDS += [(EVAL_CLI, line, command) for line, command in docstring_commands(EVAL_CLI)]


def test_the_readme_and_the_pages_show_commands():
    assert len(page_commands("README.md")) >= 3 and len(COMMANDS) >= 20
    assert len(docstring_commands(EVAL_CLI)) >= 2


@functools.cache
def help_text(module: str) -> str:
    return subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=REPO, timeout=120).stdout


def page_recipes(page: str) -> dict[str, str]:
    """The recipes a page writes out in full: ``yaml`` blocks whose first line names the file (``# .../name.yaml``)."""
    return {name[1]: block for block in re.findall(r"```yaml\n(.*?)```", (REPO / page).read_text(), re.S)
            if (name := re.match(r"# (\S+\.yaml)\n", block))}


@pytest.mark.parametrize("page", PAGES)
def test_a_recipe_a_page_writes_out_is_the_file_an_example_ships(page):
    """A page's commands read the recipe it shows from the example's package: the file is there, as shown."""
    for path, block in page_recipes(page).items():
        shipped = sorted((REPO / "examples").glob(f"*/{path}"))
        assert shipped, f"{page}: the recipe {path} it shows is shipped by no example (examples/*/{path})"
        assert shipped[0].read_text() == block, f"{page}: {path} differs from {shipped[0].relative_to(REPO)}"


def recipe_folder(path: str | None) -> Path:
    """Where a command's recipe is read from: ``path`` (its --config-path or --recipes; ``$PWD`` the
    repository), else the package's recipes."""
    if path and not path.startswith("pkg://"):
        return Path(path.replace("$PWD", str(REPO)))
    return REPO / "recipes"  # the package's (pkg://pettingllms_verl.recipes) as in the repository


def composes(where: str, recipe: str, overrides: list[str], folder: Path) -> None:
    """The recipe composes with the overrides (those naming no shell variable): an unknown key, a
    plain override of a key the recipe lacks, a ``+`` on one it has, or a bad value fails here."""
    assert (folder / f"{recipe}.yaml").is_file(), f"{where}: no recipe {recipe} in {folder}"
    try:
        runs.compose(recipe, [o for o in overrides if "$" not in o], folder)
    except runs.EvalError as error:
        raise AssertionError(f"{where}: {error}") from None


@pytest.mark.parametrize("page, line, command", COMMANDS, ids=lambda value: str(value)[:40])
def test_every_command_on_every_page_names_what_exists(page, line, command):
    """Each command's make target, module (and its flags), script, recipe and Hydra keys exist (the
    quickstart itself runs in tests/e2e/test_quickstart_e2e.py): a renamed target, flag, recipe or key
    fails here with the page and line."""
    where = f"{page}:{line}: {command}"
    words = [part for word in shlex.split(command) for part in (word.split("=", 1) if word.startswith("--") and "=" in word else [word])]
    while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value prefixes
        words = words[1:]
    if not words:
        return
    if words[0] == "make":
        targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        result = subprocess.run(["make", "-n", *targets], cwd=REPO, capture_output=True, text=True)
        assert "No rule to make target" not in result.stderr, f"{where}: {result.stderr.strip()}"
    module = words[words.index("-m") + 1] if "-m" in words[:-1] else {"pettingllms-eval": "pettingllms_verl.eval"}.get(words[0])
    if module is not None:
        assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
        if module.startswith("pettingllms_verl"):  # its flags, as its --help lists them
            flags = {w.split("=", 1)[0] for w in words if w.startswith("--")}
            missing = sorted(flag for flag in flags if flag not in help_text(module))
            assert not missing, f"{where}: {module} has no {', '.join(missing)}"
        if module == "pettingllms_verl.eval":  # each run's recipe, with the --set overrides
            try:
                args = parse_args(words[words.index(module) + 1 if module in words else 1:])
            except SystemExit:
                raise AssertionError(f"{where}: pettingllms-eval refuses these arguments (its message is above)") from None
            path = words[words.index("--recipes") + 1] if "--recipes" in words[:-1] else None
            for _, recipe, _ in run_specs(args):
                composes(where, recipe, args.overrides, recipe_folder(path))
    for index, word in enumerate(words):
        if word == "--config-name" and index + 1 < len(words):
            recipe = words[index + 1]
            path = words[words.index("--config-path") + 1] if "--config-path" in words[:-1] else None
            overrides = [w for w in words[index + 2:] if "=" in w and not w.startswith("-")]
            composes(where, recipe, overrides, recipe_folder(path))
        if word.endswith((".py", ".sh")) and "/" in word and not word.startswith(("$", "<")):
            assert (REPO / word).is_file(), f"{where}: no file {word}"


def test_the_sample_pettingllms_section_passes_the_checks_as_printed():
    """docs/recipes.md's annotated ``pettingllms:`` section, on the environment it is written for."""
    import yaml

    from pettingllms_verl import envs
    from pettingllms_verl.config import load

    text = (REPO / "docs" / "recipes.md").read_text()
    (sample,) = [block for block in re.findall(r"```yaml\n(.*?)```", text, re.S) if block.startswith("pettingllms:")]
    settings = load(yaml.safe_load(sample)["pettingllms"])
    env = envs.make("plan_path", **settings.env_kwargs)
    env.reset(seed=0)
    settings.check_roles("plan_path", env.roles, env.workflow(settings.workflow).turn_order)
    assert settings.policy_of("plan") == "plan_policy" and settings.trainer.fault_budget == 0.5
