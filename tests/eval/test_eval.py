"""``pettingllms-eval`` before any run starts (bad input, one message naming what to fix), its
checkpoint choice on the val split, and reading episode logs into tables (damaged logs too).
The end-to-end evaluation of a trained checkpoint is in ``test_policies_e2e.py``."""

import json

import pytest

from pettingllms_verl.eval import results, runs
from pettingllms_verl.eval.evaluate import build_runs, expected_episodes, main, parse_args

RECIPE = "plan_path_mas_full_cpu"  # two policies on the warm-started tiny model, Plan-Path 6x6


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from pettingllms_verl.data.rows import write_parquet
    from pettingllms_verl.envs.splits import generate_splits
    from pettingllms_verl.models.tiny import build

    root = tmp_path_factory.mktemp("eval")
    build(str(root / "tiny_model_plan_path"), seed=0)
    for split, rows in generate_splits("plan_path", {"train": 2, "val": 2, "test": 2}, {"size": 6}).items():
        write_parquet(rows, str(root / "data" / "plan_path_6x6" / f"{split}.parquet"))
    return root


@pytest.fixture()
def env(artifacts, monkeypatch):
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(artifacts))
    return artifacts


def fake_step(root, step: int, groups: dict[str, dict], success: float | None = None):
    """A global_step_N folder with each group's saved model config and, optionally, its validation."""
    step_dir = root / f"global_step_{step}"
    for group, config in groups.items():
        (step_dir / "policies" / group / "huggingface").mkdir(parents=True)
        (step_dir / "policies" / group / "huggingface" / "config.json").write_text(json.dumps(config))
    if success is not None:
        metrics = {"val-core/plan_path/reward/mean@1": success, "swap/val-core/plan_path/reward/mean@1": 1.0}
        (step_dir / "val_metrics.json").write_text(json.dumps({"global_step": step, "metrics": metrics}))
    return step_dir


def error_of(capsys, *argv) -> str:
    assert main(list(argv)) == 2
    return capsys.readouterr().err


def test_checkpoint_is_chosen_on_validation_success_never_by_recency(tmp_path):
    config = {"model_type": "qwen2"}
    for step, success in ((1, 0.25), (2, 0.75), (3, 0.5), (4, None)):  # step 4: saved, never validated
        fake_step(tmp_path, step, {"g": config}, success)
    assert runs.resolve_checkpoint(str(tmp_path), "best-val").endswith("global_step_2")  # swap/ metrics do not count
    assert runs.resolve_checkpoint(str(tmp_path), "latest").endswith("global_step_4")
    fake_step(tmp_path, 5, {"g": config}, 0.75)
    assert runs.resolve_checkpoint(str(tmp_path), "best-val").endswith("global_step_5")  # a tie goes to the later step
    assert runs.resolve_checkpoint(str(tmp_path / "global_step_3"), "best-val").endswith("global_step_3")  # named: itself


def test_a_checkpoint_folder_without_validation_says_how_to_choose(tmp_path):
    fake_step(tmp_path, 1, {"g": {}})
    with pytest.raises(runs.EvalError, match="no step has val_metrics.json.*--select latest"):
        runs.resolve_checkpoint(str(tmp_path), "best-val")


def test_missing_checkpoint(env, capsys):
    err = error_of(capsys, f"{RECIPE}@{env}/no_such_run")
    assert f"checkpoint {env}/no_such_run: no such folder" in err


def test_checkpoint_of_another_model_or_other_policies(env, capsys):
    ours = json.load(open(env / "tiny_model_plan_path" / "config.json"))
    other = fake_step(env / "ckpt_other", 1, {"tool_policy": {**ours, "hidden_size": 4096}, "plan_policy": ours})
    err = error_of(capsys, f"{RECIPE}@{other}")
    assert "another model" in err and "hidden_size: 4096 vs 128" in err and "tool_policy" in err
    l0 = fake_step(env / "ckpt_l0", 1, {"shared": ours})
    err = error_of(capsys, f"{RECIPE}@{l0}")
    assert "no policy 'tool_policy'" in err and "['shared']" in err


