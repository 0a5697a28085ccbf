"""A LoRA adapter per role on one base model (L1) end to end through `python -m
verl.trainer.main_ppo` on CPU: routing by adapter, isolation of the adapters and the base,
per-adapter optimizer state and LR schedule, peft export, kill-and-resume, a frozen adapter and
the swapped-policy switch, checked on what the run served, trained and saved."""


import pytest
import torch
from safetensors.torch import load_file

from support.checkpoints import adapter_tensors, base_tensors, initial_params, saved_group
from support.runs import assert_three_steps_with_metrics_per_policy, dumped_rows, resume_step_4, run_killed_in_step_4, run_recipe

pytestmark = pytest.mark.slow
RECIPE = "plan_path_mas_lora_cpu"
POLICY_OF = {"tool": "tool_adapter", "plan": "plan_adapter"}  # its roles' adapters
K_MINI_BATCHES = 2  # its pettingllms.trainer.mini_batches_per_step
LR, WARMUP = 2e-3, 10  # its actor LR; the warm-up steps of the first run


@pytest.fixture(scope="module")
def l1_run(artifacts):
    """3 steps; greedy tool replies: every tool group ties, so all of tool_adapter's rows have zero
    advantage (with no weight decay its adapter must not move while plan_adapter trains). A 10-step
    LR warm-up shows each adapter's own schedule position. SIGKILLed in step 4, which
    test_sigkill_mid_step_then_resume_continues_every_adapter_and_validates_them_swapped resumes."""
    dump = artifacts / "l1_batches"
    metrics = run_killed_in_step_4(
        artifacts, RECIPE, f"pettingllms.paths.batch_dump_dir={dump}", f"actor_rollout_ref.actor.optim.lr_warmup_steps={WARMUP}",
        "+pettingllms.roles.tool.sampling.temperature=0", "actor_rollout_ref.actor.optim.weight_decay=0",
    )
    return metrics, dumped_rows(dump, through=3)


def test_l1_runs_three_steps_with_metrics_per_adapter(l1_run):
    metrics, _ = l1_run
    assert_three_steps_with_metrics_per_policy(metrics, POLICY_OF.values())
    for m in metrics:
        for adapter in POLICY_OF.values():
            # one schedule step per adapter per training step: a shared schedule would be at 2 x step
            assert m["data"][f"policy/{adapter}/actor/lr"] == pytest.approx(LR * m["step"] / WARMUP)


def test_every_request_was_served_with_its_roles_adapter(l1_run):
    _, rows = l1_run
    assert {row["mas_role"] for row in rows} == set(POLICY_OF)
    for row in rows:
        # mas_served_by is the adapter name the hf server stamped on its reply (server side)
        assert row["mas_policy"] == POLICY_OF[row["mas_role"]]
        assert row["mas_served_by"] == [row["mas_policy"]]


def test_an_adapter_changes_only_through_its_own_rows_and_the_base_never_changes(l1_run, artifacts):
    _, rows = l1_run
    assert all(row["advantage"] == 0.0 for row in rows if row["mas_role"] == "tool")
    assert any(row["advantage"] != 0.0 for row in rows if row["mas_role"] == "plan")
    checkpoints = artifacts / "checkpoints" / RECIPE
    # (the recipe keeps the last two checkpoints)
    first, last = saved_group(checkpoints / "global_step_2"), saved_group(checkpoints / "global_step_3")
    tool_1, tool_3 = adapter_tensors(first["params"], "tool_adapter"), adapter_tensors(last["params"], "tool_adapter")
    assert tool_1 and all(torch.equal(tool_1[name], tool_3[name]) for name in tool_1)
    # lora_B starts at zero: an update through any row of another role would have moved it
    assert all(not t.any() for name, t in tool_3.items() if "lora_B" in name)
    plan_1, plan_3 = adapter_tensors(first["params"], "plan_adapter"), adapter_tensors(last["params"], "plan_adapter")
    assert any(not torch.equal(plan_1[name], plan_3[name]) for name in plan_1)
    assert any(t.any() for name, t in plan_3.items() if "lora_B" in name)
    start = initial_params(artifacts / "tiny_model_plan_path")
    base = base_tensors(last["params"])
    assert len(base) >= len([n for n in start if n != "lm_head.weight"])
    assert all(torch.equal(base[name], start[name]) for name in base)


