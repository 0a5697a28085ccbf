"""The environments' house rules, read from the source: one package per environment, shared code
that imports none of them, no environment importing another, shared constants defined once."""

import ast
from pathlib import Path

import pytest

from pettingllms_verl import envs

ENVS_DIR = Path(envs.__file__).parent
SHARED = {"base", "images", "text", "tool_plan"}  # envs/<module>.py that every environment may use
PACKAGES = sorted(path.parent.name for path in ENVS_DIR.glob("*/env.py"))


def _imports(path: Path) -> set[str]:
    """The ``pettingllms_verl`` modules ``path`` imports (see ``_imports_of``)."""
    return _imports_of(path.read_text(), ".".join(path.relative_to(ENVS_DIR.parents[1]).with_suffix("").parts[:-1]))


def _imports_of(source: str, package: str) -> set[str]:
    """The ``pettingllms_verl`` modules ``source`` (a module of ``package``) imports: ``from a import b``
    counts as ``a.b``; relative imports are resolved against ``package``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("pettingllms_verl.")}


def test_relative_imports_are_read_too():
    assert _imports(ENVS_DIR / "plan_path" / "env.py") >= {"pettingllms_verl.envs.plan_path.prompts.PROMPTS"}
    source = "from ..sokoban import env\nfrom . import prompts\nfrom .prompts import PROMPTS\n"
    assert _imports_of(source, "pettingllms_verl.envs.plan_path") == {
        "pettingllms_verl.envs.sokoban.env", "pettingllms_verl.envs.plan_path.prompts",
        "pettingllms_verl.envs.plan_path.prompts.PROMPTS",
    }


def _envs_part(module: str) -> str | None:
    """``pettingllms_verl.envs.<part>...`` -> part; None outside the envs package."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "envs" else None


def _module_constants(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names.update(t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper())
    return names


def test_every_registered_environment_is_a_package_with_its_rules_and_prompts():
    assert PACKAGES == sorted(envs._ENVS)  # the shipped table (installed packages may declare more)
    for name in PACKAGES:
        assert envs._ENVS[name].startswith(f"pettingllms_verl.envs.{name}.env:")
        assert (ENVS_DIR / name / "prompts.py").is_file() and (ENVS_DIR / name / "__init__.py").is_file()
    assert not (ENVS_DIR.parent / "agents").exists()


@pytest.mark.parametrize("name", PACKAGES)
def test_an_environment_imports_only_itself_and_the_shared_modules(name):
    for path in (ENVS_DIR / name).glob("*.py"):
        for module in _imports(path):
            part = _envs_part(module)
            assert part is None or part in SHARED | {name}, f"{path.name} of {name} imports {module}"
            assert not module.startswith(("pettingllms_verl.rollout", "pettingllms_verl.trainer")), module


@pytest.mark.parametrize("shared", sorted(SHARED))
def test_shared_modules_import_no_environment(shared):
    allowed = {"text"} if shared == "base" else {"base", "images", "text"} if shared == "tool_plan" else set()
    for module in _imports(ENVS_DIR / f"{shared}.py"):
        part = _envs_part(module)
        assert part is None or part in allowed, f"{shared}.py imports {module}"


def test_the_shared_constants_are_defined_once():
    shared = {name for module in SHARED for name in _module_constants(ENVS_DIR / f"{module}.py")}
    for path in ENVS_DIR.glob("*/*.py"):
        redefined = _module_constants(path) & shared
        assert not redefined, f"{path.relative_to(ENVS_DIR)} defines {sorted(redefined)} again"


def _package_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere in its source (inside functions too: a
    circle closed by a late import still ties the rooms together)."""
    root = ENVS_DIR.parents[1]
    modules = {}
    for path in (root / "pettingllms_verl").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = _imports_of(path.read_text(), package)
        # "from a import b" is a.b where b is a module, else a
        graph[name] = {target if target in modules else target.rpartition(".")[0] for target in found} & modules.keys() - {name}
    return graph


def test_no_module_of_the_package_imports_one_that_imports_it_back():
    graph = _package_graph()
    assert graph["pettingllms_verl.programs.forks"] >= {"pettingllms_verl.programs.runner"}  # the graph is read
    circles = []
    for start in graph:  # a path from a module's import back to itself
        seen, frontier = set(), list(graph[start])
        while frontier:
            module = frontier.pop()
            if module == start:
                circles.append(start)
                break
            if module not in seen:
                seen.add(module)
                frontier.extend(graph[module])
    assert circles == [], f"modules in an import circle: {sorted(circles)}"


def test_loading_the_plugin_imports_no_environment_gateway_or_team_program_module():
    """What every verl process pays for the plugin: registration imports the trainer, which reads the
    rows' names from ``episodes.tags``, not the episode loop with its environments and gateway."""
    import subprocess
    import sys

    code = ("import sys, pettingllms_verl.plugin; print(sorted(m for m in sys.modules if m.startswith(("
            "'pettingllms_verl.envs', 'pettingllms_verl.programs', 'pettingllms_verl.rollout.agent_loop', 'pettingllms_verl.episodes.core'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


# The package's floors, lowest first: a room (a subpackage, or a top-level module) imports rooms of its
# own floor or lower ones only (docs/architecture.md). A new room goes on a floor here.
FLOORS = (
    {"__init__", "config", "algo", "compat", "placement", "memory", "targets", "files", "checkpoints", "artifacts", "lora_names", "recipes"},
    {"data", "sandbox"},
    {"envs"},
    {"episodes"},
    {"programs", "backends"},
    {"rollout"},
    {"trainer"},
    {"registration", "plugin", "preflight", "eval", "models", "data_prep", "config_reference"},
)


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_import_runs_down_the_floors():
    floor = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}
    graph = _package_graph()
    assert {_room(module) for module in graph} - floor.keys() == set(), "rooms on no floor: add them to FLOORS"
    assert "pettingllms_verl.episodes.core" in graph["pettingllms_verl.programs.episode"]  # the graph is read
    upward = sorted(f"{module} imports {target}" for module, targets in graph.items() for target in targets
                    if floor[_room(target)] > floor[_room(module)])
    assert upward == [], upward


def _imports_of_any(source: str) -> set[str]:
    """Every module ``source`` imports, anywhere in it (absolute names as written)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add(node.module or "")
    return found


def test_no_test_file_imports_another_and_no_harness_lives_in_the_package():
    tests = Path(__file__).parent
    for path in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert not name.split(".")[-1].startswith(("test_", "conftest")), f"{path.relative_to(tests)} imports {name}"
    assert not list((ENVS_DIR.parent / "trainer").glob("local_engine.py"))
    helpers = {path.stem for path in (tests / "support").glob("*.py")} - {"__init__"}
    for path in tests.rglob("test_*.py"):  # late imports too: a helper by its bare name is found nowhere
        bare = {name for name in _imports_of_any(path.read_text()) if name.split(".")[0] in helpers}
        assert not bare, f"{path.relative_to(tests)} imports {sorted(bare)}: import it from support"
    # loaded by their path in main_ppo's processes (or run as a script), where tests/ is not on the path
    for helper in ("faulty_env", "plan_path_frameworks", "team_programs", "normal_user"):
        source = (tests / "support" / f"{helper}.py").read_text()
        assert "from support" not in source and "import support" not in source, helper
