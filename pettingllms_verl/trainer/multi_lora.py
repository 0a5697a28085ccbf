"""A LoRA adapter per policy on one base model (L1), in verl's own FSDP2 engine and worker.

verl trains one adapter (named ``default``) per engine. Here one engine holds N named peft
adapters on one FSDP2-wrapped base (the table in ``model.lora.pettingllms_adapters``, written by
``config.policy_config``); every batch names the adapter its rows belong to and only that one is
active. Why it isolates the adapters: peft's ``set_adapter`` leaves ``requires_grad`` on the active
adapter only, FSDP2 re-reads ``requires_grad`` on every unshard, and the inactive adapters get no
gradient, so AdamW and the grad-clip skip them (each adapter has its own parameter group, Adam
state and LR-schedule counter). The base is frozen; the reference policy is the base with every
adapter disabled (verl's ``no_lora_adapter``).

- ``MultiLoRAFSDPEngine``: the engine (adapters, optimizer groups, per-adapter LR schedule,
  per-adapter weights for the rollout, peft export in checkpoints).
- ``AdapterTrainingWorker``: verl's ``TrainingWorker`` that activates the adapter a batch names.
- ``MultiLoRAActorRolloutRefWorker``: verl's hybrid worker with that training worker and a weight
  sync that sends the base once, then only the adapters (trainable ones every step, frozen ones once).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils import tensordict_utils as tu
from verl.utils.fsdp_utils import collect_lora_params, replace_lora_wrapper
from verl.utils.model import convert_weight_keys

from pettingllms_verl.checkpoints import EXPORT_DIR
from pettingllms_verl.config import adapter_table
from pettingllms_verl.lora_names import CONFIG_NAME, adapter_of, config_tensor, pushed_name
from pettingllms_verl.trainer.shared_prefix import SharedPrefixActorRolloutRefWorker, SharedPrefixFSDPEngine, SharedPrefixTrainingWorker

ADAPTER_KEY = "pettingllms_adapter"  # extra_info of a batch of the adapter group: the adapter its rows train/score
SCHEDULES_FILE = "adapter_schedules.json"  # <checkpoint>/...: each adapter's LR-schedule step


def _adapter_lr(schedule, steps: dict[str, int], name: str, _scheduler_epoch: int) -> float:
    """LR factor of adapter ``name``: the configured schedule at its own step count."""
    return schedule(steps[name])


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().cpu()


def _check_groups(module, groups: dict[str, list[torch.nn.Parameter]]) -> None:
    """Raise, naming the parameter, unless every tensor peft holds for an adapter is in that
    adapter's optimizer group and no other, and every parameter that requires grad is in a group.
    At start-up only the first adapter requires grad (``set_adapter``): the requires-grad test
    alone would miss the others' tensors, so they are found as peft's layers hold them."""
    from operator import attrgetter

    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    owner = {}  # id(param) -> the adapter peft holds it for
    for layer in module.modules():
        if isinstance(layer, (BaseTunerLayer, AuxiliaryTrainingWrapper)):
            for holder in layer.adapter_layer_names:  # e.g. lora_A, lora_embedding_B, modules_to_save
                for adapter, held in attrgetter(holder)(layer).items():
                    for param in [held] if isinstance(held, torch.nn.Parameter) else held.parameters():
                        owner[id(param)] = adapter
    in_groups: dict[int, list[str]] = {}
    for adapter, params in groups.items():
        for param in params:
            in_groups.setdefault(id(param), []).append(adapter)
    for name, param in module.named_parameters():
        adapter, found = owner.get(id(param)), in_groups.get(id(param), [])
        misplaced = found != [adapter] if adapter is not None else bool(found) or param.requires_grad
        if misplaced:
            owned = f"adapter {adapter}" if adapter is not None else "the base"
            raise ValueError(
                f"{name}: a tensor of {owned} (requires_grad={param.requires_grad}) in the optimizer groups {found}: each adapter "
                "tensor must be in its own adapter's group only, and nothing else may train (an adapter trains "
                "its LoRA tensors, not peft's modules_to_save or trainable tokens)"
            )


class MultiLoRAFSDPEngine(SharedPrefixFSDPEngine):
    """verl's FSDP engine with one named LoRA adapter per policy (see the module docstring); the
    adapters share the base's shared-prefix forward (``trainer/shared_prefix.py``)."""

    active_adapter: str | None = None
    adapter_steps: dict[str, int]  # optimizer-update count per adapter: its LR schedule's position

    @property
    def adapters(self) -> dict[str, dict[str, Any]]:
        return adapter_table(self.model_config)

    @property
    def peft_model(self):
        return getattr(self.module, "_fsdp_wrapped_module", self.module)

    def _build_lora_module(self, module):
        from peft import LoraConfig, get_peft_model, load_peft_weights, set_peft_model_state_dict

        table = self.adapters
        if not table:
            raise ValueError("MultiLoRAFSDPEngine: actor_rollout_ref.model.lora.pettingllms_adapters is empty")
        module.enable_input_require_grads()
        peft_model = None
        for name, spec in table.items():
            config = LoraConfig(**{key: value for key, value in spec.items() if key not in ("path", "trainable")})
            if peft_model is None:
                peft_model = get_peft_model(module, config, adapter_name=name)
            else:
                peft_model.add_adapter(name, config)
            if spec.get("path"):
                result = set_peft_model_state_dict(peft_model, load_peft_weights(spec["path"]), adapter_name=name)
                if result.unexpected_keys:
                    raise ValueError(f"adapter {name}: {spec['path']} holds tensors this model has no place for, e.g. {result.unexpected_keys[:2]}")
                missing = [key for key in result.missing_keys if adapter_of(key) == name]  # left as initialised: the base, for lora_B
                if missing:
                    raise ValueError(f"adapter {name}: {spec['path']} lacks {len(missing)} of its tensors, e.g. {missing[:2]} "
                                     "(saved with other target modules or another rank?)")
        # FSDP2 wants one dtype per parameter group: every adapter in the base dtype, not only the
        # active (trainable) one as verl casts
        base_dtype = next(p.dtype for n, p in peft_model.named_parameters() if adapter_of(n) is None)
        for name, param in peft_model.named_parameters():
            if adapter_of(name) is not None and param.dtype != base_dtype:
                param.data = param.data.to(base_dtype)
        self.adapter_steps = {name: 0 for name in table}
        peft_model.set_adapter(next(iter(table)))
        self.active_adapter = next(iter(table))
        return peft_model

    def _build_fsdp_module(self, module):
        """verl's, but a peft-adapted embedding or LM head stays in the root FSDP unit. With untied
        embeddings verl's FSDP2 wraps ``embed_tokens`` and ``lm_head`` on their own: on a peft layer
        its ABC workaround fails the class swap ("object layout differs"), and it would also wrap
        the layer's ``base_layer`` inside it."""
        from peft.tuners.tuners_utils import BaseTunerLayer
        from verl.utils import fsdp_utils

        select = fsdp_utils._select_fsdp2_wrap_targets

        def targets(model, layer_classes):
            inside = {id(sub) for layer in model.modules() if isinstance(layer, BaseTunerLayer) for sub in layer.modules()}
            return [m for m in select(model, layer_classes) if id(m) not in inside]

        fsdp_utils._select_fsdp2_wrap_targets = targets  # read by apply_fsdp2; verl has no hook for it
        try:
            return super()._build_fsdp_module(module)
        finally:
            fsdp_utils._select_fsdp2_wrap_targets = select

    def _adapter_params(self, module, name: str) -> list[torch.nn.Parameter]:
        return [p for n, p in module.named_parameters() if adapter_of(n) == name]

    def _build_optimizer(self, module):
        from verl.workers.config.optimizer import build_optimizer

        groups = [{"params": self._adapter_params(module, name), "adapter": name} for name in self.adapters]
        for group in groups:
            if not group["params"]:
                raise ValueError(f"adapter {group['adapter']}: no parameters found (its target_modules match no module?)")
        _check_groups(module, {group["adapter"]: group["params"] for group in groups})
        return build_optimizer(groups, self.optimizer_config)

    def _build_lr_scheduler(self, optimizer):
        scheduler = super()._build_lr_scheduler(optimizer)  # a LambdaLR, one factor for every group
        schedule = scheduler.lr_lambdas[0]
        # each group follows the schedule at its own adapter's step: N adapters updated once per
        # training step each must not advance one shared schedule N times
        scheduler.lr_lambdas = [
            functools.partial(_adapter_lr, schedule, self.adapter_steps, group["adapter"]) for group in optimizer.param_groups
        ]
        return scheduler

    def set_active_adapter(self, name: str) -> None:
        if name not in self.adapter_steps:
            raise KeyError(f"no adapter {name!r} in this worker group; adapters: {sorted(self.adapter_steps)}")
        if name != self.active_adapter:
            self.peft_model.set_adapter(name)
            self.active_adapter = name

    def lr_scheduler_step(self) -> float:
        self.adapter_steps[self.active_adapter] += 1
        self.lr_scheduler.step()
        index = [group["adapter"] for group in self.optimizer.param_groups].index(self.active_adapter)
        return self.lr_scheduler.get_last_lr()[index]

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """Adapter ``name``'s full tensors (peft names, without the adapter name), on CPU. Collective:
        every rank must call it."""
        from peft import get_peft_model_state_dict

        # the LoRA tensors only: peft would add the (frozen, shared) base embedding and LM head
        # when they are targets, and the rollout would take them for adapter tensors
        state = get_peft_model_state_dict(self.peft_model, adapter_name=name, save_embedding_layers=False)
        return {key: _full(value) for key, value in state.items()}

    def adapter_config(self, name: str) -> dict[str, Any]:
        """peft ``LoraConfig`` fields of adapter ``name`` (target modules as peft resolved them)."""
        spec = {key: value for key, value in self.adapters[name].items() if key not in ("path", "trainable")}
        targets = self.peft_model.peft_config[name].target_modules
        spec["target_modules"] = sorted(targets) if isinstance(targets, (set, list, tuple)) else targets
        return spec

    def get_per_tensor_param(self, layered_summon=False, base_sync_done=False, adapter_name: str | None = None, **kwargs):
        """The rollout's weights: the base (``base_sync_done=False``, once) or one adapter's tensors
        with its peft config (default: the active adapter)."""
        if base_sync_done:
            name = adapter_name or self.active_adapter
            return iter(self.adapter_state(name).items()), self.adapter_config(name)
        params = collect_lora_params(module=self.module, layered_summon=False, base_sync_done=False)
        # verl's layout for a LoRA-enabled rollout: adapted layers' weights under `.base_layer.`
        first = self.peft_model.peft_config[next(iter(self.adapters))]
        params = {replace_lora_wrapper(key, first): value for key, value in params.items()}
        return iter(convert_weight_keys(params, self.peft_model).items()), None

    def save_checkpoint(self, local_path: str, hdfs_path=None, global_step: int = 0, max_ckpt_to_keep=None, **kwargs) -> None:
        """verl's checkpoint (base + every adapter, optimizer, scheduler), then each adapter in peft
        format under ``lora_adapters/<name>/`` and the adapters' schedule steps."""
        super().save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep, **kwargs)
        from safetensors.torch import save_file

        for name in self.adapters:
            state = self.adapter_state(name)  # collective
            if self.rank == 0:
                folder = os.path.join(local_path, EXPORT_DIR, name)
                os.makedirs(folder, exist_ok=True)
                save_file({key: value.contiguous() for key, value in state.items()}, os.path.join(folder, "adapter_model.safetensors"))
                self.peft_model.peft_config[name].save_pretrained(folder)
        if self.rank == 0:
            with open(os.path.join(local_path, SCHEDULES_FILE), "w") as f:
                json.dump({"adapter_steps": self.adapter_steps}, f)
        torch.distributed.barrier()

    def load_checkpoint(self, local_path: str, hdfs_path=None, del_local_after_load: bool = True, **kwargs) -> None:
        with open(os.path.join(local_path, SCHEDULES_FILE)) as f:  # before verl may delete the folder
            steps = json.load(f)["adapter_steps"]
        super().load_checkpoint(local_path, hdfs_path, del_local_after_load, **kwargs)
        missing = sorted(set(self.adapter_steps) - set(steps))
        if missing:
            raise KeyError(f"{local_path}: no saved schedule for adapters {missing} (added to the run after this checkpoint?)")
        self.adapter_steps.update({name: steps[name] for name in self.adapter_steps})  # in place: the LR lambdas hold it


