"""A model per role (L2) end to end through `python -m verl.trainer.main_ppo` on CPU: routing,
per-policy updates, frozen policies, fixed optimizer steps, checkpoints and kill-and-resume,
checked on what the run served, trained and saved."""

import json
import os
import sys
from collections import defaultdict

import pytest

from pettingllms_verl.episodes.tags import ERRORS

from support import RECIPES, launch
from support.checkpoints import adapter_tensors, base_tensors, initial_params, same_params, saved_group, saved_policy
from support.faulty_env import OVERRIDE as FAULTY
from support.runs import (
    K_MINI_BATCHES, assert_three_steps_with_metrics_per_policy, dumped_rows, resume_step_4, run_killed_in_step_4, run_recipe,
)

pytestmark = pytest.mark.slow
POLICY_OF = {"tool": "tool_policy", "plan": "plan_policy"}  # plan_path_mas_full_cpu


@pytest.fixture(scope="module")
def l2_run(artifacts):
    """3 steps, validated at step 3 (its val_metrics.json is what the evaluation chooses checkpoints
    by), then SIGKILLed in step 4 (test_sigkill_mid_step_then_resume_continues_every_policy resumes it)."""
    dump = artifacts / "l2_batches"
    metrics = run_killed_in_step_4(artifacts, "plan_path_mas_full_cpu", f"pettingllms.paths.batch_dump_dir={dump}", "trainer.test_freq=3")
    return metrics, dumped_rows(dump, through=3)



def test_l2_runs_three_steps_with_metrics_per_policy(l2_run):
    assert_three_steps_with_metrics_per_policy(l2_run[0], POLICY_OF.values())


def test_every_request_was_served_by_its_roles_policy(l2_run):
    _, rows = l2_run
    assert {row["mas_role"] for row in rows} == set(POLICY_OF)
    for row in rows:
        # mas_served_by is the policy name each answering server stamped on its reply
        assert row["mas_policy"] == POLICY_OF[row["mas_role"]]
        assert row["mas_served_by"] == [row["mas_policy"]]
    policies_of_group = defaultdict(set)
    for row in rows:
        policies_of_group[row["group"]].add(row["mas_policy"])
    assert all(len(policies) == 1 for policies in policies_of_group.values())


def test_each_policy_is_checkpointed_with_a_fixed_number_of_optimizer_steps(l2_run, artifacts):
    checkpoints = artifacts / "checkpoints" / "plan_path_mas_full_cpu"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == "3"
    start = initial_params(artifacts / "tiny_model_plan_path")
    for policy in POLICY_OF.values():
        params, adam_steps = saved_policy(checkpoints / "global_step_3", policy)
        # mini_batches_per_step=2: exactly 2 Adam steps per training step, whatever the rows
        assert adam_steps == {3 * K_MINI_BATCHES}
        assert not same_params(params, start)
    tool, _ = saved_policy(checkpoints / "global_step_3", "tool_policy")
    plan, _ = saved_policy(checkpoints / "global_step_3", "plan_policy")
    assert not same_params(tool, plan)  # two models, trained apart


def test_sigkill_mid_step_then_resume_continues_every_policy(l2_run, artifacts):
    """The step count continues and every policy's optimizer state was restored (its Adam step
    count continues from the checkpoint instead of restarting)."""
    metrics = resume_step_4(artifacts, "plan_path_mas_full_cpu")
    checkpoints = artifacts / "checkpoints" / "plan_path_mas_full_cpu"
    for policy in POLICY_OF.values():
        assert metrics[-1]["data"][f"policy/{policy}/training/rollout_probs_diff_mean"] < 1e-5  # loaded weights synced
        _, adam_steps = saved_policy(checkpoints / "global_step_4", policy)
        assert adam_steps == {4 * K_MINI_BATCHES}


