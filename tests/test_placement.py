"""Which pools a Ray cluster's nodes can hold (``placement.unplaceable``): verl waits without a bound
for a pool's placement groups, so one that cannot be placed must be found before."""

from pettingllms_verl.placement import refusal, unplaceable


def test_a_policy_per_node_fits_two_nodes_of_one_slot():
    assert unplaceable({"global_pool": [1], "policy_plan": [1]}, {"a": 1, "b": 1}) is None


def test_a_pool_entry_larger_than_every_node_is_named_with_what_each_node_has():
    assert unplaceable({"global_pool": [1], "policy_plan": [2]}, {"a": 1, "b": 1}) == ("policy_plan", 2, {"a": 1, "b": 1})


def test_pools_are_packed_largest_first_so_that_small_entries_do_not_block_a_node():
    # 2 x 8 GPUs: the trainer's pool on both nodes (4 each) beside a policy's 8 on one node fits only
    # with the 8 placed first
    assert unplaceable({"global_pool": [4, 4], "policy_plan": [8]}, {"a": 8, "b": 8}) is None
    assert unplaceable({"global_pool": [4, 4], "policy_plan": [8]}, {"a": 8, "b": 7}) == ("global_pool", 4, {"a": 0, "b": 3})


def test_slots_in_use_count_once():
    assert unplaceable({"global_pool": [1, 1]}, {"a": 1}) == ("global_pool", 1, {"a": 0})


def test_a_pool_asking_for_more_nodes_than_are_alive_names_its_nnodes():
    said = refusal({"global_pool": [1, 1, 1]}, {"a": 1, "b": 1}, "GPU", 3)
    assert said.startswith("trainer.nnodes: pool global_pool asks for 3 nodes of 1 GPU slots, and 2 nodes are alive")
    said = refusal({"global_pool": [1], "policy_plan_policy": [1, 1]}, {"a": 2}, "GPU", 3)
    assert said.startswith("pettingllms.policies.plan_policy.nnodes: pool policy_plan_policy asks for 2 nodes")


def test_a_pool_too_large_for_any_node_names_its_n_gpus_per_node_and_a_pool_that_fits_is_not_refused():
    said = refusal({"global_pool": [1], "policy_plan_policy": [2]}, {"a": 1, "b": 1}, "GPU", 3)
    assert said.startswith("pettingllms.policies.plan_policy.n_gpus_per_node: pool policy_plan_policy needs 2 GPU slots on one node")
    assert "{'a': 1, 'b': 1}" in said
    assert refusal({"global_pool": [1, 1]}, {"a": 2}, "GPU", 3) is None  # two entries of one pool may share a node, as in verl