def test_a_step_kept_as_its_adapters_alone_plays_the_recipes_base_with_each_adapter_from_the_step(env, capsys):
    """A step of an L1 run kept without verl's checkpoint (``reproduce --archive``): no resume, each
    adapter policy loaded from the step's peft export; one that lacks an adapter, or a recipe with a
    full model, is refused before anything runs."""
    recipe, ours = "plan_path_mas_lora_cpu", json.load(open(env / "tiny_model_plan_path" / "config.json"))
    step = fake_step(env / "ckpt_adapters", 1, {"lora": ours}, 0.5)
    exported = step / "policies" / "lora" / "lora_adapters"
    for name in ("tool_adapter", "plan_adapter"):
        (exported / name).mkdir(parents=True)
        (exported / name / "adapter_config.json").write_text("{}")
    assert runs.adapters_only(str(step))
    run = runs.Run("l1", recipe, runs.compose(recipe, [], runs.RECIPES_DIR), "plan_path", "x.parquet", str(step))
    args = runs.main_ppo_overrides(run, None, "/tmp/x")
    assert "trainer.resume_mode=disable" in args and not any(a.startswith("trainer.resume_from_path") for a in args)
    played = runs.compose(recipe, args, runs.RECIPES_DIR)
    assert {name: played.pettingllms.policies[name].adapter.path for name in ("tool_adapter", "plan_adapter")} == {
        name: str(exported / name) for name in ("tool_adapter", "plan_adapter")}
    runs.check_checkpoint(str(step), run.config, recipe)  # whole: no error
    (step / "policies" / "lora" / "model_world_size_1_rank_0.pt").write_bytes(b"")  # verl's checkpoint beside it: resumed from
    assert not runs.adapters_only(str(step)) and f"trainer.resume_from_path={step}" in runs.main_ppo_overrides(run, None, "/tmp/x")
    (step / "policies" / "lora" / "model_world_size_1_rank_0.pt").unlink()
    (exported / "plan_adapter" / "adapter_config.json").unlink()
    assert "needs adapters ['plan_adapter'] it lacks" in error_of(capsys, f"{recipe}@{step}")
    assert "has full-model policies (plan_policy, tool_policy)" in error_of(capsys, f"{RECIPE}@{step}")


def test_unknown_environment_recipe_and_split(env, capsys):
    err = error_of(capsys, "--envs", "plan_pth")
    assert "unknown environment 'plan_pth'" in err and "plan_path" in err.split("environments:")[1]
    err = error_of(capsys, "plan_path_mas_ful_cpu")
    assert "recipe 'plan_path_mas_ful_cpu'" in err and "did you mean plan_path_mas_full_cpu" in err
    err = error_of(capsys, RECIPE, "--split", "holdout")
    assert "--split holdout" in err and "holdout.parquet does not exist" in err


@pytest.mark.parametrize("label", ["..", ".", "/home/me", "a/b", "x y"])
def test_a_label_that_is_no_folder_name_is_refused_before_anything_is_cleared(env, capsys, label):
    """A run's folder, --out/runs/<label>, is cleared before it plays: '..' was the whole --out
    folder, an absolute label a folder anywhere."""
    assert f"run label {label!r}: use letters, digits" in error_of(capsys, f"{label}={RECIPE}")


def test_missing_model_names_how_to_get_it(env, capsys):
    err = error_of(capsys, RECIPE, "--set", f"actor_rollout_ref.model.path={env}/smollm2_135m")
    assert f"no model at {env}/smollm2_135m" in err and "make real-model" in err


def test_swap_must_name_two_policies_of_the_recipe(env, capsys):
    err = error_of(capsys, RECIPE, "--swap", "tool_policy,judge")
    assert "--swap tool_policy,judge" in err and "['plan_policy', 'tool_policy']" in err


def episode(seed, success, samples, **extra):
    return {"env": "plan_path", "seed": seed, "success": success, "validate": True, "turns": 1, "samples": samples, **extra}


def sample(role, reward, parse_ok, chosen=True, placeholder=False):
    return {"role": role, "local_reward": reward, "parse_ok": parse_ok, "chosen": chosen, "placeholder": placeholder}


