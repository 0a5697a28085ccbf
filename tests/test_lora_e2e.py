"""A LoRA adapter per role on one base model (L1) end to end through `python -m
verl.trainer.main_ppo` on CPU: routing by adapter, isolation of the adapters and the base,
per-adapter optimizer state and LR schedule, peft export, kill-and-resume, a frozen adapter and
the swapped-policy switch, checked on what the run served, trained and saved."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from test_mas_e2e import RECIPES, dumped_rows, run_recipe, team_artifacts  # noqa: F401  (fixture)
from test_policies_e2e import artifacts, initial_params  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow
RECIPE = "plan_path_mas_lora_cpu"
POLICY_OF = {"tool": "tool_adapter", "plan": "plan_adapter"}  # its roles' adapters
K_MINI_BATCHES = 2  # its pettingllms.mini_batches_per_step
LR, WARMUP = 2e-3, 10  # its actor LR; the warm-up steps of the first run


def saved_group(step_dir, group: str = "lora") -> dict:
    """The adapter group's checkpoint: tensors, Adam steps and param-group names, schedule steps."""
    folder = step_dir / "policies" / group
    model = torch.load(folder / "model_world_size_1_rank_0.pt", weights_only=False)
    optim = torch.load(folder / "optim_world_size_1_rank_0.pt", weights_only=False)
    index_of = {index: group["adapter"] for group in optim["param_groups"] for index in group["params"]}
    adam_steps: dict[str, set[int]] = {group["adapter"]: set() for group in optim["param_groups"]}
    for index, state in optim["state"].items():
        adam_steps[index_of[index]].add(int(state["step"]))
    return {
        "params": {name: (t.to_local() if hasattr(t, "to_local") else t) for name, t in model.items()},
        "adam_steps": adam_steps,
        "schedules": json.loads((folder / "adapter_schedules.json").read_text())["adapter_steps"],
        "folder": folder,
    }


def adapter_tensors(params: dict, adapter: str) -> dict[str, torch.Tensor]:
    return {name: t for name, t in params.items() if f".{adapter}." in name}


def base_tensors(params: dict) -> dict[str, torch.Tensor]:
    """The base model's tensors under their transformers names."""
    return {
        name.removeprefix("base_model.model.").replace(".base_layer.", "."): t
        for name, t in params.items() if "lora_" not in name
    }


@pytest.fixture(scope="module")
def l1_run(artifacts):
    """3 steps; greedy tool replies: every tool group ties, so all of tool_adapter's rows have zero
    advantage (with no weight decay its adapter must not move while plan_adapter trains). A 10-step
    LR warm-up shows each adapter's own schedule position."""
    dump = artifacts / "l1_batches"
    metrics = run_recipe(
        artifacts, RECIPE, f"+pettingllms.batch_dump_dir={dump}", f"actor_rollout_ref.actor.optim.lr_warmup_steps={WARMUP}",
        "+pettingllms.roles.tool.sampling.temperature=0", "actor_rollout_ref.actor.optim.weight_decay=0",
    )
    return metrics, dumped_rows(dump)


def test_l1_runs_three_steps_with_metrics_per_adapter(l1_run):
    metrics, _ = l1_run
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        data = m["data"]
        for adapter in POLICY_OF.values():
            assert data[f"policy/{adapter}/rows"] > 0
            for key in ("reward_mean", "actor/grad_norm", "actor/pg_loss", "actor/lr"):
                assert f"policy/{adapter}/{key}" in data, (adapter, key)
            # the replica served each adapter with the trainer's current tensors (fp32 both sides)
            assert data[f"policy/{adapter}/training/rollout_probs_diff_mean"] < 1e-5
            # one schedule step per adapter per training step: a shared schedule would be at 2 x step
            assert data[f"policy/{adapter}/actor/lr"] == pytest.approx(LR * m["step"] / WARMUP)


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
    """After the 3-step run: train to step 5, SIGKILL the driver (and its Ray processes) once step 4
    is checkpointed, resume. The step count continues, each adapter's Adam state and LR-schedule
    step continue from the checkpoint, and the replica serves the loaded adapters. The resumed run
    validates with the swapped-policy switch on (each role served by the other's adapter)."""
    checkpoints = artifacts / "checkpoints" / RECIPE
    tracker = checkpoints / "latest_checkpointed_iteration.txt"
    env = {**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts), "VERL_FILE_LOGGER_PATH": str(artifacts / "l1_killed.jsonl")}
    command = [sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", RECIPES, "--config-name", RECIPE,
               "trainer.total_training_steps=5"]
    driver = subprocess.Popen(command, cwd=artifacts, env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 900
    while tracker.read_text() != "4":
        assert driver.poll() is None and time.monotonic() < deadline, "the run ended before step 4 was saved"
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGKILL)  # mid step 5 (or in its first moments)
    driver.wait()
    assert tracker.read_text() == "4"

    metrics = run_recipe(
        artifacts, RECIPE, "trainer.total_training_steps=5", "trainer.test_freq=5",
        "+pettingllms.swap_policies=[tool_adapter,plan_adapter]",
    )
    resumed = [m for m in metrics if m["step"] == 5]
    assert len(resumed) == 1 and [m["step"] for m in metrics][-1] == 5
    for adapter in POLICY_OF.values():
        assert resumed[0]["data"][f"policy/{adapter}/training/rollout_probs_diff_mean"] < 1e-5  # loaded adapters synced
    saved = saved_group(checkpoints / "global_step_5")
    assert saved["adam_steps"] == {adapter: {5 * K_MINI_BATCHES} for adapter in POLICY_OF.values()}
    assert saved["schedules"] == {adapter: 5 for adapter in POLICY_OF.values()}
    validation = [key for m in metrics for key in m["data"] if "val-" in key]
    assert validation and all(key.startswith("swap/val-") for key in validation)


