"""What a checkpoint per policy holds, read back: parameters, Adam step counts, adapter groups."""

import json

import torch


def saved_policy(step_dir, policy: str, kind: str = "policies") -> tuple[dict[str, torch.Tensor], set[int]]:
    """A policy's saved parameters and the Adam step counts of its optimizer state (``kind="critics"``: its critic's)."""
    folder = step_dir / kind / policy
    model = torch.load(folder / "model_world_size_1_rank_0.pt", weights_only=False)
    optim = torch.load(folder / "optim_world_size_1_rank_0.pt", weights_only=False)
    params = {name: (t.to_local() if hasattr(t, "to_local") else t) for name, t in model.items()}
    return params, {int(state["step"]) for state in optim["state"].values()}


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


def initial_params(model_dir) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).state_dict()


def same_params(saved: dict, reference: dict) -> bool:
    return all(torch.equal(saved[name], reference[name]) for name in saved)
