"""The reproduction's pieces: noisy demonstrations, the warm start through verl's SFT trainer, the
driver's arguments, resume bookkeeping and its table."""

import json
import math
import os
import subprocess
import sys

import pytest

from pettingllms_verl import envs
from pettingllms_verl.eval import reproduce
from pettingllms_verl.models.demos import BFS_PROGRAM, NAIVE_PROGRAM, plan_path_demos, shortest_path

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


@pytest.mark.parametrize("argv", [["--methods", "sa,bogus"], ["--seeds", "a,b"], ["--seeds", "0,0"], ["--methods", "sa,sa"],
                                  ["--episodes", "0"], ["--steps", "0"], ["--jobs", "0"]])
def test_bad_arguments_stop_before_anything_runs(argv, capsys):
    with pytest.raises(SystemExit):
        reproduce.parse_args(argv)
    assert argv[0] in capsys.readouterr().err


def test_good_arguments_are_read():
    args = reproduce.parse_args(["--methods", "sa,mas", "--seeds", "3,4"])
    assert args.methods == ["sa", "mas"] and args.seeds == [3, 4]


def test_training_runs_go_jobs_at_once_and_a_failed_one_is_reported_while_the_others_go_on(tmp_path, monkeypatch, capsys):
    import subprocess
    import threading

    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    trained = []
    two_running = threading.Barrier(2, timeout=60)  # broken (and the test failed) unless two runs train at the same time

    def main_ppo(command, **kwargs):  # stands in for main_ppo: the runs themselves go through reproduce.train
        label = next(arg for arg in command if arg.startswith("trainer.experiment_name=")).split("=repro_")[1]
        trained.append(label)
        if label in ("sa_s0", "sa_s1"):  # the first two of the three
            two_running.wait()
        return subprocess.CompletedProcess(command, 1 if label == "sa_s9" else 0)

    monkeypatch.setattr(reproduce.subprocess, "run", main_ppo)
    args = reproduce.parse_args(["--methods", "sa", "--seeds", "0,1,2", "--jobs", "2", "--out", str(tmp_path / "out")])
    reproduce.train_all(40, args, tmp_path / "out", {"sa": reproduce.warm_start(args, "sa")}, {"sa": reproduce.training_settings("sa", args)})
    assert sorted(trained) == ["sa_s0", "sa_s1", "sa_s2"]
    assert capsys.readouterr().out.count("] done in") == 3
    trained.clear()
    failing = reproduce.parse_args(["--methods", "sa", "--seeds", "9,8", "--jobs", "1", "--out", str(tmp_path / "out")])
    failed = reproduce.train_all(40, failing, tmp_path / "out", {"sa": reproduce.warm_start(failing, "sa")},
                                 {"sa": reproduce.training_settings("sa", failing)})
    assert list(failed) == ["sa_s9"] and "training sa_s9 failed (exit 1)" in failed["sa_s9"]
    assert trained == ["sa_s9", "sa_s8"]  # the run after the failed one still trained
    assert "[train sa_s9] FAILED" in capsys.readouterr().out


def test_finished_steps_reads_verls_last_file(tmp_path):
    assert reproduce.finished_steps(tmp_path) == 0
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("30\n")
    assert reproduce.finished_steps(tmp_path) == 30


def test_a_finished_run_is_kept_and_one_trained_further_or_from_another_warm_start_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    model = tmp_path / "artifacts" / "tiny_model_plan_path_team"
    model.mkdir(parents=True)
    (model / "warm_start.json").write_text('{"demonstrations_sha256": "a"}')
    args = reproduce.parse_args(["--out", str(tmp_path / "out")])
    run_dir = tmp_path / "out" / "checkpoints" / "mas_s0"
    run_dir.mkdir(parents=True)
    (run_dir / "latest_checkpointed_iteration.txt").write_text("60")
    with pytest.raises(reproduce.ReproduceError, match="mas_s0 was trained from another warm start"):
        reproduce.train("mas", 0, 60, args, tmp_path / "out", reproduce.warm_start(args, "mas"))  # a run from before warm starts were recorded
    (run_dir / "warm_start.json").write_text(json.dumps(reproduce.warm_start(args, "mas")))
    reproduce.train("mas", 0, 60, args, tmp_path / "out", reproduce.warm_start(args, "mas"))  # nothing to do: no main_ppo started
    assert "finished earlier" in capsys.readouterr().out
    with pytest.raises(reproduce.ReproduceError, match="more than --steps 30"):
        reproduce.train("mas", 0, 30, args, tmp_path / "out", reproduce.warm_start(args, "mas"))
    (model / "warm_start.json").write_text('{"demonstrations_sha256": "b"}')  # the demonstrations changed
    with pytest.raises(reproduce.ReproduceError, match="another warm start"):
        reproduce.train("mas", 0, 60, args, tmp_path / "out", reproduce.warm_start(args, "mas"))