def test_each_adapter_is_checkpointed_by_name_with_its_optimizer_state_schedule_and_a_peft_export(l1_run, artifacts):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    saved = saved_group(artifacts / "checkpoints" / RECIPE / "global_step_3")
    # one optimizer group per adapter; mini_batches_per_step=2: exactly 2 Adam steps per training step
    assert saved["adam_steps"] == {adapter: {3 * K_MINI_BATCHES} for adapter in POLICY_OF.values()}
    assert saved["schedules"] == {adapter: 3 for adapter in POLICY_OF.values()}  # one LR-schedule step per adapter per step
    for adapter in POLICY_OF.values():
        export = saved["folder"] / "lora_adapters" / adapter
        exported = load_file(export / "adapter_model.safetensors")
        trained = {name.replace(f".{adapter}.", "."): t for name, t in adapter_tensors(saved["params"], adapter).items()}
        assert exported.keys() == trained.keys() and all(torch.equal(exported[n], trained[n]) for n in trained)
        # servable on its own: peft loads it onto the base model
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(artifacts / "tiny_model_plan_path")), str(export))
        loaded = {n.replace(".default.", "."): t for n, t in model.state_dict().items() if "lora_" in n}
        assert all(torch.equal(loaded[n], trained[n]) for n in trained)


def test_sigkill_mid_step_then_resume_continues_every_adapter_and_validates_them_swapped(l1_run, artifacts):
    """Each adapter's Adam state and LR-schedule step continue from the checkpoint and the replica
    serves the loaded adapters; the resumed run validates twice with the swapped-policy switch on: as
    trained, and each role served by the other's adapter."""
    metrics = resume_step_4(artifacts, RECIPE, "trainer.test_freq=4", "+pettingllms.swap_policies=[tool_adapter,plan_adapter]")
    for adapter in POLICY_OF.values():
        assert metrics[-1]["data"][f"policy/{adapter}/training/rollout_probs_diff_mean"] < 1e-5  # loaded adapters synced
    saved = saved_group(artifacts / "checkpoints" / RECIPE / "global_step_4")
    assert saved["adam_steps"] == {adapter: {4 * K_MINI_BATCHES} for adapter in POLICY_OF.values()}
    assert saved["schedules"] == {adapter: 4 for adapter in POLICY_OF.values()}
    validation = [key for m in metrics for key in m["data"] if "val-" in key]
    assert any(key.startswith("swap/val-core/") for key in validation) and any(key.startswith("val-core/") for key in validation)


