"""Where the policies' pools go on a Ray cluster, checked before verl asks for them.

verl turns each resource pool into placement groups, one per node entry, each packing that many
GPU slots (GPUs, or trainer ranks on CPU) onto one node, then waits for them without a bound: a
pool that no node can hold would wait forever. ``unplaceable`` finds such a pool first.
``nodes_of`` says where each group's trainer ranks and rollout servers landed.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import ray

from pettingllms_verl.config import SECTION

PLACEMENT = "pettingllms_verl placement:"  # the line naming each group's trainer and server nodes


def unplaceable(pools: dict[str, list[int]], node_slots: dict[str, float]) -> tuple[str, int, dict[str, float]] | None:
    """The first pool entry (pool name, slots) that cannot be packed onto one node once the larger
    entries of every pool have taken theirs (first fit, largest first), with the slots each node
    has left then; None when every entry fits.

    ``pools``: pool name -> slots per node entry (verl's ``resource_pool_spec``);
    ``node_slots``: node id -> its GPU slots.
    """
    free = dict(node_slots)
    entries = sorted(((slots, name) for name, per_node in pools.items() for slots in per_node), key=lambda e: -e[0])
    for slots, name in entries:
        node = next((node for node, left in free.items() if left >= slots), None)
        if node is None:
            return name, slots, free
        free[node] -= slots
    return None


def refusal(pools: dict[str, list[int]], node_slots: dict[str, float], resource: str, colocate: int) -> str | None:
    """Why ``pools`` cannot be placed on the live nodes (``node_slots``: node id -> its slots of
    ``resource``, each with ``colocate`` CPUs), naming the key to change; None when they can.
    A pool asking for more nodes than are alive names its ``nnodes``, else its ``n_gpus_per_node``."""
    missing = unplaceable(pools, node_slots)
    if missing is None:
        return None
    pool, slots, free = missing
    section = "trainer" if pool == "global_pool" else f"{SECTION}.policies.{pool.removeprefix('policy_')}"
    held = f"each live node's {resource} slots with {colocate} CPUs each, left after the larger pools: {free}"
    asked = len(pools[pool])
    if asked > 1 and sum(left >= slots for left in node_slots.values()) < asked:
        return (f"{section}.nnodes: pool {pool} asks for {asked} nodes of {slots} {resource} slots, and "
                f"{len(node_slots)} nodes are alive ({held}); lower {section}.nnodes, or start more nodes "
                f"(`ray start --address=<head>` on each)")
    key = f"{section}.n_gpus_per_node"
    return (f"{key}: pool {pool} needs {slots} {resource} slots on one node, and no live node has them "
            f"({held}); lower {key}, or add a node that holds {slots}")


def blind_nodes(folder: str, actors: list, where: list[str]) -> list[str]:
    """The nodes among ``where`` (``actors``' nodes) that do not see ``folder`` as this process
    does: a file written into it here is not there (a local disk, a mount missing, a relative path
    against another working directory). ``folder`` is created if missing."""
    os.makedirs(folder, exist_ok=True)
    marker = os.path.join(folder, f".visible-{uuid.uuid4().hex}")
    open(marker, "w").close()
    try:
        seen = ray.get([actor.__ray_call__.remote(lambda _, path: os.path.exists(path), marker) for actor in actors])
    finally:
        os.remove(marker)
    return sorted({node for node, ok in zip(where, seen) if not ok})


def nodes(actors: list) -> list[str]:
    """The Ray node id each of ``actors`` runs on."""
    return ray.get([actor.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id()) for actor in actors])


def actors_of(group: Any) -> dict[str, list]:
    """A ``PolicyGroup``'s actors by part: its trainer ranks and its rollout servers, in rank order."""
    return {
        "trainer": list(group.worker_group.workers),
        "servers": [server for replica in group.servers.get_replicas() for server in replica.servers],
    }


def nodes_of(group: Any) -> dict[str, list[str]]:
    """The Ray node ids a ``PolicyGroup``'s trainer ranks and rollout servers run on, in rank order."""
    return {part: nodes(actors) for part, actors in actors_of(group).items()}


def who(groups: dict[str, Any], placement: dict[str, dict[str, list[str]]]) -> dict[str, str]:
    """Ray actor id -> what it is and where ("trainer rank 1 of tool_policy on node <id>"), for the
    message that names an actor that died."""
    named = {}
    for name, group in groups.items():
        for part, actors in actors_of(group).items():
            what = "trainer rank" if part == "trainer" else "rollout server"
            named.update(name_actors(actors, f"{what} {{}} of {name}", placement[name][part]))
    return named


def name_actors(actors: list, label: str, where: list[str]) -> dict[str, str]:
    """Ray actor id -> ``label`` (its "{}" the actor's index) "on node <id>" (``where``: the actors' nodes)."""
    return {actor._actor_id.hex(): f"{label.format(i)} on node {node}" for i, (actor, node) in enumerate(zip(actors, where))}


def named_by_ray(actor_id: str | None) -> str:
    """An actor of the run this package did not place (verl's reward loop, TransferQueue, ...), as
    Ray's actor table (GCS) gives it, dead or alive: "RewardLoopWorker actor <id> on node <id>"."""
    try:
        from ray._private.state import actors  # Ray's own debugging accessor of the GCS table

        info = actors(actor_id=actor_id)
        return f"{info['ActorClassName']} actor {actor_id} on node {info['Address']['NodeID']}"
    except Exception:  # no table entry, or Ray moved the accessor: the id alone
        return f"Ray actor {actor_id}"
