"""AT-GRPO end to end through `python -m verl.trainer.main_ppo` on CPU: Plan-Path MAS with tree
sampling (and the SA GRPO baseline), the math team (the code team runs in test_lora_e2e.py),
checked on what actually reached the training batch."""

import json
import os
import signal
import sys
from collections import defaultdict

import pytest

from support import RECIPES, launch
from support.runs import dumped_rows, run_recipe, write_math_fixture

K = 4
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mas_run(artifacts):
    """A run to 5 steps, validated at step 3 (greedy, one episode per test problem), SIGKILLed while
    step 4's checkpoint is being written (its folder exists only under the temporary name): the
    metrics and rows of steps 1-3, and the step of the last complete checkpoint at the kill
    (test_a_mas_run_killed_while_saving_resumes_from_the_last_complete_checkpoint resumes the run)."""
    from pettingllms_verl.eval.reproduce.training import finished_steps
    from pettingllms_verl.checkpoints import PARTIAL_SUFFIX

    from support.kill import kill_when

    dump, metrics_path = artifacts / "batches", artifacts / "killed.jsonl"
    checkpoints = artifacts / "checkpoints" / "plan_path_mas_atgrpo_cpu"
    status = kill_when(
        [sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", RECIPES, "--config-name", "plan_path_mas_atgrpo_cpu",
         "trainer.total_training_steps=5", f"pettingllms.paths.batch_dump_dir={dump}", "trainer.test_freq=3"],
        lambda: (checkpoints / f"global_step_4{PARTIAL_SUFFIX}").exists(), cwd=artifacts,
        env={**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts), "VERL_FILE_LOGGER_PATH": str(metrics_path)},
    )
    assert status == -signal.SIGKILL
    at_kill = finished_steps(checkpoints)
    metrics = [m for m in map(json.loads, open(metrics_path)) if m["step"] <= 3]  # (step 4's, had its save completed)
    rows = {int(name[5:-6]): [json.loads(line) for line in open(dump / name)] for name in os.listdir(dump) if int(name[5:-6]) <= 3}
    return metrics, rows, at_kill


def test_mas_recipe_runs_three_steps_with_mas_and_at_grpo_metrics(mas_run):
    metrics, _, _ = mas_run
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        data = m["data"]
        for key in ("mas/success", "mas/turns_mean", "mas/turns_max", "mas/parse_failure_rate", "mas/tool/reward_mean",
                    "mas/plan/reward_mean", "at_grpo/num_groups", "at_grpo/zero_variance_frac"):
            assert key in data, key
        assert data["at_grpo/mean_group_size"] == K
        assert data["training/rollout_probs_diff_mean"] < 1e-5  # fp32 actor and rollout
        assert data["actor/mini_batch_real_frac_min"] >= 0.5  # verl's padding spread over the optimizer steps
    # the validation pass: episode success on the test split (the reward of a validation row)
    assert 0.0 <= metrics[-1]["data"]["val-core/plan_path/reward/mean@1"] <= 1.0


def test_group_sizes_equal_k_and_no_group_spans_two_problems_turns_or_roles(mas_run):
    _, steps, _ = mas_run
    assert sorted(steps) == [1, 2, 3]
    for rows in steps.values():
        groups = defaultdict(list)
        for row in rows:
            groups[row["group"]].append(row)
        for members in groups.values():
            assert len(members) == K
            assert sorted(r["mas_branch"] for r in members) == list(range(K))
            assert len({r["key"].split("_")[0] for r in members}) == 1  # one problem (verl's uid)
            assert len({(r["mas_turn"], r["mas_role"], r["mas_node"]) for r in members}) == 1


def test_per_sample_rewards_reach_the_batch_unchanged(mas_run):
    _, steps, _ = mas_run
    differs_from_final = False
    for rows in steps.values():
        episodes = defaultdict(list)
        for row in rows:
            assert row["score"] == pytest.approx(row["mas_reward"], abs=1e-6)
            uid, session, index = row["key"].rsplit("_", 2)
            episodes[(uid, session)].append((int(index), row["score"]))
        for samples in episodes.values():
            final = max(samples)[1]
            differs_from_final |= any(score != pytest.approx(final) for _, score in samples)
    assert differs_from_final, "every sample carried its episode's final reward (verl's default copy)"