def test_a_run_saved_with_other_training_settings_is_refused_before_anything_runs_but_how_it_validates_may_change(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    out = tmp_path / "out"
    args = lambda *sets: reproduce.parse_args(["--methods", "mas", "--seeds", "0", "--out", str(out), *(f"--set={s}" for s in sets)])  # noqa: E731
    run_dir = out / "checkpoints" / "mas_s0"
    run_dir.mkdir(parents=True)
    (run_dir / "latest_checkpointed_iteration.txt").write_text("40")
    (run_dir / "warm_start.json").write_text(json.dumps(reproduce.warm_start(args(), "mas")))
    reproduce.train("mas", 0, 40, args(), out, reproduce.warm_start(args(), "mas"))  # kept; saved before settings were recorded
    assert "not checked; the current ones recorded" in capsys.readouterr().out
    saved = reproduce.training_settings("mas", args())
    assert json.loads((run_dir / "settings.json").read_text()) == saved
    lr, batch = saved["actor_rollout_ref.actor.optim.lr"], saved["data.train_batch_size"]
    changed = args(f"actor_rollout_ref.actor.optim.lr={lr * 5}", f"data.train_batch_size={batch * 2}")
    refusal = (rf"trained with other settings .* \(saved -> now\): actor_rollout_ref.actor.optim.lr: {lr} -> {lr * 5}; "
               rf"data.train_batch_size: {batch} -> {batch * 2}\. Set them back")
    with pytest.raises(reproduce.ReproduceError, match=refusal):
        reproduce.train("mas", 0, 40, changed, out, reproduce.warm_start(changed, "mas"))

    def no_evaluation(*a, **k):
        raise AssertionError("the refusal must come before the evaluation")

    monkeypatch.setattr(reproduce, "evaluate_runs", no_evaluation)
    assert reproduce.main(["--methods", "mas", "--seeds", "0", "--out", str(out), f"--set=data.train_batch_size={batch * 2}"]) == 1
    assert "data.train_batch_size" in capsys.readouterr().err
    later = args("data.val_batch_size=8", "trainer.test_freq=20", "trainer.save_freq=10", "data.seed=3",
                 "actor_rollout_ref.rollout.val_kwargs.temperature=0.5")  # how it validates and saves; the seed is the command's
    reproduce.train("mas", 0, 40, later, out, reproduce.warm_start(later, "mas"))
    assert reproduce.changed_keys({"a": 1, "b": True, "c": [1]}, {"a": 1.0, "b": 1, "c": [1], "new": 0}) == ["a: 1 -> 1.0", "b: true -> 1"]
    (run_dir / "settings.json").write_text("{")  # cut short mid-write by hand
    with pytest.raises(reproduce.ReproduceError, match="settings.json: unreadable"):
        reproduce.train("mas", 0, 40, args(), out, reproduce.warm_start(args(), "mas"))


def test_a_resumed_run_keeps_its_whole_curve_once_though_verls_file_logger_starts_anew_at_each_launch(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    args = reproduce.parse_args(["--methods", "mas", "--out", str(tmp_path / "out")])
    checkpoints = tmp_path / "out" / "checkpoints" / "mas_s0"
    plan = iter([(1, 7, 5, 1), (6, 8, 5, 1), (6, 10, 10, 0)])  # a launch: (first step, last step logged, last saved, exit code)

    def main_ppo(command, env, **kwargs):  # as verl: the file logger opens its file with "wb"; steps after the last save are lost
        first, last, saved, code = next(plan)
        assert reproduce.finished_steps(checkpoints) == first - 1  # resumed from its last save
        with open(env["VERL_FILE_LOGGER_PATH"], "w") as log:
            log.writelines(json.dumps({"step": step, "data": {"mas/success": step / 10}}) + "\n" for step in range(first, last + 1))
            log.write('{"step": ')  # a line cut short by the kill
        (checkpoints / "latest_checkpointed_iteration.txt").write_text(str(saved))
        return subprocess.CompletedProcess(command, code)

    monkeypatch.setattr(reproduce.subprocess, "run", main_ppo)
    warm = reproduce.warm_start(args, "mas")
    for _ in range(2):  # killed twice after saving step 5
        with pytest.raises(reproduce.TrainingFailed):
            reproduce.train("mas", 0, 10, args, tmp_path / "out", warm)
    reproduce.train("mas", 0, 10, args, tmp_path / "out", warm)
    curve = [json.loads(line) for line in (tmp_path / "out" / "logs" / "mas_s0.jsonl").read_text().splitlines()]
    assert [row["step"] for row in curve] == list(range(1, 11))
    assert curve[6]["data"]["mas/success"] == 0.7
    assert not reproduce.launch_log(tmp_path / "out" / "logs", "mas_s0").exists()


def _row(label, success, swapped=False, episodes=64, **role_rewards):
    return {"label": label, "success": success, "swapped": swapped, "episodes": episodes,
            "roles": {role: {"reward_mean": reward} for role, reward in role_rewards.items()}}


def test_aggregate_reports_before_after_mean_and_spread_per_method(tmp_path):
    before = {"rows": [_row("sa", 0.1, plan=0.5), _row("mas", 0.2, plan=0.5, tool=1.0), _row("per_role", 0.25, plan=0.5, tool=1.0)]}
    after = {"rows": [_row("sa_s0", 0.1, plan=0.4), _row("sa_s1", 0.3, plan=0.6), _row("mas_s0", 0.5), _row("mas_s1", 0.7),
                      _row("per_role_s0", 0.8, plan=0.9, tool=1.2), _row("per_role_s1", 0.6, plan=0.7, tool=1.6),
                      _row("per_role_s0", 0.2, swapped=True), _row("per_role_s1", 0.4, swapped=True)]}
    table = {(r["method"], r["swapped"]): r for r in reproduce.aggregate(before, after, ["sa", "mas", "per_role"], [0, 1])}
    assert table["sa", False]["before"] == 0.1 and table["sa", False]["after_mean"] == pytest.approx(0.2)
    assert table["mas", False]["before"] == 0.2 and (table["mas", False]["after_min"], table["mas", False]["after_max"]) == (0.5, 0.7)
    assert table["per_role", False]["before"] == 0.25  # its own recipe at its warm start, not the shared policy's
    assert table["per_role", False]["after_per_seed"] == {0: 0.8, 1: 0.6}
    assert table["per_role", True]["after_mean"] == pytest.approx(0.3)
    # each role's reward before and after, averaged over seeds: a role can learn while the team does not
    assert table["per_role", False]["role_reward_before"] == {"plan": 0.5, "tool": 1.0}
    assert table["per_role", False]["role_reward_after"] == pytest.approx({"plan": 0.8, "tool": 1.4})
    assert table["sa", False]["role_reward_after"] == pytest.approx({"plan": 0.5})
    warm = {"sa": {"shared": "demos"}, "mas": {"shared": "demos"}, "per_role": {"tool_policy": "demos", "plan_policy": "planner"}}
    text = reproduce.markdown(list(table.values()), {"steps": 40, "seeds": [0, 1], "episodes": 64, "wall_s": 600, "warm_starts": warm})
    assert "MAS + AT-GRPO, a model per role: tool_policy `demos`, plan_policy `planner`." in text
    # pooled over seeds (64 episodes each): 0.7 ± sqrt(.21/128); the gain over 0.25 on 64 episodes in SE of the difference
    gain = table["per_role", False]["gain"]
    assert gain["diff"] == pytest.approx(0.45) and gain["se"] == pytest.approx(math.sqrt(0.21 / 128 + 0.1875 / 64))
    assert gain["z"] == pytest.approx(0.45 / gain["se"])
    assert table["per_role", False]["after_episodes_per_seed"] == {0: 64, 1: 64}
    assert ("| MAS + AT-GRPO, a model per role | 0.250 ± 0.054 (64) | 0.700 ± 0.041 (128) | +0.450 ± 0.068 (+6.7 SE) | 0.800 | 0.600 "
            "| plan 0.500 -> 0.800, tool 1.000 -> 1.400 |") in text
    assert "| MAS + AT-GRPO, a model per role, policies swapped | - | 0.300 ± 0.041 (128) | - | 0.200 | 0.400 | - |" in text
    png = reproduce.plot_table(list(table.values()), tmp_path)
    assert os.path.getsize(png) > 10_000
    # roles started together: the untrained per-role team is the shared one, and its row stands for it
    shared = reproduce.aggregate(before, after, ["sa", "mas", "per_role"], [0, 1], {"sa": "sa", "mas": "mas", "per_role": "mas"})
    assert [r["before"] for r in shared] == [0.1, 0.2, 0.2, 0.2]
    text = reproduce.markdown(shared, {"steps": 40, "seeds": [0, 1], "episodes": 64, "wall_s": 600, "warm_starts": warm, "before_of": {"per_role": "mas"}})
    assert "Before training, MAS + AT-GRPO, a model per role is the team of MAS + AT-GRPO, shared policy" in text


def test_a_failed_seed_is_reported_as_failed_and_left_out_and_methods_are_compared_after_training():
    before = {"rows": [_row("sa", 0.1), _row("mas", 0.5)]}
    after = {"rows": [_row("sa_s0", 0.1), _row("sa_s1", 0.2), _row("mas_s0", 0.8), _row("mas_by_problem_s0", 0.6), _row("mas_by_problem_s1", 0.6)]}
    failed = {"mas_s1": "training mas_s1 failed (exit 1); its log: x"}
    sources = {"sa": "sa", "mas": "mas", "mas_by_problem": "mas"}
    table = reproduce.aggregate(before, after, ["sa", "mas", "mas_by_problem"], [0, 1], sources, failed)
    mas = next(row for row in table if row["method"] == "mas")
    assert mas["after_pooled"] == 0.8 and mas["after_episodes"] == 64 and mas["failed_seeds"] == {1: failed["mas_s1"]}
    assert next(row for row in table if row["method"] == "mas_by_problem")["before"] == 0.5  # the shared team's warm start
    pairs = {(c["a"], c["b"]): c for c in reproduce.comparisons(table)}
    assert pairs["MAS + AT-GRPO, shared policy", "SA + GRPO"]["diff"] == pytest.approx(0.65)
    assert pairs["MAS + AT-GRPO, shared policy", "MAS + GRPO grouped by problem, shared policy"]["diff"] == pytest.approx(0.2)
    text = reproduce.markdown(table, {"steps": 40, "seeds": [0, 1], "episodes": 64, "wall_s": 60, "warm_starts": {},
                                      "comparisons": reproduce.comparisons(table)})
    assert "| MAS + AT-GRPO, shared policy | 0.500 ± 0.062 (64) | 0.800 ± 0.050 (64) | +0.300 ± 0.080 (+3.7 SE) | 0.800 | failed |" in text
    assert "**MAS + AT-GRPO, shared policy, seed 1: training failed**, left out of the figures: training mas_s1 failed" in text
    assert "- MAS + AT-GRPO, shared policy - MAS + GRPO grouped by problem, shared policy: +0.200 ± " in text


def test_a_model_per_role_is_evaluated_before_training_only_when_its_roles_start_apart():
    start = lambda model: {"model": model, "warm_start": None}  # noqa: E731
    together = {"sa": {"shared": start("demos")}, "mas": {"shared": start("demos")},
                "per_role": {"tool_policy": start("demos"), "plan_policy": start("demos")}}
    assert reproduce.before_sources(["sa", "mas", "per_role"], together) == {"sa": "sa", "mas": "mas", "per_role": "mas"}
    assert reproduce.before_sources(["per_role"], together) == {"per_role": "per_role"}  # no shared run to stand for it
    grouped = {**together, "mas_by_problem": {"shared": start("demos")}}  # grouping matters only in training
    assert reproduce.before_sources(["sa", "mas", "mas_by_problem"], grouped) == {"sa": "sa", "mas": "mas", "mas_by_problem": "mas"}
    apart = {**together, "per_role": {"tool_policy": start("demos"), "plan_policy": start("planner")}}
    assert reproduce.before_sources(["sa", "mas", "per_role"], apart) == {"sa": "sa", "mas": "mas", "per_role": "per_role"}
    other = {**together, "mas": {"shared": start("other")}}
    assert reproduce.before_sources(["mas", "per_role"], other)["per_role"] == "per_role"


def test_before_is_reused_only_for_the_same_runs_and_warm_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    model = tmp_path / "artifacts" / "tiny_model_plan_path_team"
    model.mkdir(parents=True)
    (model / "warm_start.json").write_text('{"steps": 1200}')
    args = reproduce.parse_args(["--out", str(tmp_path / "out"), "--episodes", "8"])
    specs = ["sa=plan_path_sa_grpo_repro_cpu", "mas=plan_path_mas_atgrpo_repro_cpu"]
    warm = lambda a: {m: reproduce.warm_start(a, m) for m in ("sa", "mas")}  # noqa: E731  (read again: the model may change)
    before_dir = tmp_path / "out" / "before"
    before_dir.mkdir(parents=True)
    assert reproduce.earlier_before(tmp_path / "out", specs, args, warm(args)) is None  # nothing there
    (before_dir / "results.json").write_text(json.dumps({"rows": [_row("sa", 0.1), _row("mas", 0.2)]}))
    (before_dir / "fingerprint.json").write_text(json.dumps(reproduce.fingerprint(specs, args, warm(args))))
    assert reproduce.earlier_before(tmp_path / "out", specs, args, warm(args))["rows"][1]["success"] == 0.2
    other = reproduce.parse_args(["--out", str(tmp_path / "out"), "--episodes", "16"])
    assert reproduce.earlier_before(tmp_path / "out", specs, other, warm(other)) is None  # other problems
    (model / "warm_start.json").write_text('{"steps": 600}')
    assert reproduce.earlier_before(tmp_path / "out", specs, args, warm(args)) is None  # another warm start
    (before_dir / "results.json").write_text('{"rows": [')  # cut short
    (before_dir / "fingerprint.json").write_text(json.dumps(reproduce.fingerprint(specs, args, warm(args))))
    assert reproduce.earlier_before(tmp_path / "out", specs, args, warm(args)) is None


def test_the_roles_of_a_model_per_role_can_start_apart_and_a_run_remembers_each_ones_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    for name in ("tiny_model_plan_path_team", "planner"):
        (tmp_path / "artifacts" / name).mkdir(parents=True)
        (tmp_path / "artifacts" / name / "warm_start.json").write_text(json.dumps({"name": name}))
    planner = tmp_path / "artifacts" / "planner"
    apart = reproduce.parse_args(["--methods", "per_role", "--out", str(tmp_path / "out"),
                                  "--set", f"++pettingllms.policies.plan_policy.overrides.model.path={planner}"])
    warm = reproduce.warm_start(apart, "per_role")
    assert warm["plan_policy"] == {"model": str(planner), "warm_start": {"name": "planner"}}
    assert warm["tool_policy"]["warm_start"] == {"name": "tiny_model_plan_path_team"}
    together = reproduce.parse_args(["--methods", "per_role", "--out", str(tmp_path / "out")])
    assert reproduce.warm_start(together, "per_role")["plan_policy"]["warm_start"] == {"name": "tiny_model_plan_path_team"}
    # the "before" evaluation and a finished run both belong to the warm starts they came from
    specs = ["per_role=plan_path_mas_full_repro_cpu"]
    assert (reproduce.fingerprint(specs, apart, {"per_role": warm})
            != reproduce.fingerprint(specs, together, {"per_role": reproduce.warm_start(together, "per_role")}))
    run_dir = tmp_path / "out" / "checkpoints" / "per_role_s0"
    run_dir.mkdir(parents=True)
    (run_dir / "latest_checkpointed_iteration.txt").write_text("40")
    (run_dir / "warm_start.json").write_text(json.dumps(warm))
    reproduce.train("per_role", 0, 40, apart, tmp_path / "out", reproduce.warm_start(apart, "per_role"))  # kept
    with pytest.raises(reproduce.ReproduceError, match=r"another warm start .*plan_policy .*tiny_model_plan_path_team"):
        reproduce.train("per_role", 0, 40, together, tmp_path / "out", reproduce.warm_start(together, "per_role"))


def test_the_real_model_is_not_in_the_default_methods_and_its_adapters_starts_are_part_of_its_warm_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "artifacts"))
    assert "real" not in reproduce.parse_args([]).methods  # hours on CPU: `make reproduce-real` asks for it
    for role in ("tool", "plan"):
        (tmp_path / "artifacts" / f"smollm2_135m_{role}_adapter").mkdir(parents=True)
        (tmp_path / "artifacts" / f"smollm2_135m_{role}_adapter" / "warm_start.json").write_text(json.dumps({"roles": [role]}))
    args = reproduce.parse_args(["--methods", "real", "--out", str(tmp_path / "out")])
    warm = reproduce.warm_start(args, "real")
    assert warm["tool_adapter"] == {"model": str(tmp_path / "artifacts" / "smollm2_135m_tool_adapter"), "warm_start": {"roles": ["tool"]}}
    assert warm["plan_adapter"]["warm_start"] == {"roles": ["plan"]}
    assert any(start["model"].endswith("smollm2_135m") for start in warm.values())  # the base the adapters sit on
    assert reproduce.before_sources(["mas", "real"], {"mas": reproduce.warm_start(args, "mas"), "real": warm})["real"] == "real"