def test_a_policy_changes_only_through_its_own_rows_with_a_full_model_and_an_adapter(artifacts):
    """L2 + L1 in one run: tool_policy a full model on a pool of its own (one more Ray "GPU" slot
    on CPU), plan_policy a LoRA adapter on the base. Greedy tool replies: every tool group ties, so
    all of tool_policy's rows have zero advantage; with no weight decay the step must leave it
    bit-identical, while plan_policy's adapter changes and the base does not."""
    dump = artifacts / "isolation_batches"
    metrics = run_recipe(
        artifacts, "plan_path_mas_full_cpu", "trainer.total_training_steps=1", "trainer.experiment_name=isolation",
        "+pettingllms.roles.tool.sampling.temperature=0", "actor_rollout_ref.actor.optim.weight_decay=0",
        "+pettingllms.policies.tool_policy.pool=own", "+pettingllms.policies.tool_policy.n_gpus_per_node=1",
        "ray_kwargs.ray_init.num_gpus=2", "+pettingllms.policies.plan_policy.adapter.rank=8", f"pettingllms.paths.batch_dump_dir={dump}",
    )
    for policy in POLICY_OF.values():
        assert metrics[-1]["data"][f"policy/{policy}/training/rollout_probs_diff_mean"] < 1e-5
    rows = dumped_rows(dump)
    assert {(row["mas_role"], tuple(row["mas_served_by"])) for row in rows} == {("tool", ("tool_policy",)), ("plan", ("plan_policy",))}
    assert all(row["advantage"] == 0.0 for row in rows if row["mas_role"] == "tool")
    assert any(row["advantage"] != 0.0 for row in rows if row["mas_role"] == "plan")
    step = artifacts / "checkpoints" / "isolation" / "global_step_1"
    start = initial_params(artifacts / "tiny_model_plan_path")
    assert same_params(saved_policy(step, "tool_policy")[0], start)
    lora = saved_group(step)["params"]
    assert any(t.any() for name, t in adapter_tensors(lora, "plan_policy").items() if "lora_B" in name)
    assert same_params(base_tensors(lora), start)


def test_tictactoe_one_learner_per_player_of_another_model_family_beside_a_frozen_opponent(artifacts):
    """Two model families in one team: player_x a tiny model on the second tokenizer family (another
    vocabulary, special tokens and chat template; the first policy, so verl's own worker group),
    trained at a learning rate of its own; player_o the run's model, frozen. Each role's prompts are
    rendered in its policy's template, and each policy's server and actor read the same tokens (the
    rollout/actor gap stays at zero: a row in the other family's ids would be another text, or out of
    the vocabulary)."""
    from transformers import AutoTokenizer

    from pettingllms_verl.models.tiny import build

    bracket = build(str(artifacts / "tiny_model_bracket"), seed=0, family="bracket")
    dump, log = artifacts / "tictactoe_batches", artifacts / "tictactoe_episodes"
    metrics = run_recipe(
        artifacts, "tictactoe_mas_full_cpu", "trainer.total_training_steps=1",
        f"+pettingllms.policies.player_x.overrides.model.path={bracket}", "+pettingllms.policies.player_x.overrides.actor.optim.lr=2e-3",
        "+pettingllms.policies.player_o.trainable=false", f"pettingllms.paths.batch_dump_dir={dump}", f"pettingllms.paths.episode_log_dir={log}",
    )
    data = metrics[0]["data"]
    assert data["policy/player_x/rows"] > 0 and data["policy/player_o/rows"] > 0
    assert "policy/player_x/actor/grad_norm" in data and "policy/player_o/actor/grad_norm" not in data  # never updated
    assert data["policy/player_x/actor/lr"] == pytest.approx(2e-3)  # its own learning rate (the recipe's: 1e-3)
    for policy in ("player_x", "player_o"):
        assert data[f"policy/{policy}/training/rollout_probs_diff_mean"] < 1e-5
    assert {(row["mas_role"], row["mas_policy"]) for row in dumped_rows(dump)} == {("x", "player_x"), ("o", "player_o")}
    samples = [sample for name in os.listdir(log) for line in open(log / name) for sample in json.loads(line)["samples"]]
    by_role = {role: [s for s in samples if s["role"] == role] for role in ("x", "o")}
    assert by_role["x"] and by_role["o"]
    assert all(s["prompt"].startswith("<s>[SYSTEM] ") and "<|im_start|>" not in s["prompt"] for s in by_role["x"])
    assert all(s["prompt"].startswith("<|im_start|>system") for s in by_role["o"])
    assert len(AutoTokenizer.from_pretrained(bracket)) != len(AutoTokenizer.from_pretrained(artifacts / "tiny_model"))
    step = artifacts / "checkpoints" / "tictactoe_mas_full_cpu" / "global_step_1"
    assert same_params(saved_policy(step, "player_o")[0], initial_params(artifacts / "tiny_model"))  # frozen: saved weights = initial ones
    assert not same_params(saved_policy(step, "player_x")[0], initial_params(bracket))