def test_advantages_are_normalised_within_each_group(mas_run):
    _, steps, _ = mas_run
    for rows in steps.values():
        groups = defaultdict(list)
        for row in rows:
            groups[row["group"]].append(row)
        for members in groups.values():
            scores = [r["score"] for r in members]
            advantages = [r["advantage"] for r in members]
            if max(scores) == min(scores):
                assert advantages == [0.0] * len(members)
            else:
                assert sum(advantages) == pytest.approx(0.0, abs=1e-4)
                best = max(range(len(members)), key=lambda i: scores[i])
                assert advantages[best] > 0


def test_sa_grpo_baseline_updates_exactly_when_an_episode_group_has_signal(artifacts):
    dump = artifacts / "sa_batches"
    metrics = run_recipe(artifacts, "plan_path_sa_grpo_cpu", f"pettingllms.paths.batch_dump_dir={dump}")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert "mas/plan/reward_mean" in m["data"] and "mas/tool/reward_mean" not in m["data"]
        returns = defaultdict(set)  # GRPO group (verl's uid, one per problem) -> episode returns
        for line in open(dump / f"step_{m['step']}.jsonl"):
            row = json.loads(line)
            returns[row["key"].split("_")[0]].add(round(row["score"], 6))
        has_signal = any(len(scores) > 1 for scores in returns.values())
        # identical returns in every group -> zero advantages -> no update; otherwise a real one
        assert (m["data"]["actor/grad_norm"] > 0) == has_signal, (m["step"], dict(returns))


def test_two_data_parallel_ranks_on_two_nodes_get_whole_groups_and_keep_sharing_their_prompts(artifacts, tmp_path):
    """Two trainer ranks (gloo, CPU), one on each node of a two-node Ray cluster (tests/support/cluster.py):
    the trainer balances whole AT-GRPO groups over them, so each
    group's prompt still runs once in the update. With verl's row balancing the same run computed
    47-52 % of the plain tokens (a group's rows on both ranks); with whole groups 29 %, as at DP = 1.
    The run has a KL loss, so its reference model (FSDP2-offloaded, sharded over the two ranks) runs
    on CPU: the KL is 0 before the first update (the reference is the initial policy) and not after.
    The plan role samples at temperature 2.0, the rollout at 1.0: its rows are still trained at the
    temperature they were sampled at (off-policy, the rollout/actor gap was 0.076 instead of < 1e-5)."""
    from support.cluster import LocalCluster, placement

    metrics_path = artifacts / "dp2.jsonl"
    with LocalCluster() as cluster:
        result = launch.main_ppo(
            *cluster.main_ppo_args("--config-name", "plan_path_mas_atgrpo_cpu",
                        "trainer.nnodes=2", "data.train_batch_size=4", "+pettingllms.trainer.mini_batches_per_step=1",
                        "trainer.total_training_steps=2", "trainer.save_freq=-1", f"trainer.default_local_dir={artifacts / 'dp2_checkpoints'}",
                        "actor_rollout_ref.actor.use_kl_loss=true", "++pettingllms.roles.plan.sampling.temperature=2.0",
                        worker_env={"VERL_FILE_LOGGER_PATH": str(metrics_path)}),
            timeout=1200, cwd=artifacts, env=cluster.env({**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts)}),
        )
        nodes = set(cluster.node_ids().values())
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-4000:])
    shared = placement(result.stdout + result.stderr)["shared"]
    assert set(shared["trainer"]) == nodes and shared["servers"] == shared["trainer"]  # a rank and its server per node
    metrics = [json.loads(line)["data"] for line in open(metrics_path)]
    assert len(metrics) == 2
    for data in metrics:
        assert data["actor/shared_prefix/token_frac"] < 0.4  # one step optimises on all rows: K-row groups share
        assert data["global_seqlen/minmax_diff"] < 0.1 * data["global_seqlen/mean"]  # and the ranks stay balanced
        assert data["training/rollout_probs_diff_mean"] < 1e-5  # each row scored at its sampling temperature
    assert abs(metrics[0]["actor/kl_loss"]) < 1e-6 < metrics[1]["actor/kl_loss"]  # one optimizer step per training step



