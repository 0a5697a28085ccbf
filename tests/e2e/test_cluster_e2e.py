"""A Ray cluster of two nodes on this machine (``tests/support/cluster.py``: raylets started by `ray start`)
through `python -m verl.trainer.main_ppo`: each policy's trainer ranks, rollout servers and episode
workers land where they should, the sandbox serves the episodes of every node, ranks of one pool
train across nodes, and a run killed with its whole cluster resumes on a cluster started anew."""

import json
import os
import re

import pytest
import torch

from pettingllms_verl.eval.reproduce.training import finished_steps

from support.checkpoints import saved_policy
from support.cluster import LocalCluster, placement
from support.kill import kill_when, logged_steps
from support.runs import K_MINI_BATCHES, dumped_rows

from support import launch

pytestmark = pytest.mark.slow


def run_args(cluster: LocalCluster, metrics_path, *overrides: str) -> list[str]:
    return cluster.main_ppo_args(*overrides, worker_env={"VERL_FILE_LOGGER_PATH": str(metrics_path)})


def env(cluster: LocalCluster, artifacts) -> dict:
    return cluster.env({**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts)})


L2_ON_TWO_NODES = ["--config-name", "plan_path_mas_full_cpu", "trainer.total_training_steps=2",
                   "+pettingllms.policies.plan_policy.pool=own", "+pettingllms.policies.plan_policy.n_gpus_per_node=1",
                   "actor_rollout_ref.rollout.agent.num_workers=2", "trainer.experiment_name=cluster_l2"]


def test_a_policy_per_node_with_its_servers_episodes_on_both_then_killed_with_the_cluster_and_resumed_on_a_new_one(artifacts, tmp_path):
    """L2, plan_policy on a pool of its own: one policy's trainer rank per node (1 Ray GPU slot
    each), each policy's server on its rank's node, an episode worker per node, each running the
    tool's programs in its node's sandbox. SIGKILLed with every node of the cluster once step 1 is
    logged; on a new cluster, its nodes started in the other order, a pool no node can hold and a
    checkpoint folder one node does not see are refused, and the run resumes at step 2 with each
    policy's optimizer state and weights."""
    checkpoints = artifacts / "checkpoints" / "cluster_l2"
    first_log, output = tmp_path / "first.jsonl", tmp_path / "first.out"
    with LocalCluster(names=["a", "b"]) as cluster:
        kill_when([*launch.MAIN_PPO, *run_args(cluster, first_log, *L2_ON_TWO_NODES)], lambda: logged_steps(first_log) >= 1,
                  cwd=artifacts, env=env(cluster, artifacts), log=output)
        nodes = set(cluster.node_ids().values())
        cluster.kill()  # every node at once, as a cluster lost
    where = placement(output.read_text())
    tool, plan = where["tool_policy"], where["plan_policy"]
    assert set(tool["trainer"]) | set(plan["trainer"]) == nodes and not set(tool["trainer"]) & set(plan["trainer"])
    assert tool["servers"] == tool["trainer"] and plan["servers"] == plan["trainer"]  # each server beside its rank
    assert set(where["episodes"]) == nodes  # verl spreads the episode workers over the nodes
    step_1 = json.loads(first_log.read_text().splitlines()[0])["data"]
    assert step_1["mas/fault_share"] == 0.0  # no episode lost: each node's sandbox ran its episodes' programs
    assert step_1["mas/tool/sandbox/runs"] > 0 and step_1.get("mas/tool/sandbox/ok", 0) > 0
    for policy in ("tool_policy", "plan_policy"):
        assert step_1[f"policy/{policy}/training/rollout_probs_diff_mean"] < 1e-5  # weights synced on each node
    at_kill = finished_steps(checkpoints)
    assert at_kill == 1

    second_log, elsewhere = tmp_path / "second.jsonl", tmp_path / "mounted_on_b_only"
    elsewhere.mkdir()
    with LocalCluster(names=["b", "a"], hide={"a": [str(elsewhere)]}) as cluster:
        # first, a pool that no node holds: both policies on the trainer's pool of 2 slots on one node
        refused = launch.main_ppo(*cluster.main_ppo_args("--config-name", "plan_path_mas_full_cpu", "trainer.n_gpus_per_node=2",
                                                         "trainer.experiment_name=cluster_too_big"),
                                  timeout=600, cwd=artifacts, env=env(cluster, artifacts))
        assert refused.returncode != 0
        assert "trainer.n_gpus_per_node: pool global_pool needs 2 GPU slots on one node, and no live node has them" in refused.stderr
        # then checkpoints in a folder node a does not see (its own empty mount there): refused before step 1
        refused = launch.main_ppo(*run_args(cluster, tmp_path / "refused.jsonl", *L2_ON_TWO_NODES, f"trainer.default_local_dir={elsewhere}"),
                                  timeout=600, cwd=artifacts, env=env(cluster, artifacts))
        assert refused.returncode != 0 and not (tmp_path / "refused.jsonl").exists()
        blind, here = re.search(rf"trainer.default_local_dir: {elsewhere} is not the same folder on node\(s\) (\w+) .* as on this node \((\w+)\)",
                                refused.stderr).groups()  # the node of verl's TaskRunner, which writes the checkpoint's own files
        assert {blind, here} == set(cluster.node_ids().values())
        assert list(elsewhere.iterdir()) == []  # its marker removed
        result = launch.main_ppo(*run_args(cluster, second_log, *L2_ON_TWO_NODES), timeout=1200, cwd=artifacts,
                                 env=env(cluster, artifacts))
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-4000:])
    resumed = [json.loads(line) for line in open(second_log)]
    assert [m["step"] for m in resumed] == [2]
    for policy in ("tool_policy", "plan_policy"):
        assert resumed[0]["data"][f"policy/{policy}/training/rollout_probs_diff_mean"] < 1e-5  # loaded weights synced
        _, adam_steps = saved_policy(checkpoints / "global_step_2", policy)
        assert adam_steps == {2 * K_MINI_BATCHES}  # the optimizer state came back: its step count went on
    step_1_params, _ = saved_policy(checkpoints / "global_step_1", "plan_policy")
    step_2_params, _ = saved_policy(checkpoints / "global_step_2", "plan_policy")
    assert any(not torch.equal(step_1_params[n], step_2_params[n]) for n in step_1_params)


