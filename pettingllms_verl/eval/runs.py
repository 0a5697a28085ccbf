"""What one evaluation run is: a recipe (environment, workflow, policies), the weights (the recipe's
base models or a verl checkpoint), and the data split; and how it runs: ``main_ppo`` with
``trainer.val_only=true``, so episodes go through the same agent loop, rollout replicas and
policy routing as in training.

Checkpoints are chosen on the validation split (``val_metrics.json``, written beside each
checkpoint by the trainer's validation), never on the split being reported.
"""

from __future__ import annotations

import difflib
import glob
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from pettingllms_verl import artifacts
from pettingllms_verl.backends.cpu import usable_cores
from pettingllms_verl.checkpoints import EXPORT_DIR, POLICIES_DIR, VAL_METRICS, group_folder, step_of, steps_in, step_folder
from pettingllms_verl.config import ADAPTER_GROUP, SECTION, load
from pettingllms_verl.preflight.policies import same_family, saved_model_differs

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"  # shipped in the package
SUCCESS_KEY = re.compile(r"^val-core/[^/]+/reward/mean@\d+$")  # episode success per data source (not swap/)


class EvalError(ValueError):
    """A bad argument or input; the message names it and what to do."""


@dataclass
class Run:
    """One evaluation run: ``label`` names it in every table and file."""

    label: str
    recipe: str
    config: DictConfig  # the recipe composed with the command's overrides (resolved)
    env: str  # the environment of the evaluated split
    data_file: str  # the evaluated split
    checkpoint: str | None  # a global_step_N folder, or None: the recipe's own models
    overrides: list[str] = field(default_factory=list)  # Hydra overrides of the recipe (the command's --set)
    swap: list[str] | None = None  # two policies: a second, swapped pass

    @property
    def step(self) -> int | None:
        return step_of(self.checkpoint) if self.checkpoint else None


def compose(recipe: str, overrides: list[str], recipes_dir: Path) -> DictConfig:
    """The recipe as ``main_ppo`` would see it (hydra node dropped, interpolations resolved; the
    artifacts folder found as ``main_ppo``'s preflight finds it: ``artifacts.use_working_directory``)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    path = recipes_dir / f"{recipe}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in recipes_dir.glob("*.yaml"))
        close = difflib.get_close_matches(recipe, known, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise EvalError(f"recipe {recipe!r}: no {path}; {hint}recipes: {', '.join(known)}")
    artifacts.use_working_directory()
    try:
        with initialize_config_dir(config_dir=str(recipes_dir), version_base=None):
            cfg = hydra_compose(config_name=recipe, overrides=overrides)
        OmegaConf.resolve(cfg)
    except (HydraException, OmegaConfBaseException) as error:
        raise EvalError(f"recipe {recipe} with --set {overrides}: {str(error).splitlines()[0]}") from None
    return cfg


def split_file(cfg: DictConfig, split: str) -> str:
    """``<split>.parquet`` beside the recipe's validation file (the data-prep scripts write both)."""
    val_files = cfg.data.val_files
    first = val_files if isinstance(val_files, str) else list(val_files)[0]
    path = os.path.join(os.path.dirname(first), f"{split}.parquet")
    if not os.path.isfile(path):
        raise EvalError(
            f"--split {split}: {path} does not exist; write it with the data-prep command in the recipe's "
            f"data section (recipes/base/data/), which writes train, val and test (and confirm, final with --confirm N, --final N)"
        )
    return path


def policy_models(cfg: DictConfig) -> dict[str, str]:
    """worker group -> the model path it starts from (an adapter group: the base)."""
    settings = load(cfg.get(SECTION))
    base = str(cfg.actor_rollout_ref.model.path)
    table = settings.policy_table()
    return {
        group: base if group == ADAPTER_GROUP else str(OmegaConf.select(OmegaConf.create(table[group].overrides), "model.path") or base)
        for group in settings.groups()
    }


def adapter_starts(cfg: DictConfig) -> dict[str, str]:
    """adapter policy -> the peft folder it starts from, for the adapters that start from one (L1)."""
    return {name: policy.adapter.path for name, policy in load(cfg.get(SECTION)).policy_table().items()
            if policy.adapter is not None and policy.adapter.path}


def check_model(path: str, what: str) -> None:
    if not os.path.isfile(os.path.join(path, "config.json")):
        target = artifacts.make_target(path)
        how = f"build it with `{target}` in the repository (looked in {artifacts.where()})" if target else "build or download it"
        raise EvalError(f"{what}: no model at {path} (no config.json); {how}, or point the recipe elsewhere")


