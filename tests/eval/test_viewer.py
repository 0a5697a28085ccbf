"""The HTML episode viewer, loaded in a real headless Chromium (Debian's package, installed here
when absent): the grids, hands, tree branches and role columns are in the page the browser built,
hostile model text is shown as text, and a screenshot is kept (``test-artifacts/viewer.png``)."""

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pettingllms_verl import envs
from pettingllms_verl.eval import viewer
from pettingllms_verl.eval.results import LogError

from support import REPO

HOSTILE = '<script>alert("pwned")</script><img src=x onerror=alert(1)>'
ARTIFACTS = REPO / "test-artifacts"
GAMES = {"plan_path": "R", "sokoban": "<answer>D</answer>", "sudoku": "<answer>(0,0,1)</answer>", "tictactoe": "4", "hanabi": "play 0"}


def played(name: str, k: int = 2) -> dict:
    """An episode record of one turn of ``name``'s MAS workflow: K branches per node (the first
    replies hostile text), the best continued, each branch's state after its reply."""
    env = envs.make(name)
    env.reset(seed=1)
    record = {"env": name, "seed": 1, "success": False, "validate": True, "turns": 1, "start": env.snapshot(), "samples": [],
              "policies": {role: f"{role}_policy" for role in env.roles}, "run": "viewer-test"}
    for role in env.workflow("mas").turn_order:
        if env.done:
            break
        branches = []
        for branch in range(k):
            clone = env.clone()
            reply = HOSTILE if branch == 0 else GAMES[name]
            result = clone.step(role, reply)
            branches.append((clone, {"turn": 0, "role": role, "node": "", "branch": branch, "chosen": False, "parse_ok": result.parse_ok,
                                     "local_reward": result.local_reward, "global_reward": clone.global_reward,
                                     "reward": result.local_reward + clone.global_reward, "prompt": "the prompt", "reply": reply,
                                     "info": result.info, "state": clone.snapshot()}))
        best = max(range(k), key=lambda i: branches[i][1]["reward"])
        branches[best][1]["chosen"] = True
        record["samples"] += [sample for _, sample in branches]
        env = branches[best][0]
    return record


def text_episode(name: str, roles: tuple[str, str]) -> dict:
    samples = [{"turn": 0, "role": role, "node": "", "branch": 0, "chosen": True, "parse_ok": True, "local_reward": 0.5,
                "global_reward": 0.0, "reward": 0.5, "prompt": "p", "reply": f"{role} says {HOSTILE}", "info": {"passed": 1}, "state": {}}
               for role in roles]
    return {"env": name, "seed": 7, "success": True, "turns": 1, "samples": samples, "start": {}}


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's Chromium, installed with apt-get when absent (needs root and Debian's mirror)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    assert os.geteuid() == 0, "Chromium is absent and installing it needs root: apt-get install chromium"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]
    if subprocess.run(install, timeout=900, env=env, capture_output=True).returncode != 0:  # stale package lists: refresh once
        subprocess.run(["apt-get", "update", "-q"], check=True, timeout=600, env=env, capture_output=True)
        subprocess.run(install, check=True, timeout=900, env=env, capture_output=True)
    return shutil.which("chromium")


class Dom(HTMLParser):
    """Elements (tag, class list, attributes) and the text of each ``pre.reply``, as Chromium serialised them."""

    def __init__(self, text: str):
        super().__init__()
        self.elements: list[tuple[str, list[str], dict]] = []
        self.replies: list[str] = []
        self._in_reply = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, (attrs.get("class") or "").split(), attrs))
        self._in_reply = tag == "pre" and "reply" in (attrs.get("class") or "")
        if self._in_reply:
            self.replies.append("")

    def handle_endtag(self, tag):
        if tag == "pre":
            self._in_reply = False

    def handle_data(self, data):
        if self._in_reply:
            self.replies[-1] += data

    def find(self, tag: str, cls: str | None = None) -> list[dict]:
        return [attrs for t, classes, attrs in self.elements if t == tag and (cls is None or cls in classes)]


def browse(chromium: str, page: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *flags, page.as_uri()],
                          capture_output=True, text=True, timeout=180)