NODE_LOSS_BOUND_S = 300  # from the node's death to main_ppo's exit; measured: see docs/cluster.md


def test_adapters_on_a_pool_spanning_two_nodes_train_as_data_parallel_ranks_and_a_lost_node_stops_the_run(artifacts, tmp_path):
    """L1 with trainer.nnodes=2: the adapters' pool has a rank on each node, each with its server;
    AT-GRPO groups stay whole on a rank (each rank's rows are whole groups), and each adapter is
    served, trained and synced across the two nodes. Then one of them dies (every process of it, its
    trainer rank, server and episode worker, SIGKILLed) in step 2: the run stops, within a bound, with
    one message naming what died and its node."""
    import signal
    import subprocess
    import time

    from pettingllms_verl.rollout.faults import STOPPED

    metrics_path, dump, output = tmp_path / "l1.jsonl", tmp_path / "l1_batches", tmp_path / "l1.out"
    # a head node without trainer slots beside a and b: a node that dies must be neither the head's
    # (Ray's GCS: its loss ends the cluster) nor the one running verl's TaskRunner (the trainer's
    # process: its loss ends the job in verl's driver code, with Ray's ActorUnavailableError)
    with LocalCluster(names=["head", "a", "b"], gpus={"head": 0}) as cluster, open(output, "w+") as out:
        nodes = cluster.node_ids()
        driver = subprocess.Popen(
            [*launch.MAIN_PPO, *run_args(cluster, metrics_path, "--config-name", "plan_path_mas_lora_cpu", "trainer.total_training_steps=2",
                                         "trainer.nnodes=2", "data.train_batch_size=4", "trainer.save_freq=-1",
                                         "actor_rollout_ref.rollout.agent.num_workers=3",  # an episode worker on every node
                                         f"pettingllms.paths.batch_dump_dir={dump}", "trainer.experiment_name=cluster_l1")],
            cwd=artifacts, env=env(cluster, artifacts), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 1200
            while logged_steps(metrics_path) < 1:
                assert driver.poll() is None, output.read_text()[-4000:]
                assert time.monotonic() < deadline, "step 1 never came"
                time.sleep(0.05)
            runner = int(re.search(r"TaskRunnerV1 pid=(\d+)", output.read_text()).group(1))
            lost = next(i for i in (1, 2) if runner not in {p.pid for p in cluster.processes(i)})
            cluster.kill(lost)
            killed = time.monotonic()
            status = driver.wait(timeout=NODE_LOSS_BOUND_S)
            stopped_after = time.monotonic() - killed
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait()
    said = output.read_text()
    lora = placement(said)["lora"]
    assert set(lora["trainer"]) == {nodes["a"], nodes["b"]} and lora["servers"] == lora["trainer"]
    data = json.loads(metrics_path.read_text().splitlines()[0])["data"]
    for adapter in ("tool_adapter", "plan_adapter"):
        assert data[f"policy/{adapter}/rows"] > 0 and data[f"policy/{adapter}/training/rollout_probs_diff_mean"] < 1e-5
    assert data["actor/shared_prefix/token_frac"] < 0.4  # K-row groups share their prompt: whole groups per rank
    assert all(row["mas_served_by"] == [row["mas_policy"]] for row in dumped_rows(dump, through=1))
    # the lost node: a non-zero exit, one stop message, naming the training step and the dead node
    assert status != 0 and logged_steps(metrics_path) == 1
    stop = next(line for line in said.splitlines() if STOPPED in line)
    assert "training step 2" in stop and nodes[cluster.names[lost]] in said[said.index(STOPPED):], said[said.index(STOPPED):][:3000]
    print(f"node {cluster.names[lost]} lost: main_ppo stopped {stopped_after:.0f} s later")
