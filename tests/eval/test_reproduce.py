"""The reproduction's pieces: noisy demonstrations, the warm start through verl's SFT trainer, the
driver's arguments, resume bookkeeping and its table."""

import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from pettingllms_verl import envs
from pettingllms_verl.eval import evaluate, plots, stats
from pettingllms_verl.eval import runs as eval_runs
from pettingllms_verl.eval.reproduce import aggregation, cli, evaluation, fingerprints, methods, report, training
from pettingllms_verl.models.demos import BFS_PROGRAM, NAIVE_PROGRAM, plan_path_demos, shortest_path

from support import REPO


ENV = {"size": 5, "wall_density": 0.3, "max_turns": 2}


def _tool_result(program: str, seed: int):
    env = envs.make("plan_path", **ENV)
    env.reset(seed=seed)
    return env.step("tool", f"```python\n{program}\n```")


def test_bfs_program_solves_every_grid_and_the_naive_one_not():
    bfs = [_tool_result(BFS_PROGRAM, seed).info.get("would_solve") for seed in range(20)]
    naive = [_tool_result(NAIVE_PROGRAM, seed).info.get("would_solve") for seed in range(20)]
    assert all(bfs)
    assert 0 < sum(naive) < 20  # right only where no wall is in the way


def test_shortest_path_is_shortest():
    env = envs.make("plan_path", **ENV)
    for seed in range(20):
        env.reset(seed=seed)
        moves = shortest_path(env.view())
        assert len(moves) == env._optimal_len
        env.step("plan", f"<answer>{' '.join(moves)}</answer>")
        assert env.success


def test_demonstrations_are_right_as_often_as_asked():
    right = {"tool": 0.0, "copy": 1.0, "plan": 1.0}
    rows = plan_path_demos(40, right, seed=1, env_kwargs=ENV)
    kinds = {"tool": 0, "copy": 0, "plan": 0}
    for row in rows:
        system, user, reply = (m["content"] for m in row["messages"])
        assert row["messages"][2]["role"] == "assistant"
        assert row["role"] == ("tool" if "You are the tool agent" in system else "plan")
        if "You are the tool agent" in system:
            kinds["tool"] += 1
            assert NAIVE_PROGRAM in reply  # p = 0: always the wrong program
        elif "Its output:" in user:
            kinds["copy"] += 1
            output = user.rsplit("Its output:\n", 1)[1].strip()
            assert output.startswith("<answer>") and output.endswith("</answer>")  # printed in the answer's format
            assert reply == output  # so the copy is that line, verbatim
        else:
            kinds["plan"] += 1
            assert reply.startswith("<answer>")
    assert all(kinds.values()), kinds  # SA and MAS episodes both played
    # mixed: the share of right tool programs follows p
    rows = plan_path_demos(200, {"tool": 0.3, "copy": 0.5, "plan": 0.3}, seed=2, env_kwargs=ENV)
    tools = [r["messages"][2]["content"] for r in rows if "You are the tool agent" in r["messages"][0]["content"]]
    share = sum(BFS_PROGRAM in t for t in tools) / len(tools)
    assert 0.2 < share < 0.4
    # team episodes alone (the warm start's second stage): every plan reply has a tool output to copy
    rows = plan_path_demos(10, right, seed=1, env_kwargs=ENV, workflows=("mas",))
    plans = [r for r in rows if "You are the tool agent" not in r["messages"][0]["content"]]
    assert len(plans) >= 10 and all("Its output:" in r["messages"][1]["content"] for r in plans)


