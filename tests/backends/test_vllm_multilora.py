"""The ``vllm_multilora`` rollout, as far as it can be tested without vLLM: registration, the adapter
table, ids, engine args, request fields, the per-request adapter, and that vLLM is imported lazily."""

import asyncio
import importlib.util
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from pettingllms_verl.backends import vllm_multilora as ml

TABLE = {  # as pettingllms_verl.config.adapter_table gives it: peft LoraConfig fields + path, trainable
    "solver": {"r": 32, "lora_alpha": 64, "bias": "none", "task_type": "CAUSAL_LM", "target_modules": ["q_proj", "v_proj"],
               "trainable": False, "path": "/adapters/solver"},
    "planner": {"r": 8, "lora_alpha": 16, "bias": "none", "task_type": "CAUSAL_LM", "target_modules": "all-linear",
                "trainable": True, "path": None},
    "critic": {"r": 16, "lora_alpha": 16, "bias": "none", "task_type": "CAUSAL_LM", "target_modules": "all-linear",
               "trainable": True, "path": None},
}

vllm_absent = pytest.mark.skipif(
    "vllm" in sys.modules or importlib.util.find_spec("vllm") is not None, reason="vLLM is importable here"
)


def test_registered_with_verl():
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    import pettingllms_verl.registration as registration

    registration.register()
    assert RolloutReplicaRegistry._registry["vllm_multilora"] is ml.load_replica_class
    assert _ROLLOUT_REGISTRY[("vllm_multilora", "async")] == "pettingllms_verl.backends.vllm_multilora.MultiLoRAServerAdapter"
    assert registration._check() == []
    ml.register()  # again: a no-op
    assert registration._check() == []


def test_check_reports_a_missing_registration(monkeypatch):
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    import pettingllms_verl.registration as registration

    registration.register()
    monkeypatch.delitem(RolloutReplicaRegistry._registry, "vllm_multilora")
    monkeypatch.delitem(_ROLLOUT_REGISTRY, ("vllm_multilora", "async"))
    assert registration._check() == ["rollout replica 'vllm_multilora'", "rollout adapter ('vllm_multilora', 'async')"]


