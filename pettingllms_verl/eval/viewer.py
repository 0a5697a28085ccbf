"""A static HTML page of episodes: ``python -m pettingllms_verl.eval.viewer LOG... --out page.html``.

LOG is an evaluation's ``episodes.jsonl`` or an ``episode_log_dir`` (its ``episodes-*.jsonl``).
Each episode shows its turns as rows and its roles as columns (the coder's program beside the
tester's tests, the tool agent's output beside the reasoner's answer), every tree node with its K
branches (the chosen one marked, each with its reward and parse result), and the state drawn
after each reply: grids for Plan-Path, Sokoban, Sudoku and Tic-Tac-Toe, both hands and the
fireworks for Hanabi, and the image a role was shown (a role that sees). Model text is untrusted:
everything from a log is HTML-escaped, an image is shown only as a PNG data URI of base64, and the page
runs no script.
"""

from __future__ import annotations

import argparse
import glob
import html
import json
import os
import sys
from collections import Counter, defaultdict

from pettingllms_verl.envs.images import PNG_DATA_URI
from pettingllms_verl.eval.results import LogError, read_jsonl, sampled

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
.episode{border:1px solid #bbb;border-radius:6px;margin:1.5em 0;padding:.5em 1em}
.ok{color:#1a7f37}.fail{color:#c62828}
table.turns{border-collapse:collapse;width:100%}table.turns td,table.turns th{border-top:1px solid #ddd;vertical-align:top;padding:.4em}
.branches{display:flex;flex-wrap:wrap;gap:.4em}
.branch{border:1px solid #ccc;border-radius:4px;padding:.3em;max-width:36em;font-size:.85em}
.branch.chosen{border:2px solid #1565c0;background:#f3f8ff}
pre{white-space:pre-wrap;word-break:break-word;margin:.2em 0;background:#f6f6f6;padding:.3em}
table.grid{border-collapse:collapse;margin:.3em 0}table.grid td{width:1.3em;height:1.3em;text-align:center;border:1px solid #999;font-family:monospace}
td.wall{background:#444;color:#fff}td.goal{background:#ffe082}td.me{background:#64b5f6}td.box{background:#a1887f}td.target{background:#c8e6c9}
td.given{font-weight:bold}
img.seen{image-rendering:pixelated;width:8em;border:1px solid #999;display:block;margin:.2em 0}
.card{display:inline-block;border:1px solid #555;border-radius:3px;padding:0 .3em;margin:1px;font-family:monospace}
"""
CARD_COLOURS = {"R": "#ef9a9a", "Y": "#fff59d", "G": "#a5d6a7", "W": "#eeeeee", "B": "#90caf9"}


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def shown_images(sample: dict) -> str:
    """The images a prompt held, as <img> tags: PNG data URIs of base64 only (anything else in the
    log, a script URL say, is left out)."""
    tags = []
    for uri in sample.get("images") or ():
        body = uri[len(PNG_DATA_URI):] if isinstance(uri, str) and uri.startswith(PNG_DATA_URI) else None
        if body is not None and body and all(c.isalnum() or c in "+/=" for c in body):
            tags.append(f'<img class="seen" alt="the image this role was shown" src="{esc(uri)}">')
    return "".join(tags)


def load(paths: list[str]) -> list[dict]:
    """Episode records of files and episode-log folders, in the order given."""
    records = []
    for path in paths:
        if os.path.isdir(path):
            files = sorted(glob.glob(os.path.join(path, "episodes-*.jsonl")))
            if not files:
                raise LogError(f"{path}: no episodes-*.jsonl files in this folder")
            records += [r for f in files for r in read_jsonl(f)]
        elif os.path.isfile(path):
            records += read_jsonl(path)
        else:
            raise LogError(f"{path}: no such file or folder (an evaluation's episodes.jsonl or a pettingllms.paths.episode_log_dir)")
    return records


def grid(rows: list[list[str]], classes: list[list[str]]) -> str:
    body = "".join("<tr>" + "".join(f'<td class="{c}">{esc(v)}</td>' for v, c in zip(row, cls)) + "</tr>" for row, cls in zip(rows, classes))
    return f'<table class="grid">{body}</table>'


def draw_state(env: str, state: dict | None) -> str:
    """The state as HTML (a grid, hands); "" when the environment has nothing to draw."""
    if not isinstance(state, dict) or not state:
        return ""
    try:
        if env == "plan_path":
            rows = [list(row) for row in state["grid"]]
            classes = [["wall" if v == "#" else "" for v in row] for row in rows]
            (r, c), (gr, gc) = state["pos"], state["goal"]
            rows[gr][gc], classes[gr][gc] = "G", "goal"
            rows[r][c], classes[r][c] = "@", "me"
            return grid(rows, classes)
        if env == "sokoban":
            kinds = {"#": "wall", "@": "me", "+": "me", "$": "box", "*": "box", ".": "target"}
            rows = [list(row) for row in state["room"]]
            return grid(rows, [[kinds.get(v, "") for v in row] for row in rows])
        if env == "sudoku":
            given = state.get("puzzle") or [[0] * len(row) for row in state["grid"]]
            rows = [[v or "" for v in row] for row in state["grid"]]
            return grid(rows, [["given" if g else "" for g in row] for row in given])
        if env == "tictactoe":
            board = list(state["board"])
            return grid([board[i:i + 3] for i in (0, 3, 6)], [[""] * 3] * 3) + (f"<div>outcome: {esc(state['outcome'])}</div>" if state.get("outcome") else "")
        if env == "hanabi":
            hands = "".join(f"<div>{esc(role)}: {cards(hand)}</div>" for role, hand in state["hands"].items())
            fireworks = " ".join(f"{esc(colour)}{esc(rank)}" for colour, rank in state["fireworks"].items())
            return (f"{hands}<div>fireworks {fireworks} · score {esc(state.get('score'))} · info {esc(state.get('info_tokens'))} "
                    f"· fuses {esc(state.get('fuses'))}</div>")
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        pass  # a state of another shape (an older log): shown as data below
    return f"<pre>{esc(json.dumps(state, ensure_ascii=False))}</pre>"


def cards(hand: list) -> str:
    return "".join(f'<span class="card" style="background:{CARD_COLOURS.get(str(card)[:1], "#fff")}">{esc(card)}</span>' for card in hand)


def branch_card(env: str, sample: dict) -> str:
    chosen = sample.get("chosen")
    mark = "★ chosen" if chosen else "branch"
    parse = "" if sample.get("parse_ok", True) else ' · <span class="fail">unparsed</span>'
    info = {k: v for k, v in (sample.get("info") or {}).items() if k != "sandbox_runs"}
    return (
        f'<div class="branch{" chosen" if chosen else ""}" data-branch="{esc(sample.get("branch"))}">'
        f'<b>{mark} {esc(sample.get("branch"))}</b> · reward {float(sample.get("reward", 0)):.3f} '
        f'(role {float(sample.get("local_reward", 0)):.3f}, team {float(sample.get("global_reward", 0)):.3f}){parse}'
        f'<pre class="reply">{esc(sample.get("reply", ""))}</pre>'
        + (f'<pre class="info">{esc(json.dumps(info, ensure_ascii=False))}</pre>' if info else "")
        + draw_state(env, sample.get("state"))
        + "</div>"
    )


def problem_key(record: dict) -> tuple:
    """The episodes that are samples of one problem: same run, same pass (swapped or not), same environment and seed."""
    return record.get("run"), bool(record.get("swapped")), str(record.get("env")), record.get("seed")


def evaluated(record: dict) -> bool:
    """An evaluation's episode (``pettingllms-eval``'s episodes.jsonl names its run): not a training
    log's, whose episodes of one seed are a step's rollout.n samples and later steps' again."""
    return bool(record.get("validate")) and record.get("run") is not None


def sample_notes(records: list[dict]) -> tuple[list[str], str]:
    """Where a problem was played several times (``pettingllms-eval --samples``): per episode, which of
    its problem's samples it is and how many of them were solved; and the page's line of avg@n and
    pass@k (``results.sampled``, per run and pass). Empty where every problem was played once."""
    by_problem: dict[tuple, list[dict]] = defaultdict(list)
    for record in filter(evaluated, records):
        by_problem[problem_key(record)].append(record)
    if all(len(group) == 1 for group in by_problem.values()):
        return [""] * len(records), ""
    solved = {key: sum(bool(r.get("success")) for r in group) for key, group in by_problem.items()}
    notes, seen = [], Counter()
    for record in records:
        if not evaluated(record):
            notes.append("")
            continue
        key = problem_key(record)
        seen[key] += 1
        notes.append(f" · sample {seen[key]} of {len(by_problem[key])} of this problem, {solved[key]} solved")
    passes: dict[tuple, list[dict]] = defaultdict(list)
    for record in filter(evaluated, records):
        passes[(record.get("run"), bool(record.get("swapped")))].append(record)
    lines = []
    for (run, swapped), part in passes.items():
        n = max(len(by_problem[problem_key(r)]) for r in part)
        got = sampled(part, sorted({1, n}))
        estimates = ", ".join(f"pass@{k} {v['value']:.3f}" for k, v in got["pass"].items() if v["value"] is not None)
        lines.append(f"{esc(run or 'episodes')}{' swapped' if swapped else ''}: {got['problems']} problems, "
                     f"{got['samples']} samples each, avg@{got['samples']} {got['avg']:.3f}, {estimates}")
    return notes, "<ul>" + "".join(f"<li>{line}</li>" for line in lines) + "</ul>"


def episode_html(index: int, record: dict, note: str = "") -> str:
    env = str(record.get("env"))
    samples = [s for s in record.get("samples", []) if not s.get("placeholder")]
    roles = list(dict.fromkeys(s["role"] for s in samples))
    nodes: dict[tuple, list[dict]] = defaultdict(list)  # (turn, role) -> the branches of its node
    for sample in samples:
        nodes[(sample["turn"], sample["role"])].append(sample)
    turns = sorted({turn for turn, _ in nodes})
    success = bool(record.get("success"))
    title = (f'{esc(env)} · seed {esc(record.get("seed"))} · <span class="{"ok" if success else "fail"}">'
             f'{"solved" if success else "not solved"}</span>'
             + (f' · ended by {esc(record["end_cause"])}' if record.get("end_cause") else "")
             + (f' · run {esc(record["run"])}' if record.get("run") else "")
             + (" · swapped policies" if record.get("swapped") else "") + esc(note))
    policies = record.get("policies") or {}
    models = record.get("models") or {}
    mixed = len(set(models.values())) > 1  # a team of several model families: each role's tokenizer shown beside its policy

    def role_header(role: str) -> str:
        label = esc(role)
        if role in policies:
            model = f" · {esc(os.path.basename(models[role].rstrip('/')))}" if mixed and role in models else ""
            label += f" ({esc(policies[role])}{model})"
        return f"<th>{label}</th>"

    header = "".join(role_header(role) for role in roles)
    rows = []
    for turn in turns:
        cells = []
        for role in roles:
            branches = sorted(nodes.get((turn, role), []), key=lambda s: s.get("branch", 0))
            prompt = branches[0].get("prompt", "") if branches else ""
            cells.append(
                "<td>" + (shown_images(branches[0]) if branches else "")
                + (f'<details><summary>prompt</summary><pre class="prompt">{esc(prompt)}</pre></details>' if prompt else "")
                + f'<div class="branches">{"".join(branch_card(env, s) for s in branches)}</div></td>'
            )
        rows.append(f'<tr><th>turn {turn}</th>{"".join(cells)}</tr>')
    start = draw_state(env, record.get("start"))
    return (
        f'<section class="episode" id="episode-{index}" data-env="{esc(env)}"><h2>{title}</h2>'
        + (f"<div>start:{start}</div>" if start else "")
        + f'<table class="turns"><tr><th></th>{header}</tr>{"".join(rows)}</table></section>'
    )


def page(records: list[dict], title: str = "Episodes", limit: int | None = None) -> str:
    """The page of the first ``limit`` episodes; the samples' counts and pass@k are of them all."""
    notes, summary = sample_notes(records)
    records, notes = records[:limit], notes[:limit]
    body = "".join(episode_html(i, r, note) for i, (r, note) in enumerate(zip(records, notes)))
    solved = sum(bool(r.get("success")) for r in records)
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{esc(title)}</title><style>{CSS}</style></head>'
        f"<body><h1>{esc(title)}</h1><p>{len(records)} episodes, {solved} solved. Each turn shows every branch of its "
        f"tree node; ★ marks the branch the episode continued from.</p>{summary}{body}</body></html>"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", metavar="LOG", help="episodes.jsonl or an episode_log_dir")
    parser.add_argument("--out", default="episodes.html", help="the page to write (default episodes.html)")
    parser.add_argument("--limit", type=int, default=200, help="at most this many episodes (default 200)")
    parser.add_argument("--env", help="only episodes of this environment")
    args = parser.parse_args(argv)
    try:
        records = load(args.logs)
    except LogError as error:
        print(f"viewer: {error}", file=sys.stderr)
        return 2
    if args.env:
        records = [r for r in records if r.get("env") == args.env]
        if not records:
            print(f"viewer: no {args.env} episodes in {', '.join(args.logs)}", file=sys.stderr)
            return 2
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(page(records, limit=args.limit))
    print(f"wrote {args.out} ({min(len(records), args.limit)} episodes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