def resolve_checkpoint(path: str, select: str) -> str:
    """A ``global_step_N`` folder: itself; a run's checkpoint folder: the step ``select`` picks
    (``best-val``: the highest validation success saved with it, ties to the later step; ``latest``)."""
    if not os.path.isdir(path):
        raise EvalError(f"checkpoint {path}: no such folder; give a global_step_N folder or a run's trainer.default_local_dir")
    path = os.path.abspath(path)
    if step_of(path) is not None:
        return path
    steps = [step_folder(path, step) for step in steps_in(path)]
    if not steps:
        raise EvalError(f"checkpoint {path}: no global_step_N folders in it; is it a run's trainer.default_local_dir?")
    if select == "latest":
        return steps[-1]
    scored = [(score, step_of(p), p) for p in steps if (score := val_success(p)) is not None]
    if not scored:
        raise EvalError(
            f"checkpoint {path}: no step has {VAL_METRICS} (validation on the val split at a saved step: train with "
            f"trainer.test_freq dividing trainer.save_freq); or take the last step with --select latest"
        )
    return max(scored)[2]


def val_success(step_dir: str) -> float | None:
    """Mean validation success saved with a checkpoint (over data sources), or None."""
    path = os.path.join(step_dir, VAL_METRICS)
    if not os.path.isfile(path):
        return None
    try:
        metrics = json.load(open(path))["metrics"]
    except (ValueError, KeyError) as error:
        raise EvalError(f"{path}: unreadable ({error}); delete it or choose the step by its folder") from None
    values = [value for key, value in metrics.items() if SUCCESS_KEY.match(key)]
    return sum(values) / len(values) if values else None


def adapters_only(step_dir: str) -> bool:
    """A step kept as its adapters alone (``reproduce --archive``): the adapter group's peft exports,
    without verl's checkpoint of the group (the base model's weights and the optimizer's state)."""
    group = os.path.join(step_dir, POLICIES_DIR, ADAPTER_GROUP)
    return os.path.isdir(os.path.join(group, EXPORT_DIR)) and not glob.glob(os.path.join(group, "model_world_size_*"))


def exported_adapters(step_dir: str, cfg: DictConfig) -> dict[str, str]:
    """adapter policy -> its peft folder in an ``adapters_only`` step."""
    folder = os.path.join(step_dir, POLICIES_DIR, ADAPTER_GROUP, EXPORT_DIR)
    return {name: os.path.join(folder, name) for name, policy in load(cfg.get(SECTION)).policy_table().items() if policy.adapter is not None}


def check_checkpoint(step_dir: str, cfg: DictConfig, recipe: str) -> None:
    """Every worker group of the recipe is in the checkpoint, from the same model architecture (an
    ``adapters_only`` step: every policy is an adapter, each one there)."""
    models = policy_models(cfg)
    if adapters_only(step_dir):
        missing = [name for name, folder in exported_adapters(step_dir, cfg).items() if not os.path.isfile(os.path.join(folder, "adapter_config.json"))]
        if set(models) != {ADAPTER_GROUP} or missing:
            raise EvalError(
                f"checkpoint {step_dir} holds adapters alone (no verl checkpoint), and recipe {recipe} "
                + (f"needs adapters {missing} it lacks" if missing else f"has full-model policies ({', '.join(sorted(set(models) - {ADAPTER_GROUP}))})")
                + ": evaluate it with the recipe it was trained with"
            )
    for group, model in models.items():
        folder = group_folder(step_dir, group, len(models))
        if not os.path.isdir(folder):
            saved = sorted(os.listdir(os.path.join(step_dir, POLICIES_DIR))) if os.path.isdir(os.path.join(step_dir, POLICIES_DIR)) else []
            raise EvalError(
                f"checkpoint {step_dir}: no policy {group!r} of recipe {recipe} (it holds {saved or 'no policies/ folder'}); "
                "evaluate it with the recipe it was trained with"
            )
        differ = saved_model_differs(folder, model)
        if differ:
            raise EvalError(
                f"checkpoint {folder}: another model than {model} of recipe {recipe} ({differ}); "
                "evaluate it with the recipe (and actor_rollout_ref.model.path) it was trained with"
            )


def swap_pair(cfg: DictConfig, swap: list[str] | None) -> list[str] | None:
    """The two policies of the swapped pass: as given, or the only two of a two-policy recipe when
    they are of one model family (a mixed team is swapped only when asked: docs/policies.md)."""
    table = load(cfg.get(SECTION)).policy_table()
    if swap:
        unknown = [name for name in swap if name not in table]
        if len(swap) != 2 or unknown:
            raise EvalError(f"--swap {','.join(swap)}: name two policies of the recipe; it has {sorted(table)}")
        return list(swap)
    return sorted(table) if len(table) == 2 and not across_families(cfg, sorted(table)) else None


def across_families(cfg: DictConfig, pair: list[str]) -> bool:
    """Whether two policies' models have different tokenizers (two model families)."""
    models, groups = policy_models(cfg), load(cfg.get(SECTION)).groups()
    group_of = {policy: group for group, policies in groups.items() for policy in policies}
    a, b = (models[group_of[name]] for name in pair)
    return not same_family(a, b)