class AdapterTrainingWorker(SharedPrefixTrainingWorker):
    """verl's training worker on ``MultiLoRAFSDPEngine``; each batch names its adapter (``ADAPTER_KEY``)."""

    engine_cls = MultiLoRAFSDPEngine

    def __init__(self, config):
        super().__init__(config)
        if type(self.engine) is not MultiLoRAFSDPEngine:
            raise ValueError(
                f"LoRA adapters per policy need verl's FSDP engine (actor_rollout_ref.actor.strategy=fsdp2), got {type(self.engine).__name__}"
            )

    def _activate(self, data, reference: bool) -> None:
        name = tu.pop(data, key=ADAPTER_KEY, default=None)
        if name is None and not reference:
            raise ValueError(f"a batch for the LoRA adapter group must name its adapter ({ADAPTER_KEY} in extra_info)")
        if name is not None:
            self.engine.set_active_adapter(name)

    def train_mini_batch(self, data):
        self._activate(data, reference=False)
        return super().train_mini_batch(data)

    def infer_batch(self, data):
        # the reference pass disables every adapter (verl's no_lora_adapter): any adapter will do
        self._activate(data, reference=bool(tu.get(data, key="no_lora_adapter", default=False)))
        return super().infer_batch(data)


class MultiLoRAActorRolloutRefWorker(SharedPrefixActorRolloutRefWorker):
    """verl's hybrid worker for the adapter group: adapter-aware training worker and weight sync."""

    actor_worker_cls = AdapterTrainingWorker

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int = None, mode: str = "auto"):
        """The base once (when the rollout did not load it itself), then each adapter by name:
        trainable ones after every update, frozen ones once. To a rollout pool of its own
        (mas_separate_async), the adapters travel through the checkpoint engine, named
        (``lora_names.pushed_name``); that rollout loads the base itself."""
        effective = mode if mode != "auto" else self.config.rollout.checkpoint_engine.backend
        engine = self.actor.engine
        if effective != "naive":
            return await self.checkpoint_engine.send_weights(self._pushed_adapters(), global_steps=global_steps) or {}
        if self.config.rollout.free_cache_engine:
            await self.rollout.resume(tags=["weights"])
        if not self.base_sync_done:
            params, _ = engine.get_per_tensor_param(base_sync_done=False)
            await self.rollout.update_weights(params, peft_config=None, base_sync_done=False, global_steps=global_steps)
        for name, params, peft_config in self._adapters_due():
            await self.rollout.update_weights(params, peft_config=peft_config, base_sync_done=True, lora_name=name, global_steps=global_steps)
        if engine.is_param_offload_enabled:
            engine.to("cpu", model=True, optimizer=False, grad=False)
        if self.config.rollout.free_cache_engine:
            await asyncio.to_thread(torch.distributed.barrier)
            await self.rollout.resume(tags=["kv_cache"])
        self.base_sync_done = True

    def _adapters_due(self):
        """The adapters a push refreshes, each as (name, its tensors, its peft config): trainable ones
        every time, frozen ones until sent once (marked sent when the next is asked for)."""
        synced = self.__dict__.setdefault("_synced_adapters", set())
        engine = self.actor.engine
        for name, spec in engine.adapters.items():
            if spec["trainable"] or name not in synced:
                params, peft_config = engine.get_per_tensor_param(base_sync_done=True, adapter_name=name)
                yield name, params, peft_config
                synced.add(name)

    def _pushed_adapters(self):
        """``_adapters_due`` as one stream of named tensors for a checkpoint engine: each adapter's
        peft config, then its tensors. Every rank draws it (each tensor is gathered over them)."""
        for name, params, peft_config in self._adapters_due():
            yield pushed_name(name, CONFIG_NAME), config_tensor(peft_config)
            for key, tensor in params:
                yield pushed_name(name, key), tensor