def test_adapters_and_a_full_model_policy_in_one_run(artifacts):
    """L1 + L2: the tool agent an adapter on the base, the plan agent a full model of its own."""
    dump = artifacts / "mixed_batches"
    metrics = run_recipe(
        artifacts, RECIPE, "trainer.total_training_steps=1", "trainer.experiment_name=mixed", "~pettingllms.policies.plan_adapter",
        "+pettingllms.policies.plan_full={}", "pettingllms.roles.plan.policy=plan_full", f"+pettingllms.batch_dump_dir={dump}",
    )
    data = metrics[0]["data"]
    for policy in ("tool_adapter", "plan_full"):
        assert data[f"policy/{policy}/actor/grad_norm"] > 0
        assert data[f"policy/{policy}/training/rollout_probs_diff_mean"] < 1e-5
    assert {(row["mas_role"], tuple(row["mas_served_by"])) for row in dumped_rows(dump)} == {
        ("tool", ("tool_adapter",)), ("plan", ("plan_full",))}
    step = artifacts / "checkpoints" / "mixed" / "global_step_1" / "policies"
    start = initial_params(artifacts / "tiny_model_plan_path")
    full = torch.load(step / "plan_full" / "model_world_size_1_rank_0.pt", weights_only=False)
    assert any(not torch.equal(t.to_local() if hasattr(t, "to_local") else t, start[name]) for name, t in full.items())
    base = base_tensors(saved_group(step.parent)["params"])
    assert all(torch.equal(base[name], start[name]) for name in base)


def test_code_team_with_a_frozen_tester_adapter(team_artifacts):
    """code_mas_lora_cpu: the coder's adapter learns, the tester's (trainable: false) generates and
    is never updated: no optimizer state, no schedule step, lora_B still zero after 3 steps."""
    dump = team_artifacts / "code_lora_batches"
    # with a KL term: the reference policy is the base with every adapter off (verl's no_lora_adapter)
    metrics = run_recipe(team_artifacts, "code_mas_lora_cpu", f"+pettingllms.batch_dump_dir={dump}", "actor_rollout_ref.actor.use_kl_loss=true")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["data"]["policy/tester_adapter/rows"] > 0 and m["data"]["policy/coder_adapter/rows"] > 0
        assert "policy/coder_adapter/actor/grad_norm" in m["data"] and "policy/tester_adapter/actor/grad_norm" not in m["data"]
        assert m["data"]["policy/coder_adapter/actor/kl_loss"] >= 0.0
    assert metrics[-1]["data"]["policy/coder_adapter/actor/kl_loss"] > 0.0  # the trained adapter left the base
    rows = dumped_rows(dump)
    assert {(row["mas_role"], row["mas_policy"]) for row in rows} == {("tester", "tester_adapter"), ("coder", "coder_adapter")}
    assert all(row["mas_served_by"] == [row["mas_policy"]] for row in rows)
    # the server's version of each adapter: the frozen one was sent once (before step 1), the coder's after every step
    by_step = lambda role: {tuple(row["mas_weight_versions"]) for row in rows if row["mas_role"] == role}
    assert by_step("tester") == {(0,)} and by_step("coder") == {(0,), (1,), (2,)}
    saved = saved_group(team_artifacts / "checkpoints" / "code_mas_lora_cpu" / "global_step_3")
    assert saved["adam_steps"] == {"coder_adapter": {3 * K_MINI_BATCHES}, "tester_adapter": set()}
    assert saved["schedules"] == {"coder_adapter": 3, "tester_adapter": 0}
    assert all(not t.any() for name, t in adapter_tensors(saved["params"], "tester_adapter").items() if "lora_B" in name)
    assert any(t.any() for name, t in adapter_tensors(saved["params"], "coder_adapter").items() if "lora_B" in name)