def sample_overrides(samples: int) -> list[str]:
    """verl's validation plays each problem ``val_kwargs.n`` times (one batch: the n x problems episodes
    run at once, as one evaluation does); several of them are sampled, not greedy."""
    return [f"actor_rollout_ref.rollout.val_kwargs.n={samples}", "actor_rollout_ref.rollout.val_kwargs.do_sample=true"] if samples > 1 else []


def check_sampling(cfg: DictConfig, what: str) -> None:
    """Several episodes of a problem differ only where some role samples at a temperature above 0 in
    validation (verl's ``val_kwargs.temperature``, or a role's ``val_sampling``): greedy, they are one."""
    settings = load(cfg.get(SECTION))
    default = float(cfg.actor_rollout_ref.rollout.val_kwargs.get("temperature", 0.0) or 0.0)
    temperatures = [float(settings.sampling_overrides(role, True).get("temperature", default)) for role in settings.roles] or [default]
    if max(temperatures) <= 0:
        raise EvalError(
            f"{what} validates greedily (actor_rollout_ref.rollout.val_kwargs.temperature={default}, and no role's "
            "pettingllms.roles.<role>.val_sampling.temperature above 0): its episodes of one problem would all be the same; "
            "sample them with --set actor_rollout_ref.rollout.val_kwargs.temperature=1.0"
        )


def main_ppo_overrides(run: Run, episodes: int | None, run_dir: str, jobs: int = 1) -> list[str]:
    """``main_ppo`` arguments of a run: validation only, on its split, episodes logged to ``run_dir``;
    ``jobs``: how many such runs share the machine at once."""
    args = [
        *_rollout_threads(run.config, jobs),
        *run.overrides,
        "trainer.val_only=true",
        "trainer.val_before_train=true",
        "critic.enable=false",  # a gae recipe's value models: an evaluation builds none and reads no critic of a checkpoint
        f"data.val_files={run.data_file}",
        f"data.val_max_samples={episodes if episodes else -1}",
        # verl draws a val_max_samples subset at random (unseeded) when data.shuffle is on, its default:
        # every run would play other problems; off, each plays the split's first N, the same for all
        "data.shuffle=false",
        f"pettingllms.paths.episode_log_dir={os.path.join(run_dir, 'episodes')}",
        "trainer.logger=[console,file]",
        f"trainer.experiment_name=eval_{run.label}",
    ]
    if run.checkpoint and adapters_only(run.checkpoint):  # the base from the recipe, each adapter from the step
        args += ["trainer.resume_mode=disable", *(f"++pettingllms.policies.{name}.adapter.path={folder}"
                                                  for name, folder in exported_adapters(run.checkpoint, run.config).items())]
    elif run.checkpoint:
        args += ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={run.checkpoint}"]
    else:
        args += ["trainer.resume_mode=disable"]  # the recipe's models, not whatever its run saved last
    # the swapped pass is the run's own (--swap): a recipe's swap_policies (its validation in training) is replaced
    args.append(f"++pettingllms.swap_policies=[{run.swap[0]},{run.swap[1]}]" if run.swap else "++pettingllms.swap_policies=null")
    if run.swap and across_families(run.config, run.swap):
        args.append("++pettingllms.swap_across_families=true")  # asked for by name (--swap): two families swapped
    return args


def _rollout_threads(cfg: DictConfig, jobs: int = 1) -> list[str]:
    """On CPU the ``hf`` rollout server takes the recipe's threads (one in the tiny recipes), leaving
    the others to the trainer; an evaluation trains nothing, so the server gets every core, or its
    share of them when ``jobs`` runs play at once (a run's ``--set`` still wins)."""
    if cfg.actor_rollout_ref.rollout.name != "hf" or cfg.trainer.get("device") != "cpu":
        return []
    return [f"++actor_rollout_ref.rollout.engine_kwargs.hf.torch_threads={max(1, usable_cores() // jobs)}"]


def method_of(cfg: DictConfig) -> str:
    """What the table calls the run's team: SA, MAS with one shared policy, or per-role policies
    (a team program: "program" for MAS)."""
    settings = load(cfg.get(SECTION))
    if settings.workflow == "sa" and not settings.program.enabled:
        return "SA"
    team = "program" if settings.program.enabled else "MAS"
    table = settings.policy_table()
    if len(table) == 1:
        return f"{team} (shared policy)"
    kind = "LoRA" if all(p.adapter is not None for p in table.values()) else "full models" if all(p.adapter is None for p in table.values()) else "mixed"
    return f"{team} (per-role policies, {kind})"


def data_env(data_file: str) -> str:
    """The environment of a parquet split (its rows' ``data_source``)."""
    import pandas as pd

    sources = sorted(set(pd.read_parquet(data_file, columns=["data_source"])["data_source"]))
    return ",".join(sources)