@pytest.fixture(scope="module")
def team_artifacts(artifacts, warm_model):
    """The math team's artifacts: the tiny model warm-started on math replies and the shipped problems."""
    warm_model("math", artifacts / "tiny_model_math")
    write_math_fixture(artifacts)
    return artifacts


def test_math_team_programs_and_answers_are_graded_inside_ray_and_its_control_trains_on_rewards_shuffled_within_groups(team_artifacts):
    """The math team for 3 steps with a batch dump, run as the null-training control
    (``pettingllms.trainer.null_reward=permute``): each role's replies are graded inside Ray, and
    each row trains on a reward another reply of its AT-GRPO group earned."""
    from pettingllms_verl.envs.base import PARSE_PENALTY, TOOL_FAILURE_PENALTY

    dump = team_artifacts / "math_control_batches"
    metrics = run_recipe(team_artifacts, "math_mas_atgrpo_cpu", f"pettingllms.paths.batch_dump_dir={dump}",
                         "++pettingllms.trainer.null_reward=permute")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    rows = dumped_rows(dump)
    roles = defaultdict(list)
    for row in rows:
        roles[row["mas_role"]].append(row)
    assert set(roles) == {"tool", "reasoner"}
    assert {r["mas_local_reward"] for r in roles["tool"]} <= {1.0, 0.0, TOOL_FAILURE_PENALTY, PARSE_PENALTY}
    assert {r["mas_local_reward"] for r in roles["reasoner"]} <= {1.0, 0.0, PARSE_PENALTY}
    # 0 or 1: the tool's program ran, printed an answer and math-verify (a child process) judged it
    assert any(r["mas_local_reward"] in (0.0, 1.0) for r in roles["tool"])
    assert any(r["mas_local_reward"] in (0.0, 1.0) for r in roles["reasoner"])
    # the control: a row trains on its group's rewards shuffled (the score its advantage read), not on the one it earned
    groups = defaultdict(lambda: ([], []))
    for row in rows:
        assert row["score"] == pytest.approx(row["mas_reward"])
        groups[row["group"]][0].append(round(row["mas_reward"], 6))
        groups[row["group"]][1].append(round(row.get("mas_earned_reward", row["mas_reward"]), 6))
    assert all(sorted(trained) == sorted(earned) for trained, earned in groups.values())
    moved = [m["data"]["mas/null_reward/moved_frac"] for m in metrics]
    assert any(row["mas_reward"] != row.get("mas_earned_reward", row["mas_reward"]) for row in rows) == (max(moved) > 0)


def test_a_mas_run_killed_while_saving_resumes_from_the_last_complete_checkpoint(mas_run, artifacts):
    """The run killed while saving step 4: the same command resumes from the last complete
    checkpoint and no partial folder is ever taken for a step."""
    from pettingllms_verl.eval.reproduce.training import finished_steps

    _, _, at_kill = mas_run
    checkpoints = artifacts / "checkpoints" / "plan_path_mas_atgrpo_cpu"
    assert at_kill in (3, 4)  # 4 only if the save completed between seeing its partial folder and the kill
    assert (checkpoints / f"global_step_{at_kill}" / "data.pt").exists()
    resumed = run_recipe(artifacts, "plan_path_mas_atgrpo_cpu", "trainer.total_training_steps=5")
    assert [m["step"] for m in resumed] == list(range(at_kill + 1, 6)), (at_kill, [m["step"] for m in resumed])
    assert finished_steps(checkpoints) == 5
    # No partial folder is left, and the older ones beyond max_actor_ckpt_to_keep (2) are removed.
    folders = sorted(path.name for path in checkpoints.iterdir() if path.is_dir())
    assert folders == ["global_step_4", "global_step_5"], (at_kill, folders)