def test_eval_command_plays_the_chosen_checkpoint_as_trained_and_swapped_and_a_single_agent(l2_run, artifacts):
    """``pettingllms-eval``: the L2 run's checkpoint chosen on the val split, played on the test split
    as trained and swapped (each role served by the other's policy), beside the SA recipe's base
    model; tables, episode logs and game results written. One test problem's environment raises
    (``faulty_env.py``): under the fault budget that costs its episode in each pass, which the run
    completes and the table counts beside the success rate."""
    checkpoints = artifacts / "checkpoints" / "plan_path_mas_full_cpu"
    saved_val = json.load(open(checkpoints / "global_step_3" / "val_metrics.json"))
    assert saved_val["global_step"] == 3 and saved_val["val_files"][0].endswith("val.parquet")
    assert any(key.startswith("val-core/plan_path/") for key in saved_val["metrics"])
    assert not (checkpoints / "global_step_2" / "val_metrics.json").exists()  # validated at step 3 only
    out = artifacts / "eval"
    import pandas as pd

    faulty = next(int(info["seed"]) for info in pd.read_parquet(artifacts / "data" / "plan_path_6x6" / "test.parquet")["extra_info"][1:2])
    result = launch.run(
        [sys.executable, "-m", "pettingllms_verl.eval", f"l2=plan_path_mas_full_cpu@{checkpoints}", "sa=plan_path_sa_grpo_cpu",
         "--episodes", "3", "--out", str(out), "--recipes", RECIPES, "--set", FAULTY, "--set", f"+pettingllms.env_kwargs.fail_seeds=[{faulty}]"],
        timeout=1200, cwd=artifacts, env={**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {(row["label"], row["swapped"]): row for row in json.load(open(out / "results.json"))["rows"]}
    assert set(rows) == {("l2", False), ("l2", True), ("sa", False)}
    assert rows["l2", False]["step"] == 3 and rows["l2", True]["swap"] == ["plan_policy", "tool_policy"]
    assert rows["sa", False]["step"] is None and rows["sa", False]["method"] == "SA"
    assert set(rows["l2", False]["roles"]) == set(POLICY_OF) and all(row["episodes"] == 3 for row in rows.values())
    episodes = [json.loads(line) for line in open(out / "episodes.jsonl")]
    faulted = [(e["run"], e["swapped"], e["seed"], e["end_cause"], e.get("error", "")[-500:]) for e in episodes if e.get("end_cause") in ERRORS]
    assert all(row["faults"] == {"env_error": 1} for row in rows.values()), faulted  # one problem in three: under the budget, counted
    assert len(episodes) == 9 and all(e["seed"] >= 1_000_000_000 for e in episodes)  # the test split's seeds
    for episode in episodes:
        if episode["run"] != "l2":
            continue
        # who answered each role: its own policy as trained, the other one swapped
        served = {role: POLICY_OF[role] if not episode["swapped"] else POLICY_OF[other] for role, other in (("tool", "plan"), ("plan", "tool"))}
        assert episode["served_by"] == {role: [policy] for role, policy in served.items()}
        sample = episode["samples"][0]
        assert {"prompt", "reply", "info", "state", "reward", "branch", "chosen"} <= sample.keys() and "grid" in sample["state"]
    games = [json.loads(line) for line in open(out / "games.jsonl")]
    assert len(games) == 9 and {game["run"] for game in games} == {"l2", "sa"}
    table = (out / "results.md").read_text()
    assert "## plan_path" in table and "MAS (per-role policies, full models) swapped" in table and "| SA | sa | base |" in table
    assert table.count("(faults) | env_error 1 |") == 3
    (failed,) = [e for e in episodes if e["run"] == "sa" and e["end_cause"] == "env_error"]
    assert failed["seed"] == faulty and f"RuntimeError: the environment broke on seed {faulty}" in failed["error"]
    assert "l2 (swapped plan_policy <-> tool_policy)" in (out / "summary.md").read_text()