def test_a_step_kept_as_its_adapters_alone_is_evaluated_through_main_ppo_with_each_adapter_from_it(l1_run, artifacts):
    """What ``reproduce --archive`` keeps of an L1 run (its validation and each adapter's peft export, not
    verl's checkpoint) plays through ``pettingllms-eval``: the recipe's base with each adapter loaded from
    the step, each role served by its own adapter. Played with ``--samples 3``: each problem three times
    in one validation batch, sampled, reported as avg@3 and pass@k."""
    import json
    import os
    import shutil
    import sys

    from support import launch
    from support import RECIPES

    step = artifacts / "checkpoints" / RECIPE / "global_step_4"  # validated (test_freq=4) by the resumed run
    slim = artifacts / "adapters_only" / "global_step_4"
    shutil.copytree(step / "policies" / "lora" / "lora_adapters", slim / "policies" / "lora" / "lora_adapters")
    shutil.copy2(step / "val_metrics.json", slim / "val_metrics.json")
    out = artifacts / "eval_adapters_only"
    result = launch.run(
        [sys.executable, "-m", "pettingllms_verl.eval", f"l1={RECIPE}@{slim.parent}", "--episodes", "2", "--swap", "none",
         "--samples", "3", "--pass-k", "1,2", "--set", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
         "--out", str(out), "--recipes", RECIPES],
        timeout=1200, cwd=artifacts, env={**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = json.load(open(out / "results.json"))["rows"]
    assert row["step"] == 4 and row["episodes"] == 6
    sampled = row["sampled"]
    assert (sampled["problems"], sampled["samples"], sorted(sampled["pass"])) == (2, 3, ["1", "2"])
    assert sampled["pass"]["1"]["value"] == pytest.approx(sampled["avg"]) and sampled["pass"]["2"]["value"] >= sampled["avg"]
    assert "| 6 (2 × 3) |" in (out / "results.md").read_text()
    log = (out / "runs" / "l1" / "main_ppo.log").read_text()
    for name in POLICY_OF.values():
        assert str(slim / "policies" / "lora" / "lora_adapters" / name) in log  # the adapter it started from
    episodes = [json.loads(line) for line in open(out / "episodes.jsonl")]
    for episode in episodes:
        assert episode["served_by"] == {role: [policy] for role, policy in POLICY_OF.items()}
    seeds = [episode["seed"] for episode in episodes]
    assert len(set(seeds)) == 2 and all(seeds.count(seed) == 3 for seed in seeds)
    replies = {seed: {tuple(s["reply"] for s in e["samples"]) for e in episodes if e["seed"] == seed} for seed in seeds}
    assert any(len(played) > 1 for played in replies.values())  # sampled: a problem's episodes differ


@pytest.fixture(scope="module")
def code_artifacts(artifacts, warm_model):
    """The tiny model warm-started on code replies, and problems on which every warm-start program
    (``tiny.STDIN_PROGRAMS``) passes a test: ``1`` -> ``1`` (echo, reverse, length, sum, max) and
    ``2 1`` -> ``2`` (product, max). A passing program then does not hang on sampling luck: with the
    echo problems of before, about 1 sampled program in 20 passed a test (9 of 192 samples), and in
    one CI run all 48 coder replies failed."""
    from pettingllms_verl import envs
    from pettingllms_verl.data.sources import disjoint_splits, write_splits
    from pettingllms_verl.models.tiny import STDIN_PROGRAMS, _python

    warm_model("code", artifacts / "tiny_model_code")
    lines = ["7", "3 5", "9 2", "4", "1 8", "6 6", "2", "5 1"]
    largest = [{"problem": f"Print the largest number on the line (set {i}).", "solution": "print(max(map(int, input().split())))",
                "tests": [{"input": f"{line}\n", "output": f"{max(map(int, line.split()))}\n"} for line in ("1", "2 1", lines[i])]}
               for i in range(8)]
    for program in STDIN_PROGRAMS:
        code_env = envs.make("code")
        code_env.reset(seed=0, task=largest[0])
        assert code_env.step("coder", _python(program)).local_reward > 0, program  # the warm start's reply
    write_splits(disjoint_splits("code", largest[2:], largest[:2], None, None, val=2), str(artifacts / "data" / "code_fixture"), "code_artifacts")
    return artifacts


def test_code_team_in_the_sandbox_with_a_frozen_tester_adapter(code_artifacts):
    """code_mas_lora_cpu: the team's programs run in the sandbox of a Ray worker and their pass
    rates reach the batch; the coder's adapter learns, the tester's (trainable: false) generates and
    is never updated: no optimizer state, no schedule step, lora_B still zero after 3 steps. Old
    log-probs are the rollout's (verl's bypass mode, as the SmolLM2 LoRA recipe): no forward recomputes
    them, and each adapter's update runs on them."""
    from pettingllms_verl.envs.base import PARSE_PENALTY

    dump = code_artifacts / "code_lora_batches"
    # with a KL term: the reference policy is the base with every adapter off (verl's no_lora_adapter)
    metrics = run_recipe(code_artifacts, "code_mas_lora_cpu", f"pettingllms.paths.batch_dump_dir={dump}", "actor_rollout_ref.actor.use_kl_loss=true",
                         "algorithm.rollout_correction.bypass_mode=true")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["data"]["policy/tester_adapter/rows"] > 0 and m["data"]["policy/coder_adapter/rows"] > 0
        assert "policy/coder_adapter/actor/grad_norm" in m["data"] and "policy/tester_adapter/actor/grad_norm" not in m["data"]
        # bypassed: the recomputing forward, which measures the rollout-vs-actor gap and the entropy, did not run
        assert not any(key.endswith(("rollout_probs_diff_max", "actor/entropy")) for key in m["data"])
        assert m["data"]["policy/coder_adapter/actor/kl_loss"] >= 0.0
    assert metrics[-1]["data"]["policy/coder_adapter/actor/kl_loss"] > 0.0  # the trained adapter left the base
    rows = dumped_rows(dump)
    assert {(row["mas_role"], row["mas_policy"]) for row in rows} == {("tester", "tester_adapter"), ("coder", "coder_adapter")}
    assert all(row["mas_served_by"] == [row["mas_policy"]] for row in rows)
    for row in rows:
        reward = row["mas_local_reward"]
        assert reward == PARSE_PENALTY if not row["mas_parse_ok"] else 0.0 <= reward <= 1.0
    coder = [row for row in rows if row["mas_role"] == "coder"]
    assert sum(row["mas_parse_ok"] for row in coder) > len(coder) / 2  # the warm start holds in the rollout
    # a pass rate above 0: a program ran in the sandbox of a Ray worker and passed a ground-truth test
    assert any(row["mas_local_reward"] > 0 for row in coder)
    # the server's version of each adapter: the frozen one was sent once (before step 1), the coder's after every step
    def by_step(role):
        return {tuple(row["mas_weight_versions"]) for row in rows if row["mas_role"] == role}

    assert by_step("tester") == {(0,)} and by_step("coder") == {(0,), (1,), (2,)}
    saved = saved_group(code_artifacts / "checkpoints" / "code_mas_lora_cpu" / "global_step_3")
    assert saved["adam_steps"] == {"coder_adapter": {3 * K_MINI_BATCHES}, "tester_adapter": set()}
    assert saved["schedules"] == {"coder_adapter": 3, "tester_adapter": 0}
    assert all(not t.any() for name, t in adapter_tensors(saved["params"], "tester_adapter").items() if "lora_B" in name)
    assert any(t.any() for name, t in adapter_tensors(saved["params"], "coder_adapter").items() if "lora_B" in name)