def test_summary_counts_chosen_replies_per_role():
    records = [
        episode(1, True, [sample("tool", 1.0, True), sample("tool", -9.0, False, chosen=False), sample("plan", 0.5, True)]),
        episode(2, False, [sample("tool", 0.0, False), sample("plan", 0.0, True, placeholder=True)], end_cause="env_error"),
    ]
    summary = results.summarize(records)
    assert (summary["episodes"], summary["success"], summary["end_causes"]) == (2, 0.5, {"env_error": 1})
    assert summary["faults"] == {"env_error": 1}
    truncated = results.summarize([episode(3, False, [], end_cause="max_turns")])
    assert truncated["end_causes"] == {"max_turns": 1} and truncated["faults"] == {}  # running out of turns is no fault
    assert summary["success_se"] == pytest.approx(0.5 / 2 ** 0.5)
    assert summary["roles"]["tool"] == {"replies": 2, "reward_mean": 0.5, "parse_failure_rate": 0.5}  # the unchosen branch does not count
    assert summary["roles"]["plan"] == {"replies": 1, "reward_mean": 0.5, "parse_failure_rate": 0.0}  # nor the placeholder


def test_pass_at_k_is_chens_unbiased_estimator():
    """Hand-computed: 1 - C(n - c, k) / C(n, k)."""
    assert results.pass_at_k(4, 1, 1) == 0.25 and results.pass_at_k(4, 0, 4) == 0.0 and results.pass_at_k(4, 1, 4) == 1.0
    assert results.pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)
    assert results.pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)
    assert results.pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)
    for bad in ((4, 1, 5), (4, 5, 2), (4, 1, 0)):
        with pytest.raises(ValueError, match="need 0 < k <= n"):
            results.pass_at_k(*bad)


def test_samples_per_problem_give_avg_at_n_and_pass_at_k_over_problems_on_a_fixed_log():
    """Three problems, four episodes each: 1, 2 and 0 solved; a fourth problem lost two of its episodes
    (a killed run), so it counts for pass@1 and pass@2 but is short for pass@4."""
    wins = {1: [True, False, False, False], 2: [False, True, True, False], 3: [False] * 4, 4: [True, False]}
    records = [episode(seed, won, []) for seed, outcomes in wins.items() for won in outcomes]
    summary = results.summarize(records, [1, 2, 4])
    got = summary["sampled"]
    assert (got["samples"], got["problems"]) == (4, 4)  # n: what was asked; a problem short of it is counted below
    assert got["avg"] == pytest.approx((0.25 + 0.5 + 0 + 0.5) / 4)
    assert got["avg_se"] == pytest.approx(((0.0625 ** 2 + 0.1875 ** 2 + 0.3125 ** 2 + 0.1875 ** 2) / 3) ** 0.5 / 2)
    assert got["pass"]["1"]["value"] == pytest.approx(got["avg"])  # pass@1 from n samples is avg@n
    pass2 = [0.5, 5 / 6, 0.0, 1.0]
    mean2 = sum(pass2) / 4
    assert got["pass"]["2"]["value"] == pytest.approx(mean2)
    assert got["pass"]["2"]["se"] == pytest.approx((sum((v - mean2) ** 2 for v in pass2) / 3) ** 0.5 / 2)
    assert got["pass"]["4"] == {"value": pytest.approx(2 / 3), "se": pytest.approx((1 / 3) ** 0.5 / 3 ** 0.5), "problems": 3, "short": 1}
    assert "sampled" not in results.summarize(records)  # one episode per problem: no pass@k asked
    row = {"label": "l2", "method": "MAS", "step": 3, "env": "plan_path", **summary, "swapped": False}
    table = results.markdown([row], "test")
    assert "| success | pass@1 | pass@2 | pass@4 | faults |" in table and f"| {len(records)} (4 × 4) | 0.312 ± 0." in table
    assert f"| {mean2:.3f} ± " in table and "| 0.667 ± 0.333 (1 problems short) |" in table and "success is avg@n" in table