@pytest.mark.slow
def test_warm_start_runs_verls_sft_trainer_and_writes_a_model(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from pettingllms_verl.models import sft

    out = str(tmp_path / "warm")
    command = [sys.executable, "-m", "pettingllms_verl.models.sft", "--base", tiny_model_dir, "--out", out,
               "--episodes", "4", "--steps", "2", "--batch-size", "4", "--env-kwargs", json.dumps(ENV)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step:2 - " in result.stdout + result.stderr and "train/loss:" in result.stdout + result.stderr  # verl's own trainer logged its steps
    meta = json.load(open(os.path.join(out, "warm_start.json")))
    assert meta["steps"] == 2 and meta["p_correct"] == sft.DEFAULT_P_CORRECT and len(meta["demonstrations_sha256"]) == 64
    assert not os.path.exists(out + ".sft-work") and not os.path.exists(out + ".tmp")
    import torch

    assert json.load(open(os.path.join(out, "config.json")))["dtype"] == "float32"  # as its weights are
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    warm = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    changed = [n for (n, a), (_, b) in zip(base.named_parameters(), warm.named_parameters()) if not torch.equal(a, b)]
    assert changed  # two optimizer steps moved the weights
    # an existing model is kept, never retrained
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "kept" in again.stderr
    # a second stage on it: a LoRA adapter trained on the plan agent's team replies alone, exported as a peft folder
    adapter = str(tmp_path / "plan_adapter")
    lora = [sys.executable, "-m", "pettingllms_verl.models.sft", "--base", out, "--out", adapter, "--episodes", "4", "--steps", "2",
            "--batch-size", "2", "--workflows", "mas", "--roles", "plan", "--lora-rank", "4", "--lora-alpha", "8", "--lr", "1e-2",
            "--env-kwargs", json.dumps(ENV)]
    result = subprocess.run(lora, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.load(open(os.path.join(adapter, "warm_start.json")))
    assert record["base_warm_start"] == meta and record["roles"] == ["plan"] and record["lora_rank"] == 4
    assert 4 <= record["demonstrations"] <= 4 * ENV["max_turns"]  # one plan reply per turn played of each team episode
    from peft import PeftModel

    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32), adapter)
    assert tuned.peft_config["default"].r == 4 and tuned.peft_config["default"].lora_alpha == 8
    lora_b = [p for n, p in tuned.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)  # trained: lora_B starts at zero


def test_a_warm_start_built_on_another_records_the_base_record(tmp_path):
    from pettingllms_verl.models import sft

    rows = plan_path_demos(4, sft.DEFAULT_P_CORRECT, env_kwargs=ENV)
    first = sft.record(str(tmp_path), rows, steps=1200)
    assert first["base_warm_start"] is None and first["steps"] == 1200 and first["demonstrations"] == len(rows)
    (tmp_path / "warm_start.json").write_text(json.dumps(first))
    second = sft.record(str(tmp_path), rows, steps=600)
    assert second["base_warm_start"] == first  # the first stage changed -> the second's record changes
    assert sft.record(str(tmp_path), rows[1:], steps=600)["demonstrations_sha256"] != second["demonstrations_sha256"]


def test_warm_start_names_a_missing_base(tmp_path):
    from pettingllms_verl.models import sft

    with pytest.raises(SystemExit, match="--base .*no model there"):
        sft.warm_start(str(tmp_path / "none"), str(tmp_path / "out"))


@pytest.mark.parametrize("argv", [["--primary", "per_role-control"], ["--primary", "per_role-ppo@final"], ["--primary", "per_role-control@confirm"],
                                  ["--methods", "sa,bogus"], ["--seeds", "a,b"], ["--seeds", "0,0"], ["--methods", "sa,sa"],
                                  ["--episodes", "0"], ["--steps", "0"], ["--jobs", "0"], ["--splits", "test,val"], ["--splits", "test,test"]])
def test_bad_arguments_stop_before_anything_runs(argv, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(argv)
    assert argv[0] in capsys.readouterr().err


def test_good_arguments_are_read():
    args = cli.parse_args(["--methods", "sa,mas", "--seeds", "3,4"])
    assert args.methods == ["sa", "mas"] and args.seeds == [3, 4] and args.primary is None  # its arms not asked for: no primary claim
    default = cli.parse_args([])  # `make reproduce`: five methods with the control, five seeds, the claim on the final split
    assert default.methods == [*methods.TINY] and "control" in default.methods and default.seeds == [0, 1, 2, 3, 4]
    assert default.splits == ["test", "final"] and default.primary == methods.PRIMARY
    with pytest.raises(SystemExit):
        cli.parse_args(["--primary", "mas-mas@test", "--splits", "test"])
    named = cli.parse_args(["--primary", "mas-sa@test", "--splits", "test"])
    assert (named.primary["a"], named.primary["b"], named.primary["split"]) == ("mas", "sa", "test")


def test_training_runs_go_jobs_at_once_and_a_failed_one_is_reported_while_the_others_go_on(tmp_path, monkeypatch, capsys):
    import subprocess
    import threading

    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.setattr(eval_runs, "usable_cores", lambda: 4)
    trained, threads = [], set()
    two_running = threading.Barrier(2, timeout=60)  # broken (and the test failed) unless two runs train at the same time

    def main_ppo(command, **kwargs):  # stands in for main_ppo: the runs themselves go through training.train
        label = next(arg for arg in command if arg.startswith("trainer.experiment_name=")).split("=repro_")[1]
        trained.append(label)
        threads.update(arg.split("=", 1)[1] for arg in command if "OMP_NUM_THREADS" in arg or "torch_threads" in arg)
        if label in ("sa_s0", "sa_s1"):  # the first two of the three
            two_running.wait()
        return subprocess.CompletedProcess(command, 1 if label == "sa_s9" else 0)

    monkeypatch.setattr(subprocess, "run", main_ppo)
    args = cli.parse_args(["--methods", "sa", "--seeds", "0,1,2", "--jobs", "2", "--out", str(tmp_path / "out")])
    training.train_all(40, args, tmp_path / "out", {"sa": fingerprints.warm_start(args, "sa")}, {"sa": fingerprints.training_settings("sa", args)})
    assert sorted(trained) == ["sa_s0", "sa_s1", "sa_s2"]
    assert capsys.readouterr().out.count("] done in") == 3
    assert threads == {'"2"', "2"}  # the trainer's and the rollout server's threads: 4 cores shared by 2 runs at once
    trained.clear()
    threads.clear()
    failing = cli.parse_args(["--methods", "sa", "--seeds", "9,8", "--jobs", "1", "--out", str(tmp_path / "out")])
    failed = training.train_all(40, failing, tmp_path / "out", {"sa": fingerprints.warm_start(failing, "sa")},
                                 {"sa": fingerprints.training_settings("sa", failing)})
    assert list(failed) == ["sa_s9"] and "training sa_s9 failed (exit 1)" in failed["sa_s9"]
    assert trained == ["sa_s9", "sa_s8"]  # the run after the failed one still trained
    assert "[train sa_s9] FAILED" in capsys.readouterr().out
    assert threads == {'"4"', "4"}  # one run at a time: all 4 cores
    named = cli.parse_args(["--jobs", "1", "--set", '++ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS="1"'])
    assert training.run_threads(named) == ["++actor_rollout_ref.rollout.engine_kwargs.hf.torch_threads=4"]  # the one --set names is its


def test_finished_steps_reads_verls_last_file(tmp_path):
    assert training.finished_steps(tmp_path) == 0
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("30\n")
    assert training.finished_steps(tmp_path) == 30


def saved_run(out: Path, label: str, steps: int, **records) -> Path:
    """A finished run's checkpoint folder: the tracker of ``steps`` and the given records (name -> value)."""
    run_dir = out / "checkpoints" / label
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "latest_checkpointed_iteration.txt").write_text(str(steps))
    for name, value in records.items():
        (run_dir / f"{name}.json").write_text(json.dumps(value))
    return run_dir


def stand_in_main_ppo(monkeypatch, launched: list):
    """main_ppo replaced: records the run it was asked for and saves its last step."""
    def main_ppo(command, **kwargs):
        launched.append(next(a for a in command if a.startswith("trainer.experiment_name=")).split("=repro_")[1])
        checkpoints = Path(next(a for a in command if a.startswith("trainer.default_local_dir=")).split("=", 1)[1])
        steps = next(a for a in command if a.startswith("trainer.total_training_steps=")).split("=")[1]
        (checkpoints / "latest_checkpointed_iteration.txt").write_text(steps)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", main_ppo)


def test_a_finished_run_is_kept_only_as_it_was_made_else_trained_again_with_the_reason_and_the_old_one_kept_aside(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    model = tmp_path / "artifacts" / "tiny_model_plan_path_team"
    model.mkdir(parents=True)
    (model / "warm_start.json").write_text('{"demonstrations_sha256": "a"}')
    args = cli.parse_args(["--out", str(tmp_path / "out")])
    out, launched = tmp_path / "out", []
    stand_in_main_ppo(monkeypatch, launched)
    warm = lambda: fingerprints.warm_start(args, "mas")  # noqa: E731  (read again: the model may change)
    made_alike = {"warm_start": warm(), "settings": fingerprints.training_settings("mas", args), "source": fingerprints.source_hash()}
    run_dir = saved_run(out, "mas_s0", 60, **made_alike)
    training.train("mas", 0, 60, args, out, warm())  # nothing to do: no main_ppo started
    assert "finished earlier" in capsys.readouterr().out and launched == []
    with pytest.raises(methods.ReproduceError, match="more than --steps 30"):
        training.train("mas", 0, 30, args, out, warm())
    (model / "warm_start.json").write_text('{"demonstrations_sha256": "b"}')  # the demonstrations changed
    training.train("mas", 0, 60, args, out, warm())
    said = capsys.readouterr().out
    assert "[train mas_s0] trained again from the start: it was trained from another warm start than it has now" in said
    assert launched == ["mas_s0"] and (out / "checkpoints" / "mas_s0.replaced" / "latest_checkpointed_iteration.txt").is_file()
    assert json.loads((run_dir / "warm_start.json").read_text()) == warm()  # the new run records what made it
    launched.clear()
    (run_dir / "source.json").write_text(json.dumps("0" * 64))  # as if trained by other code
    training.train("mas", 0, 60, args, out, warm())
    assert f"the package's source changed (sha256 000000000000 -> {fingerprints.source_hash()[:12]})" in capsys.readouterr().out
    assert launched == ["mas_s0"]
    launched.clear()
    (run_dir / "source.json").unlink()  # a run saved before runs recorded their code: it cannot say, so it is not kept
    training.train("mas", 0, 60, args, out, warm())
    assert "it does not record its source (source.json)" in capsys.readouterr().out and launched == ["mas_s0"]


def test_a_run_saved_with_other_training_settings_is_trained_again_and_said_before_anything_runs_but_how_it_validates_may_change(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    out, launched = tmp_path / "out", []
    stand_in_main_ppo(monkeypatch, launched)
    args = lambda *sets: cli.parse_args(["--methods", "mas", "--seeds", "0", "--out", str(out), *(f"--set={s}" for s in sets)])  # noqa: E731
    saved = fingerprints.training_settings("mas", args())
    run_dir = saved_run(out, "mas_s0", 40, warm_start=fingerprints.warm_start(args(), "mas"), settings=saved, source=fingerprints.source_hash())
    lr, batch = saved["actor_rollout_ref.actor.optim.lr"], saved["data.train_batch_size"]
    changed = args(f"actor_rollout_ref.actor.optim.lr={lr * 5}", f"data.train_batch_size={batch * 2}")
    reason = (f"it was trained with other settings than its recipe and --set give now (saved -> now): actor_rollout_ref.actor.optim.lr: "
              f"{lr} -> {lr * 5}; data.train_batch_size: {batch} -> {batch * 2}")
    warm, settings = fingerprints.warm_start(changed, "mas"), fingerprints.training_settings("mas", changed)
    assert training.stale(run_dir, warm, settings, fingerprints.source_hash()) == [reason]

    # said first, before anything runs (here the run then stops at its missing data)
    assert cli.main(["--methods", "mas", "--seeds", "0", "--out", str(out), f"--set=data.train_batch_size={batch * 2}"]) == 1
    said = capsys.readouterr()
    assert "[train mas_s0] saved, but will be trained again: it was trained with other settings" in said.out
    assert "train.parquet does not exist" in said.err and launched == []
    later = args("data.val_batch_size=8", "trainer.test_freq=20", "trainer.save_freq=10", "data.seed=3",
                 "actor_rollout_ref.rollout.val_kwargs.temperature=0.5",  # how it validates and saves; the seed is the command's
                 "++actor_rollout_ref.rollout.engine_kwargs.hf.torch_threads=3")  # and the rollout's threads
    training.train("mas", 0, 40, later, out, fingerprints.warm_start(later, "mas"))
    assert launched == [] and "finished earlier" in capsys.readouterr().out  # kept
    assert fingerprints.changed_keys({"a": 1, "b": True, "c": [1]}, {"a": 1.0, "b": 1, "c": [1], "new": 0}) == ["a: 1 -> 1.0", "b: true -> 1"]
    (run_dir / "settings.json").write_text("{")  # cut short mid-write by hand
    assert "its settings.json is unreadable" in training.stale(run_dir, fingerprints.warm_start(args(), "mas"), saved, fingerprints.source_hash())[0]


def test_a_resumed_run_keeps_its_whole_curve_once_though_verls_file_logger_starts_anew_at_each_launch(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    args = cli.parse_args(["--methods", "mas", "--out", str(tmp_path / "out")])
    checkpoints = tmp_path / "out" / "checkpoints" / "mas_s0"
    plan = iter([(1, 7, 5, 1), (6, 8, 5, 1), (6, 10, 10, 0)])  # a launch: (first step, last step logged, last saved, exit code)

    def main_ppo(command, env, **kwargs):  # as verl: the file logger opens its file with "wb"; steps after the last save are lost
        first, last, saved, code = next(plan)
        assert training.finished_steps(checkpoints) == first - 1  # resumed from its last save
        with open(env["VERL_FILE_LOGGER_PATH"], "w") as log:
            log.writelines(json.dumps({"step": step, "data": {"mas/success": step / 10}}) + "\n" for step in range(first, last + 1))
            log.write('{"step": ')  # a line cut short by the kill
        (checkpoints / f"global_step_{saved}").mkdir(exist_ok=True)
        (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(saved))
        return subprocess.CompletedProcess(command, code)

    monkeypatch.setattr(subprocess, "run", main_ppo)
    warm = fingerprints.warm_start(args, "mas")
    for _ in range(2):  # killed twice after saving step 5
        with pytest.raises(methods.TrainingFailed):
            training.train("mas", 0, 10, args, tmp_path / "out", warm)
    training.train("mas", 0, 10, args, tmp_path / "out", warm)
    curve = [json.loads(line) for line in (tmp_path / "out" / "logs" / "mas_s0.jsonl").read_text().splitlines()]
    assert [row["step"] for row in curve] == list(range(1, 11))
    assert curve[6]["data"]["mas/success"] == 0.7
    assert not training.launch_log(tmp_path / "out" / "logs", "mas_s0").exists()


def _row(label, success, swapped=False, episodes=64, **role_rewards):
    return {"label": label, "success": success, "swapped": swapped, "episodes": episodes,
            "roles": {role: {"reward_mean": reward} for role, reward in role_rewards.items()}}


def _evaluation(*rows, outcomes=None):
    """An evaluation as ``evaluation.read_evaluation`` returns it; ``outcomes``: label -> problem -> success (as trained)."""
    return {"rows": list(rows), "outcomes": {label: {"0": {p: [won] for p, won in problems.items()}} for label, problems in (outcomes or {}).items()}}


def test_aggregate_reports_before_and_after_over_seeds_with_intervals_and_gains_across_runs_and_paired_over_problems(tmp_path):
    before = {"test": {0: _evaluation(_row("sa", 0.1, plan=0.5), _row("mas", 0.2, plan=0.5, tool=1.0), _row("per_role", 0.25, plan=0.5, tool=1.0),
                                      outcomes={"per_role": {"1": False, "2": False, "3": True}}),
                       1: _evaluation(_row("sa", 0.15, plan=0.5), _row("mas", 0.3, plan=0.5, tool=1.0), _row("per_role", 0.35, plan=0.7, tool=1.0),
                                      outcomes={"per_role": {"1": False, "2": True, "3": True}})}}
    after = {"test": {0: _evaluation(_row("sa_s0", 0.1, plan=0.4), _row("mas_s0", 0.5), _row("per_role_s0", 0.8, plan=0.9, tool=1.2),
                                     _row("per_role_s0", 0.2, swapped=True), outcomes={"per_role_s0": {"1": True, "2": True, "3": True}}),
                      1: _evaluation(_row("sa_s1", 0.3, plan=0.6), _row("mas_s1", 0.7), _row("per_role_s1", 0.6, plan=0.7, tool=1.6),
                                     _row("per_role_s1", 0.4, swapped=True), outcomes={"per_role_s1": {"1": False, "2": True, "3": True}})}}
    table = {(r["method"], r["swapped"]): r["splits"]["test"] for r in aggregation.aggregate(before, after, ["sa", "mas", "per_role"], [0, 1])}
    per_role = table["per_role", False]
    assert per_role["before_per_seed"] == {0: 0.25, 1: 0.35}  # its own recipe at its warm start, once per seed
    assert per_role["after_per_seed"] == {0: 0.8, 1: 0.6} and per_role["after_mean"] == pytest.approx(0.7)
    # the interval over two runs: mean ± t(0.975, 1 df) x sd / sqrt(2) = 0.7 ± 12.706 x 0.1
    assert (per_role["after"]["low"], per_role["after"]["high"]) == pytest.approx((0.7 - 1.27062, 0.7 + 1.27062), abs=1e-4)
    # the gain across runs: Welch's t on (0.8, 0.6) against (0.25, 0.35)
    gain = per_role["gain"]
    assert gain["diff"] == pytest.approx(0.4) and gain["se"] == pytest.approx(math.sqrt(0.02 / 2 + 0.005 / 2)) and 0 < gain["p"] < 1
    # paired over problems: problem 1 0/2 -> 1/2, problem 2 1/2 -> 2/2, problem 3 2/2 -> 2/2: mean +1/3
    assert per_role["gain_paired"]["diff"] == pytest.approx(1 / 3) and per_role["gain_paired"]["problems"] == 3
    assert table["per_role", True]["after_mean"] == pytest.approx(0.3) and table["per_role", True]["gain"] is None
    assert per_role["role_reward_before"] == pytest.approx({"plan": 0.6, "tool": 1.0})  # each role's reward, averaged over seeds
    assert per_role["role_reward_after"] == pytest.approx({"plan": 0.8, "tool": 1.4})
    assert per_role["after_binomial_se_per_seed"][0] == pytest.approx(math.sqrt(0.8 * 0.2 / 64))  # one evaluation's own noise
    rows = aggregation.aggregate(before, after, ["sa", "mas", "per_role"], [0, 1])
    warm = {"sa": {"shared": "demos"}, "mas": {"shared": "demos"}, "per_role": {"tool_policy": "demos", "plan_policy": "planner"}}
    meta = {"steps": 40, "seeds": [0, 1], "episodes": 64, "wall_s": 600, "warm_starts": warm, "comparisons": aggregation.comparisons(rows)}
    text = report.markdown(rows, meta)
    assert "MAS + AT-GRPO, a model per role: tool_policy `demos`, plan_policy `planner`." in text
    swap = next(c for c in meta["comparisons"] if c["a"].endswith("policies swapped"))
    assert swap["seeds"]["diff"] == pytest.approx(-0.4) and swap["seeds"]["df"] == 1  # the same runs swapped: paired by seed
    assert "- MAS + AT-GRPO, a model per role, policies swapped - MAS + AT-GRPO, a model per role: over seeds (paired t by run) -0.400 [" in text
    assert "| MAS + AT-GRPO, a model per role | 0.300 [-0.335, 0.935] | 0.700 [-0.571, 1.971] | +0.400 [" in text
    assert ("| MAS + AT-GRPO, a model per role, policies swapped | - | 0.300 [-0.971, 1.571] | n/a (needs 2+ runs a side) "
            "| n/a (needs 2+ runs a side) | 0.200 | 0.400 | - |") in text  # its warm start not played swapped: no before, no gain
    assert "## Development test split (`test`)" in text and "One training seed" not in text
    assert "outcomes" not in json.dumps(report.public(rows))  # per-problem outcomes stay out of reproduce.json
    png = report.plot_table(rows, tmp_path)
    assert os.path.getsize(png) > 10_000
    # roles started together: the untrained per-role team is the shared one, and its evaluations stand for it
    shared = aggregation.aggregate(before, after, ["sa", "mas", "per_role"], [0, 1], {"sa": "sa", "mas": "mas", "per_role": "mas"})
    assert [r["splits"]["test"]["before_per_seed"] for r in shared][2] == {0: 0.2, 1: 0.3}
    text = report.markdown(shared, {**meta, "before_of": {"per_role": "mas"}})
    assert "Before training, MAS + AT-GRPO, a model per role is the team of MAS + AT-GRPO, shared policy" in text


def test_one_seed_gives_no_interval_between_runs_and_says_so():
    before = {"test": {0: _evaluation(_row("mas", 0.5), outcomes={"mas": {"1": False, "2": True}})}}
    after = {"test": {0: _evaluation(_row("mas_s0", 0.7), outcomes={"mas_s0": {"1": True, "2": True}})}}
    rows = aggregation.aggregate(before, after, ["mas"], [0])
    part = rows[0]["splits"]["test"]
    assert part["after"] is None and part["before"] is None and part["gain"] is None  # no variance between runs from one run
    assert part["gain_paired"]["diff"] == pytest.approx(0.5)  # the paired figure still describes this run on these problems
    text = report.markdown(rows, {"steps": 40, "seeds": [0], "episodes": 2, "wall_s": 60, "warm_starts": {}})
    assert "**One training seed**: the variance between training runs cannot be estimated" in text
    assert "| MAS + AT-GRPO, shared policy | 0.500 (one run) | 0.700 (one run) | n/a (needs 2+ runs a side) | +0.500 [" in text


def test_a_failed_seed_is_reported_as_failed_and_left_out_and_methods_are_compared_after_training_on_each_split():
    before = {split: {s: _evaluation(_row("sa", 0.1 + s / 100), _row("mas", 0.5 + s / 100)) for s in (0, 1)} for split in ("test", "confirm")}
    after = {split: {0: _evaluation(_row("sa_s0", 0.1), _row("mas_s0", 0.8), _row("mas_by_problem_s0", 0.6),
                                    outcomes={"mas_s0": {"1": True, "2": True}, "mas_by_problem_s0": {"1": False, "2": True}}),
                     1: _evaluation(_row("sa_s1", 0.2), _row("mas_by_problem_s1", 0.65), outcomes={"mas_by_problem_s1": {"1": True, "2": True}})}
             for split in ("test", "confirm")}
    failed = {"mas_s1": "training mas_s1 failed (exit 1); its log: x"}
    sources = {"sa": "sa", "mas": "mas", "mas_by_problem": "mas"}
    table = aggregation.aggregate(before, after, ["sa", "mas", "mas_by_problem"], [0, 1], sources, failed)
    mas = next(row for row in table if row["method"] == "mas")
    assert mas["splits"]["test"]["after_per_seed"] == {0: 0.8} and mas["failed_seeds"] == {1: failed["mas_s1"]}
    assert next(row for row in table if row["method"] == "mas_by_problem")["splits"]["test"]["before_per_seed"] == {0: 0.5, 1: 0.51}
    pairs = {(c["split"], c["a"], c["b"]): c for c in aggregation.comparisons(table)}
    sa = pairs["confirm", "MAS + AT-GRPO, shared policy", "SA + GRPO"]
    assert sa["seeds"] is None  # one run of mas left: no comparison across runs
    by_problem = pairs["test", "MAS + AT-GRPO, shared policy", "MAS + GRPO grouped by problem, shared policy"]
    assert by_problem["paired"]["diff"] == pytest.approx(0.25)  # problem 1: 1 against 1/2, problem 2: 1 against 1
    text = report.markdown(table, {"steps": 40, "seeds": [0, 1], "episodes": 64, "wall_s": 60, "warm_starts": {},
                                      "comparisons": aggregation.comparisons(table)})
    assert "| MAS + AT-GRPO, shared policy | 0.505 [0.441, 0.569] | 0.800 (one run) | n/a (needs 2+ runs a side) |" in text
    assert "| 0.800 | left out |" in text
    assert "**MAS + AT-GRPO, shared policy, seed 1: left out of the figures**: training mas_s1 failed" in text
    assert text.index("## Development test split") < text.index("## Development confirmation split")
    assert "- MAS + AT-GRPO, shared policy - MAS + GRPO grouped by problem, shared policy: over seeds n/a (needs 2+ runs a side); paired +0.250 [" in text


def test_the_statistics_on_constructed_cases_with_known_answers():
    # three runs that differ far more than one evaluation's binomial noise: the interval is the runs' t interval
    runs = [0.936, 0.890, 0.854]
    interval = stats.seed_interval(runs)
    sd = statistics.stdev(runs)
    assert interval["sd"] == pytest.approx(sd) and interval["df"] == 2
    assert interval["high"] - interval["mean"] == pytest.approx(4.302653 * sd / math.sqrt(3), rel=1e-5)
    assert interval["high"] - interval["mean"] > 10 * math.sqrt(0.89 * 0.11 / 1024) / math.sqrt(3)  # >> the binomial figure
    # Welch's t with its textbook Satterthwaite degrees of freedom
    a, b = [0.888, 0.874, 0.884], [0.84, 0.83, 0.835, 0.845]
    diff = stats.seed_difference(a, b)
    va, vb = statistics.variance(a) / 3, statistics.variance(b) / 4
    assert diff["diff"] == pytest.approx(statistics.mean(a) - statistics.mean(b)) and diff["se"] == pytest.approx(math.sqrt(va + vb))
    assert diff["df"] == pytest.approx((va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 3))
    assert diff["p"] < 0.01 and diff["low"] > 0
    assert stats.seed_difference([0.5], b) is None and stats.seed_interval([0.5]) is None
    # the same runs swapped and not: a paired t over runs, which sees a shift every run shares
    trained, swapped = [0.936, 0.890, 0.854], [0.834, 0.824, 0.835]
    paired, unpaired = stats.seed_difference(swapped, trained, paired=True), stats.seed_difference(swapped, trained)
    shifts = [s - t for s, t in zip(swapped, trained)]
    assert paired["diff"] == pytest.approx(statistics.mean(shifts)) and paired["se"] == pytest.approx(statistics.stdev(shifts) / math.sqrt(3))
    assert paired["df"] == 2 and paired["p"] != unpaired["p"]
    # paired: every problem gains 0.5 -> the difference is exact; no gain on balance -> an interval across zero
    same = stats.paired_problems({str(i): [True] for i in range(50)}, {str(i): [True, False] for i in range(50)})
    assert (same["diff"], same["low"], same["high"]) == (0.5, 0.5, 0.5)
    mixed = stats.paired_problems({str(i): [i % 2 == 0] for i in range(200)}, {str(i): [i % 2 == 1] for i in range(200)})
    assert mixed["diff"] == 0 and mixed["low"] < 0 < mixed["high"] and mixed["p"] > 0.5
    # a paired design sees what unpaired noise hides: 30 of 1,000 problems flip from failure to success
    flips = stats.paired_problems({str(i): [i < 530] for i in range(1000)}, {str(i): [i < 500] for i in range(1000)})
    assert flips["diff"] == pytest.approx(0.03) and flips["low"] > 0 and flips["p"] < 0.01
    assert stats.paired_problems({"1": [True]}, {"2": [True]}) is None  # no shared problem


def test_figures_alike_up_to_rounding_give_no_interval_and_the_text_says_which_test_and_which_problems():
    # every run moved by 0.1, which floats do not subtract exactly: no t (it would read p ~ 1e-32), and the text says so
    moved = stats.seed_difference([0.4, 0.5, 0.6], [0.3, 0.4, 0.5], paired=True)
    assert moved["p"] is None and moved["low"] == moved["high"] == pytest.approx(0.1) and moved["test"] == stats.PAIRED_T
    assert report._gain_text(moved) == "+0.100 (every run moved alike: no interval)"
    # two problems each up by 1/3, as floats 0.3333333333333333 and 0.33333333333333337: exact, no resampling
    thirds = stats.paired_problems({"x": [True, False, False], "y": [True, True, True]}, {"x": [False] * 3, "y": [True, True, False]})
    assert thirds["p"] is None and thirds["low"] == thirds["high"] == pytest.approx(1 / 3)
    assert report._interval_text(stats.seed_interval([1.0, 1.0, 1.0]), []) == "1.000 (all 3 alike: no interval)"
    assert stats.seed_difference([0.9, 0.91, 0.92], [0.5, 0.52, 0.51])["test"] == stats.WELCH
    # a t-test's small p is printed as it is, not as a bootstrap's bound; a bootstrap's 0 is a bound
    assert report._p_text(2e-5, bootstrap=False) == ", p = 2.0e-05"
    assert report._p_text(0.0, bootstrap=True) == f", p < {2 / stats.BOOTSTRAP_RESAMPLES:g}"
    # problems one side did not play are left out of the paired figure, and its text names how many were compared
    partial = stats.paired_problems({str(i): [i % 3 > 0] for i in range(60)}, {str(i): [i % 2 > 0] for i in range(50)})
    assert partial["problems"] == 50 and partial["unshared"] == 10
    assert report._gain_text(partial).endswith(", on the 50 problems both played")


def test_before_is_reused_only_for_the_same_source_config_problems_and_warm_start_and_says_why_not(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    model = tmp_path / "artifacts" / "tiny_model_plan_path_team"
    model.mkdir(parents=True)
    (model / "warm_start.json").write_text('{"steps": 1200}')
    args = cli.parse_args(["--out", str(tmp_path / "out"), "--episodes", "8"])
    specs = ["sa=plan_path_sa_grpo_repro_cpu", "mas=plan_path_mas_atgrpo_repro_cpu"]
    warm = lambda a: {m: fingerprints.warm_start(a, m) for m in ("sa", "mas")}  # noqa: E731  (read again: the model may change)
    folder = tmp_path / "out" / "before" / "test" / "s0"
    folder.mkdir(parents=True)
    fp = lambda a, seed=0, source="abc", problems="p1": fingerprints.fingerprint(specs, a, warm(a), seed, "test", source, problems)  # noqa: E731
    assert evaluation.earlier_evaluation(folder, fp(args)) is None  # nothing there
    (folder / "results.json").write_text(json.dumps({"rows": [_row("sa", 0.1), _row("mas", 0.2)]}))
    (folder / "episodes.jsonl").write_text(json.dumps({"run": "mas", "seed": 7, "success": True}) + "\n")
    (folder / "fingerprint.json").write_text(json.dumps(fp(args)))
    kept = evaluation.earlier_evaluation(folder, fp(args))
    assert kept["rows"][1]["success"] == 0.2 and kept["outcomes"] == {"mas": {"0": {"7": [True]}}}
    capsys.readouterr()
    assert evaluation.earlier_evaluation(folder, fp(args, source="def")) is None  # the package's code changed
    assert "evaluated again: the package's source changed (sha256 abc -> def)" in capsys.readouterr().out
    other = cli.parse_args(["--out", str(tmp_path / "out"), "--episodes", "8", "--set", "actor_rollout_ref.rollout.val_kwargs.top_p=0.9"])
    assert evaluation.earlier_evaluation(folder, fp(other)) is None  # the evaluation samples otherwise
    assert "run sa's evaluation config: actor_rollout_ref.rollout.val_kwargs.top_p: 1.0 -> 0.9" in capsys.readouterr().out
    assert evaluation.earlier_evaluation(folder, fp(args, problems="p2")) is None  # the split was written again, with other problems
    assert "evaluated again: the test split holds other problems (sha256 p1 -> p2)" in capsys.readouterr().out
    assert evaluation.earlier_evaluation(folder, fp(args, seed=1)) is None  # another draw
    assert "seed: 0 -> 1" in capsys.readouterr().out
    as_trained = fingerprints.fingerprint(specs, args, warm(args), 0, "test", "abc", "p1", swap=False)
    assert evaluation.earlier_evaluation(folder, as_trained) is None  # played swapped then, not now
    assert "evaluated again: played as trained alone now" in capsys.readouterr().out
    old = {key: value for key, value in fp(args).items() if key != "swap"}  # a "before" of an earlier version: as trained alone
    (folder / "fingerprint.json").write_text(json.dumps(old))
    assert evaluation.earlier_evaluation(folder, as_trained) is not None and evaluation.earlier_evaluation(folder, fp(args)) is None
    assert "evaluated again: played swapped now" in capsys.readouterr().out
    (folder / "fingerprint.json").write_text(json.dumps(fp(args)))
    only_sa = fingerprints.fingerprint(specs[:1], args, warm(args), 0, "test", "abc", "p1")
    assert evaluation.earlier_evaluation(folder, only_sa) is None  # a run less
    assert "other runs (saved: mas, sa; now: sa)" in capsys.readouterr().out
    assert evaluation.earlier_evaluation(folder, fp(cli.parse_args(["--out", str(tmp_path / "out"), "--episodes", "16"]))) is None
    (model / "warm_start.json").write_text('{"steps": 600}')
    assert evaluation.earlier_evaluation(folder, fp(args)) is None
    assert "another warm start" in capsys.readouterr().out
    (folder / "results.json").write_text('{"rows": [')  # cut short
    (folder / "fingerprint.json").write_text(json.dumps(fp(args)))
    assert evaluation.earlier_evaluation(folder, fp(args)) is None
    assert fingerprints.source_hash() == fingerprints.source_hash() and len(fingerprints.source_hash()) == 64


def test_before_and_after_are_played_with_the_same_evaluation_settings_and_each_seed_samples_with_its_own(tmp_path, monkeypatch):
    calls = []

    def fake_eval(argv):  # stands in for pettingllms-eval: records how it was asked
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        calls.append(argv)
        labels = [spec.split("=", 1)[0] for spec in argv if "=" in spec and not spec.startswith("--")]
        (out / "results.json").write_text(json.dumps({"rows": [_row(label, 0.5) for label in labels]}))
        (out / "episodes.jsonl").write_text("".join(json.dumps({"run": label, "seed": 1, "success": True}) + "\n" for label in labels))
        return 0

    monkeypatch.setattr(evaluate, "main", fake_eval)
    args = cli.parse_args(["--out", str(tmp_path), "--episodes", "8", "--set", "data.val_batch_size=4"])
    for seed in (0, 1):
        evaluation.evaluate_runs(["mas=plan_path_mas_atgrpo_repro_cpu"], args, tmp_path / "before" / f"s{seed}", seed, "confirm", swap=False)
        evaluation.evaluate_runs(["mas_s0=plan_path_mas_atgrpo_repro_cpu@x"], args, tmp_path / "after" / f"s{seed}", seed, "confirm")
    settings = lambda argv: sorted(a for a in argv if a.startswith("--set=")) + [argv[argv.index(k) + 1] for k in ("--split", "--episodes")]  # noqa: E731
    before0, after0, before1, after1 = map(settings, calls)
    assert before0 == after0 and before1 == after1 and before0 != before1
    assert "--set=actor_rollout_ref.rollout.seed=1" in before1 and "--set=data.val_batch_size=4" in before1 and before1[-2:] == ["confirm", "8"]


def test_a_confirmation_split_sharing_problems_with_another_split_is_refused_naming_how_many(tmp_path, monkeypatch):
    from pettingllms_verl.data.rows import write_parquet
    from pettingllms_verl.envs.splits import generate_splits

    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path))
    data = tmp_path / "data" / "plan_path_4x4_short"
    splits = generate_splits("plan_path", {"train": 6, "val": 2, "test": 3, "confirm": 3, "final": 3}, {"size": 4, "wall_density": 0.3},
                             log=lambda _: None)
    assert {row["extra_info"]["seed"] for row in splits["confirm"]} >= {1_500_000_000}  # a seed range of its own
    assert {row["extra_info"]["seed"] for row in splits["final"]} >= {1_750_000_000}  # and the final confirmation split another
    for split, rows in splits.items():
        write_parquet(rows, str(data / f"{split}.parquet"))
    args = cli.parse_args(["--methods", "mas", "--out", str(tmp_path / "out"), "--splits", "test,confirm"])
    hashes = methods.check_splits(args)
    assert set(hashes) == {"test", "confirm"} and hashes["test"] != hashes["confirm"]
    assert set(methods.check_splits(cli.parse_args(["--methods", "mas", "--out", str(tmp_path / "out")]))) == {"test", "final"}
    write_parquet(splits["confirm"][:1] + splits["train"][:2], str(data / "confirm.parquet"))  # two training problems leaked in
    with pytest.raises(methods.ReproduceError, match=r"confirmation split .*confirm.parquet shares problems with train \(2\)"):
        methods.check_splits(args)
    write_parquet(splits["confirm"][:2] + splits["test"][:1], str(data / "confirm.parquet"))
    confirm_only = cli.parse_args(["--methods", "mas", "--splits", "confirm", "--out", str(tmp_path / "out")])
    with pytest.raises(methods.ReproduceError, match=r"shares problems with test \(1\)"):  # checked against test, evaluated or not
        methods.check_splits(confirm_only)
    write_parquet(splits["confirm"], str(data / "confirm.parquet"))
    write_parquet(splits["final"][:2] + splits["confirm"][:1], str(data / "final.parquet"))  # the final split against the other, not evaluated
    final_only = cli.parse_args(["--methods", "mas", "--splits", "final", "--out", str(tmp_path / "out")])
    with pytest.raises(methods.ReproduceError, match=r"final.parquet shares problems with confirm \(1\).*--final: a seed range"):
        methods.check_splits(final_only)
    (data / "confirm.parquet").unlink()
    with pytest.raises(eval_runs.EvalError, match="confirm.parquet does not exist.*--confirm N"):
        methods.check_splits(args)


def test_a_model_per_role_is_evaluated_before_training_only_when_its_roles_start_apart():
    start = lambda model: {"model": model, "warm_start": None}  # noqa: E731
    together = {"sa": {"shared": start("demos")}, "mas": {"shared": start("demos")},
                "per_role": {"tool_policy": start("demos"), "plan_policy": start("demos")}}
    assert fingerprints.before_sources(["sa", "mas", "per_role"], together) == {"sa": "sa", "mas": "mas", "per_role": "mas"}
    assert fingerprints.before_sources(["per_role"], together) == {"per_role": "per_role"}  # no shared run to stand for it
    grouped = {**together, "mas_by_problem": {"shared": start("demos")}}  # grouping matters only in training
    assert fingerprints.before_sources(["sa", "mas", "mas_by_problem"], grouped) == {"sa": "sa", "mas": "mas", "mas_by_problem": "mas"}
    apart = {**together, "per_role": {"tool_policy": start("demos"), "plan_policy": start("planner")}}
    assert fingerprints.before_sources(["sa", "mas", "per_role"], apart) == {"sa": "sa", "mas": "mas", "per_role": "per_role"}
    other = {**together, "mas": {"shared": start("other")}}
    assert fingerprints.before_sources(["mas", "per_role"], other)["per_role"] == "per_role"


def test_the_roles_of_a_model_per_role_can_start_apart_and_a_run_remembers_each_ones_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    for name in ("tiny_model_plan_path_team", "planner"):
        (tmp_path / "artifacts" / name).mkdir(parents=True)
        (tmp_path / "artifacts" / name / "warm_start.json").write_text(json.dumps({"name": name}))
    planner = tmp_path / "artifacts" / "planner"
    apart = cli.parse_args(["--methods", "per_role", "--out", str(tmp_path / "out"),
                                  "--set", f"++pettingllms.policies.plan_policy.overrides.model.path={planner}"])
    warm = fingerprints.warm_start(apart, "per_role")
    assert warm["plan_policy"] == {"model": str(planner), "warm_start": {"name": "planner"}, "sha256": None}
    assert warm["tool_policy"]["warm_start"] == {"name": "tiny_model_plan_path_team"}
    together = cli.parse_args(["--methods", "per_role", "--out", str(tmp_path / "out")])
    assert fingerprints.warm_start(together, "per_role")["plan_policy"]["warm_start"] == {"name": "tiny_model_plan_path_team"}
    # the "before" evaluation and a finished run both belong to the warm starts they came from
    specs = ["per_role=plan_path_mas_full_repro_cpu"]
    assert (fingerprints.fingerprint(specs, apart, {"per_role": warm}, 0, "test", "src", "p")
            != fingerprints.fingerprint(specs, together, {"per_role": fingerprints.warm_start(together, "per_role")}, 0, "test", "src", "p"))
    run_dir = tmp_path / "out" / "checkpoints" / "per_role_s0"
    run_dir.mkdir(parents=True)
    (run_dir / "latest_checkpointed_iteration.txt").write_text("40")
    (run_dir / "warm_start.json").write_text(json.dumps(warm))
    (run_dir / "settings.json").write_text(json.dumps(fingerprints.training_settings("per_role", apart)))
    (run_dir / "source.json").write_text(json.dumps("src"))
    assert training.stale(run_dir, fingerprints.warm_start(apart, "per_role"), fingerprints.training_settings("per_role", apart), "src") == []  # kept
    reasons = training.stale(run_dir, fingerprints.warm_start(together, "per_role"), fingerprints.training_settings("per_role", together), "src")
    assert any(re.search(r"another warm start .*plan_policy .*tiny_model_plan_path_team", reason) for reason in reasons)


def test_the_real_model_is_not_in_the_default_methods_and_its_adapters_starts_are_part_of_its_warm_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    assert "real" not in cli.parse_args([]).methods  # hours on CPU: `make reproduce-real` asks for it
    for role in ("tool", "plan"):
        (tmp_path / "artifacts" / f"smollm2_135m_{role}_adapter").mkdir(parents=True)
        (tmp_path / "artifacts" / f"smollm2_135m_{role}_adapter" / "warm_start.json").write_text(json.dumps({"roles": [role]}))
    args = cli.parse_args(["--methods", "real", "--out", str(tmp_path / "out")])
    warm = fingerprints.warm_start(args, "real")
    assert warm["tool_adapter"] == {"model": str(tmp_path / "artifacts" / "smollm2_135m_tool_adapter"), "warm_start": {"roles": ["tool"]}, "sha256": None}
    weights = tmp_path / "artifacts" / "smollm2_135m_tool_adapter" / "adapter_model.safetensors"
    weights.write_bytes(b"a")
    built = fingerprints.warm_start(args, "real")["tool_adapter"]["sha256"]
    before = fingerprints.warm_start(args, "real")
    weights.write_bytes(b"b")  # built again from the same record (another machine), other weights: another warm start
    assert built != fingerprints.warm_start(args, "real")["tool_adapter"]["sha256"] and len(built) == 64
    assert fingerprints.warm_changes(before, fingerprints.warm_start(args, "real")) == [
        f"tool_adapter {weights.parent}: its weights (sha256 {built[:12]} -> {fingerprints.warm_start(args, 'real')['tool_adapter']['sha256'][:12]})"]
    assert warm["plan_adapter"]["warm_start"] == {"roles": ["plan"]}
    assert any(start["model"].endswith("smollm2_135m") for start in warm.values())  # the base the adapters sit on
    assert fingerprints.before_sources(["mas", "real"], {"mas": fingerprints.warm_start(args, "mas"), "real": warm})["real"] == "real"


def test_the_program_team_plays_its_own_before_and_is_compared_with_the_environments_team(tmp_path, monkeypatch):
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    args = cli.parse_args(["--methods", "mas,program", "--out", str(tmp_path / "out")])
    assert "program" not in cli.parse_args([]).methods  # `make reproduce-program` asks for it, beside mas
    warm = {method: fingerprints.warm_start(args, method) for method in args.methods}
    assert warm["program"] == warm["mas"]  # the same shared policy from the same warm start
    # its untrained team is the program's play, not the environment's: it is evaluated on its own
    assert fingerprints.before_sources(args.methods, warm) == {"mas": "mas", "program": "program"}
    target = fingerprints.flat_config("plan_path_program_repro_cpu", [], eval_runs.RECIPES_DIR)["pettingllms.program.target"]
    assert (REPO / target.split(":")[0]).is_file()  # relative to the repository root, where make runs it
    before = {"test": {s: _evaluation(_row("mas", 0.5), _row("program", 0.5)) for s in (0, 1)}}
    after = {"test": {s: _evaluation(_row(f"mas_s{s}", 0.8 + s / 10), _row(f"program_s{s}", 0.7 + s / 10),
                                     outcomes={f"mas_s{s}": {"1": True, "2": True}, f"program_s{s}": {"1": True, "2": bool(s)}}) for s in (0, 1)}}
    found = aggregation.comparisons(aggregation.aggregate(before, after, args.methods, [0, 1]))
    pair = next(c for c in found if c["a"] == "MAS + AT-GRPO, shared policy, the team as a LangGraph program")
    assert pair["b"] == "MAS + AT-GRPO, shared policy" and pair["seeds"]["diff"] == pytest.approx(-0.1)
    assert pair["paired"]["diff"] == pytest.approx(-0.25)  # problem 2: 1/2 against 2/2


def test_a_program_changed_outside_the_package_trains_again_and_one_not_found_is_refused_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    program = tmp_path / "team.py"
    program.write_text((REPO / "examples" / "agents" / "plan_path_langgraph.py").read_text())
    args = cli.parse_args(["--methods", "program", "--out", str(tmp_path / "out"), "--set", f"pettingllms.program.target={program}:team"])
    run_dir = tmp_path / "out" / "checkpoints" / "program_s0"
    run_dir.mkdir(parents=True)
    (run_dir / "latest_checkpointed_iteration.txt").write_text("40")
    warm = fingerprints.warm_start(args, "program")
    for name, record in (("warm_start", warm), ("settings", fingerprints.training_settings("program", args)), ("source", "src")):
        (run_dir / f"{name}.json").write_text(json.dumps(record))
    assert training.stale(run_dir, warm, fingerprints.training_settings("program", args), "src") == []
    program.write_text(program.read_text().replace('AGENTS = ("tool", "plan")', 'AGENTS = ("plan", "tool")'))  # the package's source is the same
    (reason,) = training.stale(run_dir, warm, fingerprints.training_settings("program", args), "src")
    assert "pettingllms.program.source_sha256" in reason
    monkeypatch.chdir(tmp_path)  # the shipped recipe's program path is relative to the repository root
    with pytest.raises(methods.ReproduceError, match=r"examples/agents/plan_path_langgraph.py is not found from .*repository root"):
        fingerprints.training_settings("program", cli.parse_args(["--methods", "program"]))


def stand_ins(tmp_path: Path, monkeypatch, grad_norm=lambda label, step: 0.1) -> list:
    """Data on disk and stand-ins for main_ppo (a run whose odd steps validate best, its curve's
    ``actor/grad_norm`` from ``grad_norm``) and for pettingllms-eval (trained runs, not swapped, win
    every problem; the rest win by parity); returns the list the evaluations are noted in."""
    from pettingllms_verl.data.rows import write_parquet
    from pettingllms_verl.envs.splits import generate_splits

    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    data = tmp_path / "artifacts" / "data" / "plan_path_4x4_short"
    splits = generate_splits("plan_path", {"train": 4, "val": 2, "test": 4, "confirm": 4, "final": 4}, {"size": 4, "wall_density": 0.3}, log=lambda _: None)
    for split, rows in splits.items():
        write_parquet(rows, str(data / f"{split}.parquet"))

    def main_ppo(command, env=None, **kwargs):  # a training run: a checkpoint tracker and its logged steps
        checkpoints = Path(next(a for a in command if a.startswith("trainer.default_local_dir=")).split("=", 1)[1])
        steps = int(next(a for a in command if a.startswith("trainer.total_training_steps=")).split("=", 1)[1])
        for step in range(1, steps + 1):  # each step saved with its validation (the evaluation plays the best)
            (checkpoints / f"global_step_{step}").mkdir(parents=True, exist_ok=True)
            (checkpoints / f"global_step_{step}" / "val_metrics.json").write_text(json.dumps({"metrics": {"val-core/plan_path/reward/mean@1": step % 2}}))
        (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(steps))
        records = ({"step": s, "data": {"mas/success": 0.5, "actor/grad_norm": grad_norm(checkpoints.name, s)}} for s in range(1, steps + 1))
        Path(env["VERL_FILE_LOGGER_PATH"]).write_text("".join(json.dumps(record) + "\n" for record in records))
        return subprocess.CompletedProcess(command, 0)

    evaluations = []

    def fake_eval(argv):  # an evaluation: success by run, sampling seed and split; every problem played
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        split, seed = argv[argv.index("--split") + 1], int(next(a for a in argv if "rollout.seed=" in a).rsplit("=", 1)[1])
        evaluations.append((out.relative_to(tmp_path / "out"), split, seed))
        problems = [str(row["extra_info"]["seed"]) for row in splits[split]]
        rows, records = [], []
        for spec in (a for a in argv if "=" in a and not a.startswith("--")):
            label = spec.split("=", 1)[0]
            checkpoint = spec.partition("@")[2]
            step = int(Path(eval_runs.resolve_checkpoint(checkpoint, "best-val")).name.rsplit("_", 1)[1]) if checkpoint else None
            for swapped in ([False, True] if "full_repro" in spec and "--swap" not in argv else [False]):
                learned = checkpoint and not swapped and not label.startswith("control")  # a control learns nothing; a last step half
                wins = [learned and (i % 2 == 0 or not label.endswith(methods.LAST)) or (i + seed) % 2 == 0 for i in range(len(problems))]
                rows.append({**_row(label, sum(wins) / len(wins), swapped=swapped, episodes=len(wins)), "step": step})
                records += [{"run": label, "seed": p, "success": w, "swapped": swapped} for p, w in zip(problems, wins)]
        (out / "results.json").write_text(json.dumps({"split": split, "rows": rows}))
        (out / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return 0

    monkeypatch.setattr(subprocess, "run", main_ppo)
    monkeypatch.setattr(evaluate, "main", fake_eval)
    return evaluations


def test_the_whole_driver_from_data_to_table_with_training_and_evaluation_stood_in_for(tmp_path, monkeypatch, capsys):
    """``cli.main`` end to end, main_ppo and pettingllms-eval replaced by stand-ins: per split
    and seed a "before" and an "after" evaluation, each seed's sampling its own, the table with
    intervals over runs and paired figures, and a rerun that keeps the "before" evaluations."""
    evaluations = stand_ins(tmp_path, monkeypatch)
    argv = ["--methods", "mas,per_role", "--seeds", "0,1", "--steps", "2", "--out", str(tmp_path / "out"), "--jobs", "1", "--splits", "test,confirm"]
    assert cli.main(argv) == 0
    before = sorted(e for e in evaluations if e[0].parts[0] == "before")
    assert before == [(Path("before/confirm/s0"), "confirm", 0), (Path("before/confirm/s1"), "confirm", 1),
                      (Path("before/test/s0"), "test", 0), (Path("before/test/s1"), "test", 1)]  # per-role starts as the shared team
    assert sorted(e for e in evaluations if e[0].parts[0] == "after") == [
        (Path(f"after/{split}/s{seed}"), split, seed) for split in ("confirm", "test") for seed in (0, 1)]
    result = json.loads((tmp_path / "out" / "reproduce.json").read_text())
    assert set(result["split_sha256"]) == {"test", "confirm"} and len(result["source_sha256"]) == 64
    mas = next(row for row in result["rows"] if row["method"] == "mas")
    assert mas["splits"]["confirm"]["after_per_seed"] == {"0": 1.0, "1": 1.0} and mas["splits"]["test"]["before_per_seed"] == {"0": 0.5, "1": 0.5}
    assert mas["splits"]["test"]["gain_paired"]["diff"] == pytest.approx(0.5)
    assert {(c["split"], c["a"]) for c in result["comparisons"]} >= {("test", "MAS + AT-GRPO, a model per role, policies swapped")}
    text = (tmp_path / "out" / "reproduce.md").read_text()
    assert "## Development test split (`test`, sha256 " in text and "## Development confirmation split (`confirm`, sha256 " in text
    evaluations.clear()
    capsys.readouterr()
    assert cli.main(argv) == 0  # again: the runs are finished and every evaluation made alike: all kept
    assert evaluations == []
    said = capsys.readouterr().out
    assert said.count("same source, configs, problems and warm start: kept") == 4
    assert said.count("same source, configs, problems and warm start, trained weights: kept") == 4
    assert cli.main([*argv[:argv.index("--steps")], "--steps", "3", *argv[argv.index("--steps") + 2:]]) == 0
    assert sorted(evaluations) == [(Path(f"after/{split}/s{seed}"), split, seed) for split in ("confirm", "test") for seed in (0, 1)]
    said = capsys.readouterr().out  # trained on: only the afters again (step 3 is now both best and last: one label each)
    assert said.count("evaluated again: ") == 4 and said.count("other trained weights (a run trained again") == 4
    evaluations.clear()
    shutil.rmtree(tmp_path / "out" / "checkpoints" / "mas_s1" / "global_step_3")  # seed 1's best step on val is gone
    assert cli.main([*argv[:argv.index("--steps")], "--steps", "3", *argv[argv.index("--steps") + 2:]]) == 0
    assert sorted(evaluations) == [(Path(f"after/{split}/s1"), split, 1) for split in ("confirm", "test")]
    # --report: the same table again from the saved evaluations, playing and training nothing
    written = json.loads((tmp_path / "out" / "reproduce.json").read_text())

    def nothing(*args, **kwargs):
        raise AssertionError("--report ran something")

    monkeypatch.setattr(subprocess, "run", nothing)
    monkeypatch.setattr(evaluate, "main", nothing)
    (tmp_path / "out" / "reproduce.md").unlink()
    assert cli.main([*argv[:argv.index("--steps")], *argv[argv.index("--steps") + 2:], "--report"]) == 0
    again = json.loads((tmp_path / "out" / "reproduce.json").read_text())
    assert again["rows"] == written["rows"] and again["comparisons"] == written["comparisons"] and again["steps"] == 3
    assert again["source_sha256"] == written["source_sha256"] and again["failed"] == {}
    assert "Written again (`--report`) from saved evaluations" in (tmp_path / "out" / "reproduce.md").read_text()
    # a seed whose runs all failed has no "after" (main plays none): its runs are reported failed; an "after"
    # on one split only is refused; the evaluations read from --archive, the table written to --out
    kept = tmp_path / "kept"
    shutil.copytree(tmp_path / "out" / "before", kept / "before")
    shutil.copytree(tmp_path / "out" / "after" / "test" / "s0", kept / "after" / "test" / "s0")
    shutil.copytree(tmp_path / "out" / "after" / "confirm" / "s0", kept / "after" / "confirm" / "s0")
    no_steps = [*argv[:argv.index("--steps")], *argv[argv.index("--steps") + 2:]]
    table_out = ["--out", str(tmp_path / "table"), "--archive", str(kept), "--report"]
    assert cli.main([*no_steps, *table_out]) == 1  # no checkpoints beside the evaluations: the steps are asked for
    assert "say --steps" in capsys.readouterr().err
    assert cli.main([*no_steps, *table_out, "--steps", "3"]) == 0
    failed = json.loads((tmp_path / "table" / "reproduce.json").read_text())["failed"]
    assert sorted(failed) == ["mas_s1", "per_role_s1"] and "did not finish" in failed["mas_s1"]
    shutil.copytree(tmp_path / "out" / "checkpoints" / "mas_s1", kept / "checkpoints" / "mas_s1", ignore=lambda *_: ["global_step_3"])
    (kept / "logs").mkdir()
    shutil.copy(tmp_path / "out" / "logs" / "mas_s1.jsonl", kept / "logs")
    drawn = []
    monkeypatch.setattr(plots, "main", lambda argv: drawn.extend(argv) or 0)
    assert cli.main([*no_steps, *table_out, "--steps", "3"]) == 0  # a run trained whole is not called failed
    assert any(arg.startswith("--curves=mas=") and str(kept / "logs" / "mas_s1.jsonl") in arg for arg in drawn)  # its curve drawn
    table = json.loads((tmp_path / "table" / "reproduce.json").read_text())
    assert sorted(table["failed"]) == ["per_role_s1"] and "did not finish" in table["failed"]["per_role_s1"]
    assert sorted(table["not_evaluated"]) == ["mas_s1"] and table["not_evaluated"]["mas_s1"].startswith("trained, not evaluated after training")
    mas = next(row for row in table["rows"] if row["method"] == "mas")
    assert mas["failed_seeds"] == {} and list(mas["not_evaluated_seeds"]) == ["1"] and mas["splits"]["test"]["after_per_seed"].keys() == {"0"}
    assert cli.main([*no_steps, *table_out, "--steps", "4"]) == 1  # evaluations of runs trained for 3 steps are not a table of 4
    assert "runs trained for other steps than --steps 4: mas_s1 3" in capsys.readouterr().err
    shutil.copytree(tmp_path / "out" / "after" / "test" / "s1", kept / "after" / "test" / "s1")
    assert cli.main([*no_steps, *table_out, "--steps", "3"]) == 1
    assert f"{kept / 'after' / 'confirm' / 's1'}: no finished evaluation there" in capsys.readouterr().err
    # an evaluation made by other code is not mixed in, and one missing is named
    stamp = tmp_path / "out" / "after" / "test" / "s1" / "fingerprint.json"
    stamp.write_text(json.dumps({**json.loads(stamp.read_text()), "source": "0" * 64}))
    capsys.readouterr()
    assert cli.main([*argv, "--report"]) == 1
    said = capsys.readouterr().err
    assert "were made by different code (the package's source sha256): " in said and "; 000000000000: after/test/s1" in said
    assert cli.main([*argv, "--report", "--seeds", "0,1,2"]) == 1
    assert f"{tmp_path / 'out' / 'before' / 'test' / 's2'}: no finished evaluation there" in capsys.readouterr().err


def test_the_primary_claim_is_declared_before_any_after_and_tested_against_the_control_the_rest_holm_adjusted(tmp_path, monkeypatch, capsys):
    """``make reproduce``'s new arms through ``cli.main`` with stand-ins: the primary claim
    written before anything is played and refused once an "after" exists, the control's "before" the
    per-role team's, each run played at its best step on val and at its last, the swap's difference in
    differences, Holm's adjustment over the secondary tests, the warm start's sha256, collapsed runs."""
    evaluations = stand_ins(tmp_path, monkeypatch, grad_norm=lambda label, step: 0.0 if label == "control_s2" else 0.1)
    warm = tmp_path / "artifacts" / "tiny_model_plan_path_team"
    warm.mkdir(parents=True)
    (warm / "model.safetensors").write_bytes(b"the warm start's weights")
    out = tmp_path / "out"
    argv = ["--methods", "per_role,control", "--seeds", "0,1,2", "--steps", "6", "--out", str(out), "--jobs", "1"]
    declared_seen = []
    real_evaluate_runs = evaluation.evaluate_runs

    def evaluate_runs(specs, args, folder, *rest, **kwargs):  # the claim is on disk before the first "after" is played
        if folder.relative_to(out).parts[0] == "after":
            declared_seen.append((out / "primary.json").is_file())
        return real_evaluate_runs(specs, args, folder, *rest, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate_runs", evaluate_runs)
    assert cli.main(argv) == 0
    assert declared_seen and all(declared_seen)
    declared = json.loads((out / "primary.json").read_text())
    assert declared["claim"] == methods.PRIMARY and declared["claim"]["split"] == "final"
    # the control untrained is the per-role team: one "before" per split and seed; its policies start alike, so no swapped one
    assert sorted({e[0].parts[0] for e in evaluations}) == ["after", "before"]
    assert len([e for e in evaluations if e[0].parts[0] == "before"]) == 6
    result = json.loads((out / "reproduce.json").read_text())
    assert result["primary"]["claim"] == declared["claim"] and result["alike"] == ["control", "per_role"]
    primary = result["primary_result"]
    assert primary["primary"] and primary["split"] == "final" and primary["seeds"]["diff"] == pytest.approx(0.5)
    assert "p_holm" not in primary["seeds"]  # the primary claim is not in the secondary family
    rows = {(r["method"], r["swapped"]): r for r in result["rows"]}
    per_role = rows["per_role", False]["splits"]["test"]
    assert per_role["after_step_per_seed"] == {"0": 5, "1": 5, "2": 5}  # best on val: the later of the odd steps
    assert per_role["after_per_seed"] == {"0": 1.0, "1": 1.0, "2": 1.0} and per_role["after_last_per_seed"] == {"0": 0.5, "1": 1.0, "2": 0.5}
    assert rows["control", False]["splits"]["test"]["before_per_seed"] == per_role["before_per_seed"]
    swapped = rows["per_role", True]["splits"]["test"]
    assert swapped["before_swapped_is_as_trained"] and swapped["before_per_seed"] == per_role["before_per_seed"]
    effect = swapped["swap_effect"]  # (1.0 - swapped) after, minus 0 before (the same team)
    assert effect["before"] == 0 and effect["after"] == pytest.approx(1.0 - sum(swapped["after_per_seed"].values()) / 3)
    family = [part[key] for row in result["rows"] for part in row["splits"].values() for key in ("gain", "gain_last", "swap_effect") if part.get(key)]
    raw = [test["p"] for test in family if test["p"] is not None] + [c["seeds"]["p"] for c in result["comparisons"]
                                                                     if not c["primary"] and c["seeds"] and c["seeds"]["p"] is not None]
    assert result["family"] == len(raw) and all(test["p_holm"] >= test["p"] for test in family if test["p"] is not None)
    assert max(test["p_holm"] for test in family if test["p"] is not None) <= 1.0
    starts = result["warm_starts"]["per_role"]
    assert len(starts["tool_policy"]["sha256"]) == 64 and starts["tool_policy"]["sha256"] == starts["plan_policy"]["sha256"]
    assert result["collapses"]["control"]["2"]["collapsed"] and not result["collapses"]["per_role"]["0"]["collapsed"]
    assert all(seconds >= 0 for per_seed in result["train_wall_s"].values() for seconds in per_seed.values())  # each run's launches timed
    text = (out / "reproduce.md").read_text()
    assert "**Primary claim** (declared " in text and "**it holds**" in text or "**it does not hold**" in text
    assert "## Final confirmation split (`final`" in text and "At each run's last step (6)" in text and "(Holm " in text
    assert "the same, null-training control (rewards shuffled within groups) 1 of 3 (seed 2: 6 of 6 steps without, 6 in a row)" in text
    assert "swapped, it is the same team, so before = 0" in text and "Training time per method (" in text
    assert "(untrained, a control is the team it controls for)" in text
    assert cli.main([*argv, "--report"]) == 0  # the same table from the saved evaluations: the control's before is per_role's
    again = json.loads((out / "reproduce.json").read_text())
    assert again["rows"] == result["rows"] and again["primary_result"] == result["primary_result"]
    # once an "after" exists, the claim is not changed, nor dropped; as declared, the rerun goes on
    for other in (["--primary", "per_role-control@test"], ["--primary", "none"]):
        assert cli.main([*argv, *other]) == 1
        assert "evaluations after training exist (" in capsys.readouterr().err
    assert json.loads((out / "primary.json").read_text()) == declared
    assert cli.main(argv) == 0
    (out / "primary.json").unlink()  # an "after" with no declaration: none can be made now
    assert cli.main(argv) == 1
    assert f"cannot declare the primary claim per_role-control@final now: evaluations after training exist ({out}/after/" in capsys.readouterr().err


def test_an_archive_carries_finished_evaluations_and_adapter_runs_to_a_new_machine(tmp_path, monkeypatch, capsys):
    """``--archive``: each finished evaluation (its per-episode outcomes, not transcripts) and each finished
    run of adapters (its records and the adapters of its best step on val, not verl's checkpoint) are
    kept as they finish; on a machine with none of ``--out``, a rerun restores them and keeps them all,
    trains and evaluates nothing, and refuses to train a restored run on. A full model is not kept."""
    from pettingllms_verl.data.rows import write_parquet
    from pettingllms_verl.envs.splits import generate_splits
    from pettingllms_verl.eval import archive

    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    splits = generate_splits("plan_path", {"train": 4, "val": 2, "test": 3, "confirm": 3}, {"size": 4, "wall_density": 0.3}, log=lambda _: None)
    for split, rows in splits.items():
        write_parquet(rows, str(tmp_path / "artifacts" / "data" / "plan_path_4x4_short" / f"{split}.parquet"))
    warm = tmp_path / "artifacts" / "smollm2_135m_tool_adapter"  # a warm start that is an adapter
    warm.mkdir()
    for name, text in (("adapter_config.json", "{}"), ("warm_start.json", '{"roles": ["tool"]}'), ("adapter_model.safetensors", "w")):
        (warm / name).write_text(text)
    launched, evaluations = [], []

    def main_ppo(command, env=None, **kwargs):  # each step: verl's checkpoint of the adapter group, its peft exports, its validation
        checkpoints = Path(next(a for a in command if a.startswith("trainer.default_local_dir=")).split("=", 1)[1])
        launched.append(checkpoints.name)
        steps = int(next(a for a in command if a.startswith("trainer.total_training_steps=")).split("=", 1)[1])
        for step in range(1, steps + 1):
            group = checkpoints / f"global_step_{step}" / "policies" / "lora"
            for name in ("tool_adapter", "plan_adapter"):
                (group / "lora_adapters" / name).mkdir(parents=True, exist_ok=True)
                (group / "lora_adapters" / name / "adapter_model.safetensors").write_text(f"{name} at {step}")
            (group / "model_world_size_1_rank_0.pt").write_text("base and adapters")
            (group.parents[1] / "val_metrics.json").write_text(json.dumps({"metrics": {"val-core/plan_path/reward/mean@1": 1 / step}}))
        (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(steps))
        Path(env["VERL_FILE_LOGGER_PATH"]).write_text("".join(json.dumps({"step": s, "data": {"mas/success": 0.5}}) + "\n" for s in range(1, steps + 1)))
        return subprocess.CompletedProcess(command, 0)

    def fake_eval(argv):
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        evaluations.append(out)
        split, spec = argv[argv.index("--split") + 1], next(a for a in argv if "=" in a and not a.startswith("--"))
        problems = [str(row["extra_info"]["seed"]) for row in splits[split]]
        records = [{"run": spec.split("=")[0], "seed": p, "success": "@" in spec, "swapped": False, "samples": [{"reply": "x" * 100}]} for p in problems]
        (out / "results.json").write_text(json.dumps({"split": split, "rows": [_row(spec.split("=")[0], float("@" in spec), episodes=len(problems))]}))
        (out / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return 0

    monkeypatch.setattr(subprocess, "run", main_ppo)
    monkeypatch.setattr(evaluate, "main", fake_eval)
    out, kept = tmp_path / "out", tmp_path / "archive"
    argv = ["--methods", "real", "--seeds", "0", "--steps", "2", "--out", str(out), "--archive", str(kept), "--jobs", "1", "--splits", "test,confirm"]
    assert cli.main(argv) == 0 and launched == ["real_s0"] and len(evaluations) == 4
    first = json.loads((out / "reproduce.json").read_text())
    run = kept / "checkpoints" / "real_s0"
    files = [*archive.RUN_RECORDS, archive.WALL_FILE, "curve.jsonl", "global_step_1", "global_step_2"]  # best, last
    assert sorted(p.name for p in run.iterdir()) == sorted(files)
    assert sorted(str(p.relative_to(run / "global_step_1")) for p in (run / "global_step_1").rglob("*") if p.is_file()) == [
        "policies/lora/lora_adapters/plan_adapter/adapter_model.safetensors", "policies/lora/lora_adapters/tool_adapter/adapter_model.safetensors",
        "val_metrics.json"]  # not verl's checkpoint
    assert (kept / "warm" / warm.name / "adapter_model.safetensors").read_text() == "w"  # the base model is not kept
    assert sorted(p.name for p in (kept / "warm").iterdir()) == [warm.name]
    episode = json.loads((kept / "after" / "test" / "s0" / "episodes.jsonl").read_text().splitlines()[0])
    assert set(episode) == {"run", "seed", "success", "swapped"}  # no transcript
    shutil.rmtree(out)  # a new machine: nothing of --out left
    launched.clear(), evaluations.clear(), capsys.readouterr()
    assert cli.main(argv) == 0 and launched == [] and evaluations == []
    said = capsys.readouterr().out
    assert f"[train real_s0] restored from {run}" in said and f"{kept}/after/confirm/s0: same source" in said
    assert said.count(": kept") == 5  # the run, two "before" and two "after" evaluations
    again = json.loads((out / "reproduce.json").read_text())
    assert again["rows"] == first["rows"] and again["comparisons"] == first["comparisons"]
    with pytest.raises(methods.ReproduceError, match="without verl's checkpoint of step 2 .* cannot be trained on to --steps 3"):
        training.check_saved(out / "checkpoints" / "real_s0", 3, [])  # its last step holds adapters alone
    shutil.rmtree(out / "checkpoints" / "real_s0" / "global_step_2")
    with pytest.raises(methods.ReproduceError, match="without verl's checkpoint of step 2"):
        training.check_saved(out / "checkpoints" / "real_s0", 3, [])  # or is not there
    # a run cut short here, and the archive's made by other code: the run here is left to resume
    shutil.rmtree(out / "checkpoints" / "real_s0")
    (out / "checkpoints" / "real_s0" / "global_step_1").mkdir(parents=True)
    (out / "checkpoints" / "real_s0" / "latest_checkpointed_iteration.txt").write_text("1")
    for name in ("warm_start.json", "settings.json", "source.json"):
        shutil.copy2(run / name, out / "checkpoints" / "real_s0" / name)
    (run / "source.json").write_text(json.dumps("0" * 64))
    launched.clear(), evaluations.clear()
    assert cli.main(argv) == 0 and launched == ["real_s0"] and not (out / "checkpoints" / "real_s0.replaced").exists()
    assert json.loads((run / "source.json").read_text()) == fingerprints.source_hash()  # the new run kept in its place
    # another warm start under the archive's name (SFT again, elsewhere): refused before anything runs
    (warm / "adapter_model.safetensors").write_text("other")
    launched.clear()
    assert cli.main(argv) == 1 and launched == []
    assert f"{kept}/warm holds other weights than {warm}" in capsys.readouterr().err
    assert (kept / "warm" / warm.name / "adapter_model.safetensors").read_text() == "w"
    step = out / "checkpoints" / "mas_s0" / "global_step_1"
    (step / "policies" / "shared").mkdir(parents=True)
    (step / "val_metrics.json").write_text("{}")
    assert not archive.keep_run(step.parent, [step], out / "logs" / "mas_s0.jsonl", out, kept)  # a full model
    assert not (kept / "checkpoints" / "mas_s0").exists()


def test_holm_adjusts_a_family_of_tests_step_down_and_leaves_untested_ones_out():
    # sorted 0.005, 0.01, 0.03, 0.04: x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> made non-decreasing: 0.06 for the last
    assert stats.holm([0.01, 0.04, 0.03, None, 0.005]) == pytest.approx([0.03, 0.06, 0.06, None, 0.02])
    assert stats.holm([0.6, 0.5]) == pytest.approx([1.0, 1.0]) and stats.holm([]) == []
    assert stats.longest_run([True, True, False, True, True, True, False]) == 3 and stats.longest_run([]) == 0


def test_the_primary_claim_travels_with_the_archive_and_a_new_machine_cannot_declare_another(tmp_path, monkeypatch, capsys):
    stand_ins(tmp_path, monkeypatch)
    out, kept = tmp_path / "out", tmp_path / "archive"
    argv = ["--methods", "per_role,control", "--seeds", "0,1", "--steps", "2", "--out", str(out), "--archive", str(kept), "--jobs", "1"]
    assert cli.main(argv) == 0
    declared = json.loads((kept / "primary.json").read_text())
    assert declared == json.loads((out / "primary.json").read_text()) and declared["claim"] == methods.PRIMARY
    shutil.rmtree(out)  # a new machine: the archive alone
    assert cli.main([*argv, "--primary", "per_role-control@test", "--splits", "test"]) == 1
    assert f"evaluations after training exist ({kept}/after/" in capsys.readouterr().err
    assert cli.main(argv) == 0  # as declared: the declaration read back from the archive, its date kept
    assert json.loads((out / "primary.json").read_text()) == declared
    assert json.loads((out / "reproduce.json").read_text())["primary"]["declared_at"] == declared["declared_at"]