def test_module_imports_without_vllm_or_verl():
    code = (
        "import sys, pettingllms_verl.backends.vllm_multilora as m; "
        "print(sorted(k for k in sys.modules if k.split('.')[0] in ('vllm', 'verl', 'ray', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


@vllm_absent
def test_classes_need_vllm_and_say_so():
    with pytest.raises(ImportError, match="vllm"):
        ml.load_replica_class()
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    ml.register()
    with pytest.raises(ImportError, match="vllm"):
        RolloutReplicaRegistry.get("vllm_multilora")
    with pytest.raises(ImportError, match="vllm"):  # the adapter's dotted path reaches this module's lazy class
        get_rollout_class("vllm_multilora", "async")
    with pytest.raises(ImportError, match="vllm"):
        _ = ml.MultiLoRAWorkerExtension
    with pytest.raises(AttributeError):
        _ = ml.NoSuchClass


def test_adapter_table_from_the_real_config_builder():
    from pettingllms_verl.config import ADAPTER_GROUP, policy_config

    config = OmegaConf.create({
        "actor_rollout_ref": {"model": {"path": "/base", "lora_rank": 0, "lora": {}}, "rollout": {"name": "vllm_multilora"}},
        "pettingllms": {"policies": {
            "planner": {"adapter": {"rank": 8}},
            "solver": {"adapter": {"rank": 32, "alpha": 64, "target_modules": ["q_proj", "v_proj"], "path": "/adapters/solver"},
                       "trainable": False},
        }},
    })
    model = policy_config(config, ADAPTER_GROUP).actor_rollout_ref.model
    assert ml.adapter_table(model) == {
        "planner": {"r": 8, "lora_alpha": 16, "bias": "none", "task_type": "CAUSAL_LM", "target_modules": "all-linear",
                    "trainable": True, "path": None},
        "solver": {"r": 32, "lora_alpha": 64, "bias": "none", "task_type": "CAUSAL_LM", "target_modules": ["q_proj", "v_proj"],
                   "trainable": False, "path": "/adapters/solver"},
    }


def test_no_adapter_table_means_a_plain_vllm_server():
    assert ml.adapter_table(OmegaConf.create({"path": "/base"})) == {}
    assert ml.adapter_table({"lora": {"rank": 8}}) == {}


def test_ids_distinct_and_stable_under_reordering():
    ids = {name: ml.lora_int_id(name, TABLE) for name in TABLE}
    assert ids == {"critic": 1, "planner": 2, "solver": 3}
    reordered = dict(reversed(list(TABLE.items())))
    assert {name: ml.lora_int_id(name, reordered) for name in reordered} == ids
    assert {name: ml.lora_int_id(name, list(reordered)) for name in reordered} == ids
    with pytest.raises(KeyError, match="'judge'"):
        ml.lora_int_id("judge", TABLE)


def test_engine_overrides_hold_every_adapter():
    assert ml.server_engine_overrides(TABLE) == {"enable_lora": True, "max_loras": 3, "max_cpu_loras": 3, "max_lora_rank": 32}
    assert ml.server_engine_overrides({"planner": TABLE["planner"]})["max_loras"] == 1
    assert ml.server_engine_overrides({}) == {}
    assert ml.server_engine_overrides(TABLE, max_lora_rank=64)["max_lora_rank"] == 64  # asked in engine_kwargs.vllm


def test_request_fields_per_adapter():
    assert ml.lora_request_fields("solver", TABLE) == ("solver", 3, "/adapters/solver")
    assert ml.lora_request_fields("planner", TABLE) == ("planner", 2, ml.UNSYNCED_PATH)
    assert ml.lora_request_fields("critic", TABLE) == ("critic", 1, ml.UNSYNCED_PATH)
    with pytest.raises(KeyError, match=r"unknown adapter 'judge'.*\['critic', 'planner', 'solver'\].*pettingllms_adapters"):
        ml.lora_request_fields("judge", TABLE)
    with pytest.raises(KeyError, match="no adapters"):
        ml.lora_request_fields("planner", {})


def test_sync_adapter_names_the_target():
    peft = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "bias": "none", "task_type": "CAUSAL_LM"}
    assert ml.sync_adapter(None, False, None, TABLE) is None  # the base sync at the start
    assert ml.sync_adapter(peft, True, "planner", TABLE) == "planner"
    with pytest.raises(ValueError, match="lora_name"):
        ml.sync_adapter(peft, True, None, TABLE)  # verl's single unnamed adapter
    with pytest.raises(KeyError, match="'judge'"):
        ml.sync_adapter(peft, True, "judge", TABLE)


def test_server_names_per_policy():
    assert ml.server_name_prefix("lora") != ml.server_name_prefix("solver")
    assert ml.server_name_prefix("lora").startswith("vllm_multilora_")


def test_engine_wrapper_attaches_each_requests_adapter():
    class Engine:
        model_config = "passed through"

        def generate(self, prompt, lora_request=None):
            return prompt, lora_request

    engine = ml.PerRequestLoRAEngine(Engine())
    assert engine.model_config == "passed through"
    assert engine.generate("p", lora_request="verl's fixed adapter") == ("p", None)

    async def serve(prompt: str, lora: str | None):
        with ml.request_lora(lora):
            await asyncio.sleep(0)  # interleave the requests
            return engine.generate(prompt, lora_request="verl's fixed adapter")

    async def main():
        return await asyncio.gather(serve("a", "planner"), serve("b", None), serve("c", "solver"))

    assert asyncio.run(main()) == [("a", "planner"), ("b", None), ("c", "solver")]
    assert engine.generate("d") == ("d", None)