def test_samples_and_pass_k_are_checked_before_anything_runs(env, capsys):
    """n below k, a k of 0, greedy validation (the n episodes would be one): each refused, naming the flag."""
    for argv, said in (((RECIPE, "--samples", "4", "--pass-k", "2,8"), "--pass-k 2,8: each k must be between 1 and --samples (4)"),
                       ((RECIPE, "--pass-k", "2"), "--pass-k 2: each k must be between 1 and --samples (1)"),
                       ((RECIPE, "--samples", "4", "--pass-k", "0"), "--pass-k 0: each k must be between 1"),
                       ((RECIPE, "--samples", "2", "--pass-k", "one"), "--pass-k one: give whole numbers"),
                       ((RECIPE, "--samples", "0"), "--samples 0: need at least 1")):
        with pytest.raises(SystemExit):
            main(list(argv))
        assert said in capsys.readouterr().err
    err = error_of(capsys, RECIPE, "--samples", "3")
    assert "--samples 3: run plan_path_mas_full_cpu validates greedily (actor_rollout_ref.rollout.val_kwargs.temperature=0.0" in err
    assert "--set actor_rollout_ref.rollout.val_kwargs.temperature=1.0" in err
    err = error_of(capsys, RECIPE, "--samples", "3", "--set", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
                   "--set", "actor_rollout_ref.rollout.val_kwargs.n=2")
    assert "--samples 3 and --set actor_rollout_ref.rollout.val_kwargs.n=2 disagree" in err
    # sampled: every episode of a problem played in one validation batch, n of them (the progress bar counts them all)
    args = parse_args([RECIPE, "--samples", "3", "--set", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0"])
    (run,) = build_runs(args)
    assert args.pass_k == [1, 3] and run.config.actor_rollout_ref.rollout.val_kwargs.n == 3
    assert run.config.actor_rollout_ref.rollout.val_kwargs.do_sample is True and expected_episodes(run, None) == 2 * 3 * 2  # swapped too
    played = runs.compose(RECIPE, runs.main_ppo_overrides(run, None, "/tmp/x"), runs.RECIPES_DIR)
    assert played.actor_rollout_ref.rollout.val_kwargs.n == 3 and played.actor_rollout_ref.rollout.val_kwargs.temperature == 1.0


def test_damaged_logs(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(results.LogError, match="empty.jsonl: no records"):
        results.read_jsonl(str(empty))
    good = json.dumps(episode(1, True, []))
    cut = tmp_path / "cut.jsonl"
    cut.write_text(good + "\n" + good[:20])  # its writer killed mid-line: the last line is skipped
    assert len(results.read_jsonl(str(cut))) == 1 and "cut.jsonl:2: last line cut short" in capsys.readouterr().err
    broken = tmp_path / "broken.jsonl"
    broken.write_text(good[:20] + "\n" + good + "\n")
    with pytest.raises(results.LogError, match="broken.jsonl:1: not a JSON line"):
        results.read_jsonl(str(broken))
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"step": 1, "data": {}}) + "\n")
    with pytest.raises(results.LogError, match=r"other.jsonl:1: a record without \['env', 'seed', 'success', 'samples'\]"):
        results.read_jsonl(str(other))
    with pytest.raises(results.LogError, match="no episodes-\\*.jsonl files"):
        results.read_episode_dir(str(tmp_path))


def test_markdown_table_has_a_column_per_role_and_marks_swapped_runs_and_faults():
    row = {"label": "l2", "env": "plan_path", "method": "MAS (per-role policies, full models)", "step": 3, "episodes": 4,
           "success": 0.25, "success_se": 0.2166, "roles": {"tool": {"reward_mean": 0.1, "parse_failure_rate": 0.5}}, "faults": {}}
    table = results.markdown([dict(row, swapped=False), dict(row, swapped=True, faults={"env_error": 1, "engine_error": 2})], "test")
    assert "| method | run | weights | episodes | success | faults | tool reward | tool parse fail |" in table
    assert "| MAS (per-role policies, full models) | l2 | step 3 | 4 | 0.250 ± 0.217 | none | 0.100 | 0.50 |" in table
    assert ("| MAS (per-role policies, full models) swapped | l2 | step 3 | 4 | 0.250 ± 0.217 (faults) | engine_error 2, env_error 1 "
            "| 0.100 | 0.50 |") in table