def test_viewer_page_in_a_real_browser(chromium, tmp_path):
    records = [played(name) for name in GAMES] + [text_episode("code", ("coder", "tester")), text_episode("math", ("tool", "reasoner"))]
    log = tmp_path / "episodes.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    page = tmp_path / "episodes.html"
    assert viewer.main([str(log), "--out", str(page)]) == 0

    dom = browse(chromium, page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = Dom(dom.stdout)
    sections = parsed.find("section", "episode")
    assert [s["data-env"] for s in sections] == list(GAMES) + ["code", "math"]
    # hostile text stayed text: no script or img element exists, the reply reads as written
    assert not parsed.find("script") and not parsed.find("img")
    assert sum(HOSTILE in reply for reply in parsed.replies) == len(GAMES) * 2 + 4  # branch 0 of every game node, every text reply
    # the tree: every node's branches, one chosen per node
    nodes = sum(len({(s["turn"], s["role"]) for s in r["samples"]}) for r in records)
    assert len(parsed.find("div", "chosen")) == nodes
    assert len(parsed.find("div", "branch")) == sum(len(r["samples"]) for r in records)
    # drawings: plan-path (goal and @), sokoban (box), sudoku (givens), tic-tac-toe (3x3), hanabi (both hands)
    assert len(parsed.find("td", "goal")) >= 1 and len(parsed.find("td", "me")) >= 1 and len(parsed.find("td", "box")) >= 1
    assert len(parsed.find("td", "given")) >= 1
    hand = envs.make("hanabi")
    hand.reset(seed=1)
    cards_per_state = sum(len(h) for h in hand.snapshot()["hands"].values())
    assert len(parsed.find("span", "card")) >= cards_per_state * 2  # at least the two branches' states
    # roles side by side: code's coder and tester in one row
    assert dom.stdout.count("<th>coder</th>") == 1 and dom.stdout.count("<th>tester</th>") == 1

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "viewer.png"
    shot.unlink(missing_ok=True)
    result = browse(chromium, page, f"--screenshot={shot}", "--window-size=1400,2400")
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    assert image.size == (1400, 2400) and len(image.getcolors(maxcolors=1 << 20)) > 50  # drawn, not blank


def test_state_drawings_and_escaping_without_a_browser():
    for name in GAMES:
        record = played(name)
        html_text = viewer.episode_html(0, record)
        assert "<script>" not in html_text and "&lt;script&gt;" in html_text
        assert '<table class="grid">' in html_text or 'class="card"' in html_text
    odd = viewer.draw_state("plan_path", {"grid": 3, "note": "<b>"})  # an unexpected shape: shown as escaped data
    assert odd.startswith("<pre>") and "&lt;b&gt;" in odd
    hands = viewer.draw_state("hanabi", {"hands": ["<b>"], "fireworks": {}})  # a list where a mapping was: data, not a failed page
    assert hands.startswith("<pre>") and "&lt;b&gt;" in hands


def test_the_image_a_role_was_shown_is_embedded_and_nothing_else_passes_for_one():
    from pettingllms_verl import envs
    from pettingllms_verl.envs.images import data_uri, message_images

    env = envs.make("plan_path", size=6, image_roles=["plan"])
    env.reset(seed=0)
    uri = data_uri(message_images(env.observation("plan"))[0])
    sample = {"turn": 0, "role": "plan", "branch": 0, "chosen": True, "reply": "R", "prompt": "p",
              "images": [uri, 'javascript:alert(1)', 'data:image/png;base64,AAAA" onerror="alert(1)', 7]}
    html_text = viewer.episode_html(0, {"env": "plan_path", "seed": 0, "samples": [sample]})
    assert html_text.count("<img ") == 1 and f'src="{uri}"' in html_text  # the real image, and only it
    assert "javascript" not in html_text and "onerror" not in html_text


def test_viewer_refuses_missing_and_empty_logs(tmp_path, capsys):
    assert viewer.main([str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "x.html")]) == 2
    assert "nope.jsonl: no such file or folder" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    assert viewer.main([str(tmp_path / "empty.jsonl"), "--out", str(tmp_path / "x.html")]) == 2
    assert "empty.jsonl: no records" in capsys.readouterr().err
    with pytest.raises(LogError, match="no episodes-"):
        viewer.load([str(tmp_path)])


def test_samples_of_one_problem_are_counted_on_each_episode_and_their_pass_at_k_heads_the_page():
    """``pettingllms-eval --samples 3``: each episode says which sample of its problem it is, and the page
    gives avg@n and pass@k per run, over every episode even where ``--limit`` shows fewer."""
    records = [{"env": "plan_path", "seed": seed, "success": won, "run": "l2", "validate": True, "samples": []}
               for seed, wins in ((1, (True, False, False)), (2, (False, False, False))) for won in wins]
    text = viewer.page(records, limit=5)
    assert text.count('class="episode"') == 5 and "sample 2 of 3 of this problem, 1 solved" in text
    assert [text.count(f"sample {i} of 3 of this problem, 0 solved") for i in (1, 2, 3)] == [1, 1, 0]  # alike records numbered apart
    assert "l2: 2 problems, 3 samples each, avg@3 0.167, pass@1 0.167, pass@3 0.500" in text
    assert "samples each" not in viewer.page(records[::3])  # one episode per problem: nothing to count
    training = [{k: v for k, v in r.items() if k != "run"} for r in records]  # a training log: a step's rollout.n samples
    assert "samples each" not in viewer.page(training) and "of this problem" not in viewer.page(training)


def test_a_team_of_two_model_families_shows_each_roles_model_beside_its_policy():
    record = played("plan_path")
    record["models"] = {"tool": "/models/tiny_model/", "plan": "/models/tiny_model_bracket"}
    page = viewer.episode_html(0, record)
    assert "tool (tool_policy · tiny_model)" in page and "plan (plan_policy · tiny_model_bracket)" in page
    record["models"] = {"tool": "/models/tiny_model", "plan": "/models/tiny_model"}  # one family: the policy alone
    assert "tool (tool_policy)" in viewer.episode_html(0, record)
