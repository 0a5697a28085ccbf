"""The repository speaks of the project alone: a measurement is named by its date, commit and machine,
never by the ordinal of the run or work period that produced it, and no text names the tools the
project was developed with. Checks every tracked text file."""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

ORDINALS = ("third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|"
            "sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\\d+(?:st|nd|rd|th)")
FORBIDDEN = {
    # "the sixth run", "the first reproduction": a run named by its place in the project's history
    "a run named by its ordinal": re.compile(rf"\b(?:{ORDINALS})\s+(?:run|reproduction|session|pilot|attempt|try)\b", re.I),
    "a reproduction named by its ordinal": re.compile(r"\b(?:first|second)\s+(?:reproduction|session)\b", re.I),
    "a work session": re.compile(r"\b(?:work(?:ing)?\s+)?sessions?\b", re.I),
    "a development tool": re.compile(r"\bsub-?agents?\b|\bclaude\b|\.\./\.library|\.\./shared\b", re.I),
    "an item of the issue tracker": re.compile(r"\bissues?\s+#?\d+\b", re.I),
}
PROSE = (".md",)  # "session" is also a word of code (pytest's, a process's): checked in prose only


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    files = []
    for name in names:
        path = REPO / name
        if path.suffix in {".parquet", ".png", ".safetensors", ".xz", ".gz"} or not path.is_file():
            continue
        try:
            files.append((path, path.read_text()))
        except UnicodeDecodeError:
            continue
    return files


def offences(name: str, text: str) -> list[str]:
    found = []
    for rule, pattern in FORBIDDEN.items():
        if rule == "a work session" and not name.endswith(PROSE):
            continue
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{name}:{line}: {rule}: {match.group(0)!r}")
    return found


def test_the_repository_names_measurements_by_date_commit_and_machine():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout (an installed wheel): nothing to list")
    found = [o for path, text in tracked_text_files() if path.name != "test_wording.py"
             for o in offences(str(path.relative_to(REPO)), text)]
    assert not found, "wording that refers to how the work was organised, not to the project:\n" + "\n".join(found)


# the forbidden words are split here, so that this file itself says none of them
@pytest.mark.parametrize("text", ["as in the sixth run above", "the first reproduction's warm start", "Third run: two launches",
                                  "measured in the 14th " + "ses" "sion", "a work " + "ses" "sion", "see is" "sue 34",
                                  "../" + "sha" "red/notes.md"])
def test_the_check_catches(text):
    assert offences("README.md", text)


@pytest.mark.parametrize("text", ["the first run also converts the real model", "a second run resumes", "the third column",
                                  "os.setsid()  # own session"])
def test_the_check_lets_the_project_speak(text):
    assert not offences("code.py" if "setsid" in text else "README.md", text)