def test_plots_draw_each_metric_per_run_with_seeds_as_a_band(tmp_path):
    import warnings

    from PIL import Image

    from pettingllms_verl.eval import plots

    def log(path, success, roles, faulted_step=None):
        with open(path, "w") as f:
            for step in (1, 2, 3):
                data = {"mas/success": success * step, "mas/parse_failure_rate": 0.5 / step, "at_grpo/zero_variance_frac": 0.1,
                        "timing_s/step": 3.0, "mas/fault_share": 0.25 if step == faulted_step else 0.0,
                        **{f"mas/{r}/reward_mean": 0.1 * step for r in roles}}
                if step != 2:  # validation every other step, as verl's test_freq logs it
                    data["val-core/plan_path/reward/mean@1"] = success
                f.write(json.dumps({"step": step, "data": data}) + "\n")
        return str(path)

    runs = {"sa": [log(tmp_path / "sa0.jsonl", 0.1, ["plan"]), log(tmp_path / "sa1.jsonl", 0.2, ["plan"], faulted_step=2)],
            "mas": [log(tmp_path / "mas0.jsonl", 0.3, ["plan", "tool"])]}
    ppo = tmp_path / "ppo0.jsonl"  # PPO's run: a critic, no AT-GRPO groups
    ppo.write_text("".join(json.dumps({"step": step, "data": {"mas/success": 0.5, "critic/vf_loss": 1.0 / step, "critic/vf_explained_var": 0.2 * step}}) + "\n"
                           for step in (1, 2, 3)))
    runs["ppo"] = [str(ppo)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's "Mean of empty slice" at a step without validation
        path, legends = plots.plot_curves(runs, str(tmp_path))
    # a step where faults ended episodes (in any seed) is marked; a run without faults has no mark
    assert legends["team success"] == ["sa: train success (2 seeds)", "sa: val success (2 seeds)", "sa: episodes ended by a fault",
                                       "mas: train success", "mas: val success", "ppo: train success"]
    assert legends["role reward (mean)"] == ["sa: plan (2 seeds)", "mas: plan", "mas: tool"]
    assert legends["AT-GRPO groups, critic"] == ["sa: zero_variance_frac (2 seeds)", "mas: zero_variance_frac", "ppo: vf_explained_var", "ppo: vf_loss"]
    assert Image.open(path).size == (1320, 880)

    rows = [{"env": "plan_path", "label": "base", "method": "SA", "step": None, "success": 0.2, "success_se": 0.1},
            {"env": "plan_path", "label": "team", "method": "MAS (shared policy)", "step": 10, "success": 0.6, "success_se": 0.1}]
    (tmp_path / "results.json").write_text(json.dumps({"split": "test", "rows": rows}))
    assert main_plots(["--results", str(tmp_path / "results.json"), "--out", str(tmp_path / "out")]) == 0
    assert Image.open(tmp_path / "out" / "success_by_method.png").format == "PNG"


def test_plots_refuse_missing_and_empty_logs(tmp_path, capsys):
    assert main_plots(["--curves", f"sa={tmp_path}/nope.jsonl", "--out", str(tmp_path)]) == 2
    assert f"no file {tmp_path}/nope.jsonl" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    assert main_plots(["--curves", str(tmp_path / "empty.jsonl"), "--out", str(tmp_path)]) == 2
    assert "empty.jsonl: no records" in capsys.readouterr().err


def main_plots(argv):
    from pettingllms_verl.eval.plots import main as plots_main

    return plots_main(argv)


def test_on_cpu_the_evaluation_gives_the_rollout_server_every_core_and_a_set_still_wins(env):
    """An evaluation trains nothing: the hf server takes every core instead of the one it keeps in
    training; a GPU recipe (vLLM) is left alone."""
    key = "actor_rollout_ref.rollout.engine_kwargs.hf.torch_threads"
    user = f"{key}=1"
    cpu = runs.Run("l", RECIPE, runs.compose(RECIPE, [], runs.RECIPES_DIR), "plan_path", "x.parquet", None, [user])
    args = runs.main_ppo_overrides(cpu, None, "/tmp/x")
    assert args.index(f"++{key}={runs.usable_cores()}") < args.index(user)  # Hydra applies the later one: the user's
    # two evaluations at once share the cores
    assert f"++{key}={max(1, runs.usable_cores() // 2)}" in runs.main_ppo_overrides(cpu, None, "/tmp/x", jobs=2)
    gpu_recipe = "plan_path_mas_atgrpo_qwen3_1p7b"
    gpu = runs.Run("g", gpu_recipe, runs.compose(gpu_recipe, [], runs.RECIPES_DIR), "plan_path", "x.parquet", None)
    assert not any("torch_threads" in arg for arg in runs.main_ppo_overrides(gpu, None, "/tmp/x"))


def test_episodes_n_plays_the_splits_first_n_problems_in_every_run(env, tmp_path):
    """``--episodes N`` through verl's own dataset: the first N problems, the same in every run. With
    verl's default ``data.shuffle=true`` the subset was drawn unseeded, so two runs (a policy and its
    swap, a method and its baseline) played different problems."""
    from transformers import AutoTokenizer
    from verl.trainer.ppo.utils import create_rl_dataset

    from pettingllms_verl.data.rows import write_parquet
    from pettingllms_verl.envs.splits import generate_splits

    rows = generate_splits("plan_path", {"train": 1, "val": 1, "test": 40}, {"size": 6})["test"]
    write_parquet(rows, str(tmp_path / "test.parquet"))
    run = runs.Run("l", RECIPE, runs.compose(RECIPE, [], runs.RECIPES_DIR), "plan_path", str(tmp_path / "test.parquet"), None)
    played = runs.compose(RECIPE, runs.main_ppo_overrides(run, 3, "/tmp/x"), runs.RECIPES_DIR)
    tokenizer = AutoTokenizer.from_pretrained(str(env / "tiny_model_plan_path"))
    first = [row["extra_info"]["seed"] for row in rows[:3]]
    for _ in range(3):
        dataset = create_rl_dataset(played.data.val_files, played.data, tokenizer, None, is_train=False, max_samples=played.data.val_max_samples)
        assert [dataset.dataframe[i]["extra_info"]["seed"] for i in range(len(dataset.dataframe))] == first


def test_swap_none_plays_no_swapped_pass_even_where_the_recipe_validates_swapped(env):
    """plan_path_mas_full_repro_cpu sets swap_policies for its validation in training; --swap none
    must drop it (before, its swapped episodes were played, doubling the run, and never reported)."""
    recipe = "plan_path_mas_full_repro_cpu"
    config = runs.compose(recipe, [], runs.RECIPES_DIR)
    assert list(config.pettingllms.swap_policies) == ["tool_policy", "plan_policy"]
    for swap, expected in ((None, None), (["plan_policy", "tool_policy"], ["plan_policy", "tool_policy"])):
        run = runs.Run("l", recipe, config, "plan_path", "x.parquet", None, [], swap)
        played = runs.compose(recipe, runs.main_ppo_overrides(run, None, "/tmp/x"), runs.RECIPES_DIR)
        assert (played.pettingllms.swap_policies and list(played.pettingllms.swap_policies)) == expected


def test_jobs_play_runs_at_once_and_report_them_in_the_order_given(env, monkeypatch, capsys):
    import threading

    from pettingllms_verl.eval import evaluate

    both_running = threading.Barrier(2, timeout=60)  # broken (and the test failed) unless a and b play at the same time

    def play(run, args, out, bar_position=0):
        if run.label == "c":
            raise runs.EvalError("run c: main_ppo exited with 1")
        both_running.wait()
        return 1.0

    written = {}
    monkeypatch.setattr(evaluate, "play", play)
    monkeypatch.setattr(evaluate, "collect", lambda run, out, wall_s, ks: ([{"label": run.label}], [{"run": run.label}]))
    monkeypatch.setattr(evaluate, "write_outputs", lambda out, rows, records, split: written.update(rows=rows))
    monkeypatch.setattr(evaluate.results, "markdown", lambda rows, split: "")
    argv = [f"{label}={RECIPE}" for label in ("c", "b", "a")] + ["--jobs", "2", "--out", str(env / "out")]
    assert main(argv) == 1  # c failed: said, and the others still reported
    assert [row["label"] for row in written["rows"]] == ["b", "a"]
    assert "failed runs: c" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([RECIPE, "--jobs", "0"])
    assert "--jobs 0: need at least 1" in capsys.readouterr().err


def test_progress_lines_of_runs_going_at_once_stay_whole(monkeypatch):
    import io
    import sys
    import threading
    import time

    from pettingllms_verl.eval import evaluate

    class Slow(io.StringIO):  # a terminal that lets other threads in between writes, as a busy machine does
        def write(self, text):
            time.sleep(0.001)
            return super().write(text)

    stream = Slow()
    monkeypatch.setattr(sys, "stdout", stream)
    threads = [threading.Thread(target=lambda n=n: [evaluate.say(f"[run {n}] line {i}") for i in range(20)]) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = stream.getvalue().splitlines()
    assert sorted(lines) == sorted(f"[run {n}] line {i}" for n in range(4) for i in range(20))  # print() interleaves here


def test_an_evaluation_of_a_gae_recipe_builds_no_critic(env):
    """An evaluation trains nothing: a PPO recipe's value models are neither built nor read from
    its checkpoint, and the preflight accepts gae without a critic there (and only there)."""
    from omegaconf import open_dict
    from verl.trainer.ppo.utils import need_critic

    from pettingllms_verl.config import load
    from pettingllms_verl.preflight import ConfigError
    from pettingllms_verl.preflight.training import _check_team_estimator

    gae = ["algorithm.adv_estimator=gae"]
    run = runs.Run("l", RECIPE, runs.compose(RECIPE, gae, runs.RECIPES_DIR), "plan_path", "x.parquet", None, gae)
    played = runs.compose(RECIPE, runs.main_ppo_overrides(run, None, "/tmp/x"), runs.RECIPES_DIR)
    assert played.algorithm.adv_estimator == "gae" and not need_critic(played)
    _check_team_estimator(played, load(played.pettingllms))
    with open_dict(played):
        played.trainer.val_only = False
    with pytest.raises(ConfigError, match="false with gae"):
        _check_team_estimator(played, load(played.pettingllms))


@pytest.mark.parametrize("policies, method", [
    ({}, "shared policy"),
    ({"tool_policy": {}, "plan_policy": {}}, "per-role policies, full models"),
    ({"tool_policy": {"adapter": {"rank": 8}}, "plan_policy": {"adapter": {"rank": 8}}}, "per-role policies, LoRA"),
    ({"tool_policy": {}, "plan_policy": {"adapter": {"rank": 8}}}, "per-role policies, mixed"),
])
@pytest.mark.parametrize("program", [None, "team.py:team"])
def test_the_table_names_a_team_by_its_policies_and_a_program_as_a_program(policies, method, program):
    from omegaconf import OmegaConf

    roles = {"tool": {"policy": "tool_policy"}, "plan": {"policy": "plan_policy"}} if policies else {"tool": {}, "plan": {}}
    cfg = OmegaConf.create({"pettingllms": {"roles": roles, "policies": policies, "program": {"target": program}}})
    assert runs.method_of(cfg) == f"{'program' if program else 'MAS'} ({method})"


def test_a_team_of_two_model_families_is_swapped_only_when_asked_and_then_allowed_across(env):
    """plan_path_mas_full_cpu with tool_policy on a second tokenizer family: no swapped pass by
    default; ``--swap`` naming the pair plays it, with the switch that lets two families swap."""
    from pettingllms_verl.models.tiny import build

    bracket = build(str(env / "tiny_model_bracket"), seed=0, family="bracket")
    overrides = [f"+pettingllms.policies.tool_policy.overrides.model.path={bracket}"]
    config = runs.compose(RECIPE, overrides, runs.RECIPES_DIR)
    assert runs.swap_pair(config, None) is None
    assert runs.swap_pair(runs.compose(RECIPE, [], runs.RECIPES_DIR), None) == ["plan_policy", "tool_policy"]  # one family: swapped
    pair = runs.swap_pair(config, ["tool_policy", "plan_policy"])
    run = runs.Run("l", RECIPE, config, "plan_path", "x.parquet", None, overrides, pair)
    played = runs.compose(RECIPE, runs.main_ppo_overrides(run, None, "/tmp/x"), runs.RECIPES_DIR)
    assert list(played.pettingllms.swap_policies) == ["tool_policy", "plan_policy"] and played.pettingllms.swap_across_families
