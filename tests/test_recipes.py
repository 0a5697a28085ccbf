"""Every recipe in recipes/*.yaml composes with Hydra and passes verl's own config checks plus ours.

No GPU, no network: recipes are composed with Hydra's compose API (this package's Hydra plugin must
put verl's ``ppo_trainer`` on the search path), validated with what ``verl.trainer.main_ppo`` and the
V1 trainer run before any worker starts, and their datasets are generated (2 rows per split) with the data_prep command
each recipe documents, so a wrong key, wrong batch arithmetic, a bad value or a data path that no
data_prep command writes fails here rather than minutes into a run.
"""

from __future__ import annotations

import math
import random
import re
import runpy
import shlex
import typing
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf, open_dict

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"
REPO = RECIPES_DIR.parent
RECIPES = sorted(path.stem for path in RECIPES_DIR.glob("*.yaml"))
NAME = re.compile(r"^(?P<env>[a-z_]+?)_(?P<mode>mas_atgrpo|mas_grpo_by_problem|mas_ppo|mas_full_control|mas_full_async|mas_full|mas_lora|sa_grpo|program)_"
                  r"(?P<target>cpu|smollm2_cpu|repro_cpu|smollm2_repro_cpu|vllm_cpu|vision_cpu|vision_vllm_cpu|qwen3_1p7b|qwen3_8b|qwen2p5_vl_3b)$")
# the tiny model / the real SmolLM2-135M (make real-model) / make reproduce / make reproduce-real / vLLM's CPU build (make test-vllm)
# / the tiny vision-language model (make model-vl), with the hf rollout / with vLLM's CPU build
CPU_TARGETS = ("cpu", "smollm2_cpu", "repro_cpu", "smollm2_repro_cpu", "vllm_cpu", "vision_cpu", "vision_vllm_cpu")
EPISODE_RECIPES = [name for name in RECIPES if NAME.match(name)]
GPU_RECIPES = [name for name in EPISODE_RECIPES if NAME.match(name)["target"] not in CPU_TARGETS]
GPU_MODELS = {"qwen3_1p7b": ("Qwen/Qwen3-1.7B", 1), "qwen3_8b": ("Qwen/Qwen3-8B", 2), "qwen2p5_vl_3b": ("Qwen/Qwen2.5-VL-3B-Instruct", 1)}  # model, vLLM TP
MAS_MANAGER = "pettingllms_verl.rollout.worker.MASAgentLoopManager"
PREFLIGHT = "pettingllms_verl.preflight.Preflight"
# "python data_prep/<script>.py <args> --out-dir $PETTINGLLMS_ARTIFACTS/data/<dir>" in a recipe comment
DATA_COMMAND = re.compile(r"python (data_prep/\w+\.py)((?: [^\s`]+)*)")


def test_recipe_names_follow_the_scheme():
    # A recipe that is neither the quickstart nor <env>_<mode>_<target> would skip the per-mode checks below.
    assert set(RECIPES) - set(EPISODE_RECIPES) == {"quickstart_cpu"}
    assert len(GPU_RECIPES) >= 12


def test_the_hydra_plugin_puts_verl_and_the_recipes_on_every_search_path():
    from hydra.core.plugins import Plugins
    from hydra.plugins.search_path_plugin import SearchPathPlugin

    from hydra_plugins.pettingllms_verl_searchpath import PATHS

    # Hydra loads plugin modules itself (another class object than an import's): compare names
    found = {f"{plugin.__module__}.{plugin.__name__}" for plugin in Plugins.instance().discover(SearchPathPlugin)}
    assert "hydra_plugins.pettingllms_verl_searchpath.PettingLLMsSearchPathPlugin" in found
    assert PATHS == ("pkg://verl.trainer.config", "pkg://pettingllms_verl.recipes")
    for path in sorted(RECIPES_DIR.glob("*.yaml")):  # the header lives in base/pettingllms.yaml, once
        text = path.read_text()
        first = re.search(r"defaults:\n  - (\S+)\n", text)
        # a recipe starts from base/pettingllms, or from another recipe here that does (the control from its run's)
        assert "hydra:" not in text and ("\n  - base/pettingllms\n" in text or (first and first[1] in RECIPES)), path.name


def test_every_make_command_in_a_recipe_names_a_makefile_target():
    """Recipe comments point at the Makefile (the one place that launches); a renamed target fails here."""
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"(?m)^([\w-]+):", makefile)) | {"data-%"}
    for path in sorted(RECIPES_DIR.rglob("*.yaml")):
        for target in re.findall(r"`make ([\w-]+)", path.read_text()):
            assert target in targets or target.startswith("data-"), f"{path.name}: make {target}"
        for recipe in re.findall(r"`make \S+ RECIPE=(\w+)", path.read_text()):
            assert (RECIPES_DIR / f"{recipe}.yaml").is_file(), f"{path.name}: RECIPE={recipe}"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("artifacts")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PETTINGLLMS_ARTIFACTS", str(root))
        yield str(root)


@pytest.fixture(scope="module")
def recipe(artifacts):
    """name -> (resolved config without the hydra node, hydra node); each recipe composed once."""
    from hydra import compose, initialize_config_dir

    from pettingllms_verl.registration import register

    register()  # at_grpo, mas_sync, the episode agent loop (verl's plugin hook does this too; idempotent)
    cache: dict[str, tuple[DictConfig, DictConfig]] = {}

    def get(name: str) -> tuple[DictConfig, DictConfig]:
        if name not in cache:
            with initialize_config_dir(config_dir=str(RECIPES_DIR), version_base=None):
                cfg = compose(config_name=name, return_hydra_config=True)
            with open_dict(cfg):
                hydra_cfg = cfg.pop("hydra")
            OmegaConf.resolve(cfg)  # every interpolation must resolve (PETTINGLLMS_ARTIFACTS is set)
            cache[name] = (cfg, hydra_cfg)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def verl_defaults() -> dict:
    """verl's own ppo_trainer config, unresolved, as plain containers."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return OmegaConf.to_container(compose(config_name="ppo_trainer"), resolve=False)


@pytest.fixture(scope="module")
def datasets(artifacts) -> dict[str, Path]:
    """Run every data_prep command documented in recipes/ (2 tasks per split); data dir -> path."""
    commands = {}
    for path in sorted(RECIPES_DIR.rglob("*.yaml")):
        for script, args in DATA_COMMAND.findall(path.read_text()):
            argv = shlex.split(args.replace("$PETTINGLLMS_ARTIFACTS", artifacts))
            out_dir = Path(argv[argv.index("--out-dir") + 1])
            assert out_dir.parent == Path(artifacts) / "data", f"{path.name}: {script} writes outside $PETTINGLLMS_ARTIFACTS/data"
            commands[out_dir.name] = (script, argv)
    written = {}
    for name, (script, argv) in commands.items():
        main = runpy.run_path(str(REPO / script))["main"]
        # the quickstart (verl's own GRPO on arithmetic) validates on its test split: it has no val split
        sizes = ["--train", "2", "--test", "2"] + ([] if script == "data_prep/quickstart.py" else ["--val", "2"])
        try:
            main(argv + sizes)
        except SystemExit as offline:  # a hub download on this offline machine: it says why and what to do
            assert script in HUB_STAND_IN and "Hugging Face hub" in str(offline.code) and "file:PATH" in str(offline.code)
            main(_without_sources(argv) + HUB_STAND_IN[script] + sizes)
        written[name] = Path(artifacts) / "data" / name
    return written


# Scripts that download from the hub, and the offline sources that stand in for it here.
HUB_STAND_IN = {
    script: ["--train-source", "fixture", "--test-source", "fixture"] for script in ("data_prep/math_problems.py", "data_prep/code_problems.py")
}


def _without_sources(argv: list[str]) -> list[str]:
    kept, skip = [], False
    for arg in argv:
        if skip or arg in ("--train-source", "--test-source"):
            skip = not skip
            continue
        kept.append(arg)
    return kept


FREE_FORM = {"ray_kwargs.ray_init"}  # passed to ray.init(**ray_init)


def _walk_unknown(cfg: dict, ref: dict, path: str) -> list[str]:
    """Keys of ``cfg`` that verl's config does not have, except where verl takes free-form maps:
    an empty map in its YAML (e.g. ``data.apply_chat_template_kwargs``), ``FREE_FORM``, a
    ``dict``-typed field of the section's dataclass (``rollout.engine_kwargs``) or a dataclass field
    missing from the YAML (``rollout.agent.agent_loop_manager_class``)."""
    if not ref or path in FREE_FORM:
        return []
    hints = {}
    if isinstance(ref.get("_target_"), str):
        from hydra.utils import get_class

        hints = typing.get_type_hints(get_class(ref["_target_"]))
    unknown = []
    for key, value in cfg.items():
        full = f"{path}.{key}" if path else key
        if key in ref and isinstance(value, dict) and isinstance(ref[key], dict):
            hint = hints.get(key)
            if not (hint is dict or typing.get_origin(hint) is dict):
                unknown += _walk_unknown(value, ref[key], full)
        elif key not in ref and key not in hints:
            unknown.append(full)
    return unknown


@pytest.mark.parametrize("name", RECIPES)
def test_every_key_exists_in_verl_or_pettingllms(name, recipe, verl_defaults):
    cfg, _ = recipe(name)
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("pettingllms", None)  # ours: checked by pettingllms_verl.config.load below
    assert _walk_unknown(plain, verl_defaults, "") == []


def test_unknown_key_check_catches_a_typo(verl_defaults):
    typo = {"actor_rollout_ref": {"actor": {"clip_ration": 0.2}, "rollout": {"agent": {"agent_loop_manager_class": "x"}}}}
    assert _walk_unknown(typo, verl_defaults, "") == ["actor_rollout_ref.actor.clip_ration"]


@pytest.mark.parametrize("name", RECIPES)
def test_passes_verl_validation(name, recipe, tiny_model_dir):
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.import_utils import load_class_from_fqn
    from verl.workers.config import CheckpointEngineConfig, RolloutConfig

    cfg, hydra_cfg = recipe(name)
    if need_critic(cfg):  # verl reads the critic's model config from its folder: one that exists here
        cfg.critic.model.path = tiny_model_dir
    assert not hydra_cfg.searchpath  # the package's Hydra plugin adds it (hydra_plugins/): not copied per recipe
    assert hydra_cfg.callbacks.preflight._target_ == PREFLIGHT  # from base/pettingllms, first in every defaults list
    # what main_ppo runs before Ray starts: batch arithmetic, micro-batch settings, ActorConfig(.validate)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    # the dataclass conversions the V1 trainer and agent loop workers run (each __post_init__ checks values)
    assert isinstance(omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout), RolloutConfig)
    assert isinstance(omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout.checkpoint_engine), CheckpointEngineConfig)
    assert isinstance(omega_conf_to_dataclass(cfg.algorithm), AlgoConfig)
    if need_reference_policy(cfg):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.ref)
    # registered names the trainer looks up: estimator, policy loss, trainer mode, manager class
    get_adv_estimator_fn(cfg.algorithm.adv_estimator)
    get_policy_loss_fn(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
    get_trainer_cls(cfg.trainer.v1.trainer_mode)
    manager = cfg.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")
    if manager:
        load_class_from_fqn(manager, "AgentLoopManager")
    assert cfg.trainer.experiment_name == name  # checkpoints and logs are filed under the recipe's name


@pytest.mark.parametrize("name", [name for name in RECIPES if name.endswith("_cpu")])
def test_validation_rejects_broken_batch_arithmetic(name, recipe):
    """Guard for the test above: verl's batch checks are live for the CPU recipes (fixed micro-batches;
    the GPU recipes pack by tokens, see test_gpu_recipe_has_the_reference_hyperparameters)."""
    import copy

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg = copy.deepcopy(recipe(name)[0])
    assert not cfg.actor_rollout_ref.actor.use_dynamic_bsz
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = cfg.data.train_batch_size + 1  # more than a step's problems
    with pytest.raises((AssertionError, ValueError)):
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


@pytest.mark.parametrize("name", EPISODE_RECIPES)
def test_episode_recipe_matches_its_name_env_and_data(name, recipe, datasets, artifacts):
    import pandas as pd

    from pettingllms_verl import envs
    from pettingllms_verl.data.rows import EPISODE_AGENT, row_task
    from pettingllms_verl.config import load

    cfg, _ = recipe(name)
    parts = NAME.match(name)
    settings = load(cfg.get("pettingllms"))
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.agent.agent_loop_manager_class == MAS_MANAGER
    assert cfg.trainer.v1.trainer_mode == ("mas_colocate_async" if parts["mode"] == "mas_full_async" else "mas_sync")
    # mas_grpo_by_problem: the credit-assignment ablation, AT-GRPO's tree with groups keyed by problem alone
    assert (list(settings.group_by) == []) == (parts["mode"] == "mas_grpo_by_problem")
    # program: a team program plays the rows' tasks (agents/), its agents the env's roles here
    assert settings.program.enabled == (parts["mode"] == "program")
    assert (settings.trainer.null_reward == "permute") == (parts["mode"] == "mas_full_control")  # the null-training control alone
    if parts["mode"] in ("mas_atgrpo", "mas_grpo_by_problem", "mas_ppo", "mas_full_control", "mas_full_async", "mas_full", "mas_lora", "program"):
        # mas_ppo: the same tree, each reply valued by a critic (gae) instead of its group
        estimator = "gae" if parts["mode"] == "mas_ppo" else "at_grpo"
        assert (settings.workflow, settings.rollout_mode, cfg.algorithm.adv_estimator) == ("mas", "tree", estimator)
        assert rollout.n == 1 and settings.k > 1  # the K branches live inside one tree
    else:
        assert (settings.workflow, settings.rollout_mode, cfg.algorithm.adv_estimator) == ("sa", "independent", "grpo")
        assert rollout.n > 1  # the GRPO group
    if parts["target"] in ("vllm_cpu", "vision_vllm_cpu"):  # the vLLM tier: verl's vLLM server (adapters: several per server)
        assert (cfg.trainer.device, rollout.name) == ("cpu", "vllm_multilora" if parts["mode"] == "mas_lora" else "vllm")
        assert rollout.enable_prefix_caching and not rollout.enable_sleep_mode
    elif parts["target"] in CPU_TARGETS:
        assert (cfg.trainer.device, rollout.name) == ("cpu", "hf")
    else:  # vLLM; adapters: several per server
        assert (cfg.trainer.device, rollout.name) == ("cuda", "vllm_multilora" if parts["mode"] == "mas_lora" else "vllm")
        assert (cfg.actor_rollout_ref.model.path, rollout.tensor_model_parallel_size) == GPU_MODELS[parts["target"]]
        assert rollout.enable_prefix_caching  # the K branches and later turns of an episode share their prompt's KV
    assert cfg.trainer.default_local_dir == f"{artifacts}/checkpoints/{name}"

    # data: the files a documented data_prep command writes, rows of the env the recipe names
    data_dir = Path(cfg.data.train_files).parent
    assert data_dir.name in datasets, f"no data_prep command in recipes/ writes {data_dir}"
    assert (Path(cfg.data.train_files), Path(cfg.data.val_files)) == (data_dir / "train.parquet", data_dir / "val.parquet")
    assert parts["env"] in envs.available()
    assert data_dir.name == parts["env"] or data_dir.name.startswith(parts["env"] + "_")
    for path in (cfg.data.train_files, cfg.data.val_files):
        row = pd.read_parquet(path).iloc[0]
        env_name, seed, task = row_task(row["extra_info"])
        assert (env_name, row["agent_name"]) == (parts["env"], EPISODE_AGENT)
        size = re.search(r"_(\d+)x(\d+)$", data_dir.name)
        if size:  # a "<H>x<W>" variant holds boards of that size
            board = next(task[key] for key in ("grid", "room", "puzzle") if key in task)
            assert (len(board), len(board[0])) == (int(size[1]), int(size[2]))
        deck = re.search(r"^hanabi_(small|full)$", data_dir.name)
        if deck:  # a hanabi deck variant holds games with that deck
            from pettingllms_verl.envs.hanabi.env import FULL_DECK, SMALL_DECK

            rules = SMALL_DECK if deck[1] == "small" else FULL_DECK
            assert {key: task[key] for key in rules} == rules

        if settings.program.enabled:  # the program reads the task and env_kwargs itself; its agents are its own
            assert settings.program.target.startswith("examples/agents/") and (REPO / settings.program.target.split(":")[0]).is_file()
            continue
        # the env accepts env_kwargs, the workflow has the configured turn budget and roles
        env = envs.make(env_name, **settings.env_kwargs)
        env.reset(seed=seed, task=task)
        workflow = env.workflow(settings.workflow)
        if "max_turns" in settings.env_kwargs:
            assert workflow.max_turns == settings.env_kwargs["max_turns"]
        assert set(settings.roles) <= set(workflow.turn_order)
        if settings.roles and settings.workflow == "mas":
            assert set(settings.roles) == set(workflow.turn_order)
    for role in settings.roles.values():
        assert (role.sampling.max_tokens or 0) <= cfg.data.max_response_length  # else silently capped


def _is_tool_plan(env_name: str) -> bool:
    """A tool+plan grid puzzle (plan_path, sokoban, sudoku), not a game (tictactoe, hanabi)."""
    from pettingllms_verl import envs
    from pettingllms_verl.envs.tool_plan import ToolPlanEnv

    return isinstance(envs.make(env_name), ToolPlanEnv)


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_gpu_recipe_has_the_reference_hyperparameters(name, recipe):
    cfg, _ = recipe(name)
    settings = cfg.pettingllms
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert actor.optim.lr == (1e-5 if NAME.match(name)["mode"] == "mas_lora" else 1e-6)  # adapters: 10x
    assert actor.clip_ratio == actor.clip_ratio_low == actor.clip_ratio_high == 0.2
    assert (actor.use_kl_loss, cfg.algorithm.use_kl_in_reward, actor.entropy_coeff) == (False, False, 0)
    assert actor.loss_agg_mode == "token-mean" and actor.strategy == "fsdp2"
    assert cfg.data.train_batch_size == 32
    if _is_tool_plan(NAME.match(name)["env"]):
        assert settings.env_kwargs.max_turns == 5
    else:  # the games set their own length: tictactoe a fixed 5 turns, hanabi the whole game
        assert "max_turns" not in settings.get("env_kwargs", {})
    if NAME.match(name)["mode"] in ("mas_atgrpo", "mas_full", "mas_lora"):
        assert (settings.k, rollout.n, cfg.algorithm.adv_estimator) == (8, 1, "at_grpo")
    else:
        assert (rollout.n, cfg.algorithm.adv_estimator) == (8, "grpo")  # K = 8 episodes, the same budget
    assert 0.4 <= rollout.gpu_memory_utilization <= 0.7
    # the K branches and later turns of an episode (one request id: one replica) reuse the prompt's KV
    assert rollout.enable_prefix_caching
    assert cfg.trainer.save_freq > 0 and cfg.trainer.resume_mode == "auto"
    assert {"console", "file"} <= set(cfg.trainer.logger)
    # arithmetic verl checks only at run time under use_dynamic_bsz
    n_gpus = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    rows_per_update = actor.ppo_mini_batch_size * rollout.n
    assert rows_per_update % n_gpus == 0  # every data-parallel rank gets the same share
    assert n_gpus % rollout.tensor_model_parallel_size == 0  # whole vLLM replicas
    assert actor.ppo_max_token_len_per_gpu >= cfg.data.max_prompt_length + cfg.data.max_response_length


def _flat(cfg: DictConfig) -> dict:
    out = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return out


# keys the SA baseline sets differently from its AT-GRPO recipe (gpu_sa_grpo.yaml)
SA_DIFFERS = {
    "pettingllms.workflow", "pettingllms.rollout_mode", "algorithm.adv_estimator",
    "actor_rollout_ref.rollout.n", "actor_rollout_ref.actor.ppo_mini_batch_size",
    # verl interpolates these from the two above
    "actor_rollout_ref.actor.rollout_n", "actor_rollout_ref.ref.rollout_n", "critic.rollout_n", "critic.ppo_mini_batch_size",
}
# and per env, what the env itself needs for its single-agent variant
SA_ENV_DIFFERS = {"tictactoe": {"pettingllms.env_kwargs.mode"}}  # mode=sa: the fixed opponent answers x


@pytest.mark.parametrize("name", [name for name in GPU_RECIPES if "_mas_atgrpo_" in name])
def test_gpu_sa_baseline_differs_from_atgrpo_only_in_the_algorithm(name, recipe):
    mas, sa = recipe(name)[0], recipe(name.replace("_mas_atgrpo_", "_sa_grpo_"))[0]
    flat_mas, flat_sa = _flat(mas), _flat(sa)
    differ = {key for key in flat_mas.keys() | flat_sa.keys() if flat_mas.get(key) != flat_sa.get(key)}
    differ = {key for key in differ if name not in str(flat_mas.get(key))}  # experiment name and paths from it
    assert differ == SA_DIFFERS | SA_ENV_DIFFERS.get(NAME.match(name)["env"], set())
    # same optimiser-step size and group size: the comparison is at equal sample budget
    mas_ref, sa_ref = mas.actor_rollout_ref, sa.actor_rollout_ref
    assert mas_ref.actor.ppo_mini_batch_size * mas_ref.rollout.n == sa_ref.actor.ppo_mini_batch_size * sa_ref.rollout.n
    assert mas.pettingllms.k == sa.actor_rollout_ref.rollout.n


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_gpu_prompts_fit_max_prompt_length(name, recipe, datasets):
    """Byte-level BPE (Qwen3) never needs more tokens than UTF-8 bytes: bound the longest prompt
    (the plan agent's, with the tool's program and output at their cut lengths; a game's, whose
    prompts grow with its history, over played-out episodes) in bytes."""
    import pandas as pd

    from pettingllms_verl import envs
    from pettingllms_verl.envs import text, tool_plan
    from pettingllms_verl.data.rows import row_task

    cfg, _ = recipe(name)
    env_name, seed, task = row_task(pd.read_parquet(cfg.data.train_files).iloc[0]["extra_info"])
    env = envs.make(env_name, **cfg.pettingllms.get("env_kwargs", {}))
    env.reset(seed=seed, task=task)
    if _is_tool_plan(env_name):
        worst = tool_plan.plan_messages(
            env.prompts, env.view(), "x" * text.MAX_TOOL_CODE_CHARS, "y" * text.MAX_TOOL_OUTPUT_CHARS
        )
        prompts = [worst, env.observation("tool"), env.observation("plan")]
    else:
        prompts = _game_prompts(env, env.workflow(cfg.pettingllms.workflow), episodes=20)
    for messages in prompts:
        template_overhead = 32 * len(messages)  # <|im_start|>role\n ... <|im_end|>\n, generation prompt
        size = sum(_content_tokens_bound(m["content"]) for m in messages) + template_overhead
        assert size <= cfg.data.max_prompt_length


def _content_tokens_bound(content) -> int:
    """A message's tokens, bounded: its text's UTF-8 bytes, and for an image Qwen2-VL/2.5-VL's count
    (a token per 28 x 28 pixels, the sides rounded up to a multiple of 28, and its start and end tokens;
    for the grids drawn here, at least 56 pixels a side, the processor's own rounding is not above it)."""
    if isinstance(content, str):
        return len(content.encode())
    return sum(len(part["text"].encode()) if part["type"] == "text"
               else math.ceil(part["image"].width / 28) * math.ceil(part["image"].height / 28) + 2 for part in content)


def _game_prompts(env, workflow, episodes: int) -> list:
    """Every prompt of ``episodes`` games from ``env``'s state, played out with seeded random replies
    (moves, hints, plays, discards and unparseable ones: the history a prompt shows grows either way)."""
    prompts = []
    for episode in range(episodes):
        game, rng = env.clone(), random.Random(episode)
        for _ in range(workflow.max_turns):
            for role in workflow.turn_order:
                if not game.done:
                    prompts.append(game.observation(role))
                    game.step(role, rng.choice([
                        f"<answer>{rng.randrange(9)}</answer>",
                        f"<answer>{rng.choice(['play', 'discard'])} {rng.randrange(5)}</answer>",
                        f"<answer>hint color {rng.choice('RYGWB')}</answer>",
                        f"<answer>hint rank {rng.randint(1, 5)}</answer>",
                        "no action",
                    ]))
        assert game.done  # the turn budget ends every game: no prompt beyond it
    return prompts


@pytest.mark.parametrize("name", RECIPES)
def test_passes_preflight_once_its_model_and_data_exist(name, recipe, datasets, tmp_path, monkeypatch):
    """Every registry name, the pettingllms section, the Ray slots and the data paths (written by the
    data_prep command the recipe documents) pass the driver's checks; a local dir stands in for the model."""
    from pettingllms_verl.preflight import check

    # the vLLM recipes (GPU, and the vLLM tier's), checked where vLLM is not installed
    monkeypatch.setattr("pettingllms_verl.preflight.engines._vllm_installed", lambda: True)
    monkeypatch.setattr("pettingllms_verl.preflight.engines._vllm_distribution", lambda: "0.24.0")
    gpu = name in GPU_RECIPES  # flash-attention 2 (verl's default) there; the CPU recipes must pass without it
    monkeypatch.setattr("pettingllms_verl.preflight.engines._installed", lambda package: package == "vllm" or gpu and package == "flash_attn")
    cfg = recipe(name)[0].copy()
    with open_dict(cfg):
        cfg.actor_rollout_ref.model.path = str(tmp_path)
        for policy in (cfg.pettingllms.get("policies") or {}).values():  # a policy's own model (L2 beside a vision-language one)
            if policy and OmegaConf.select(policy, "overrides.model.path"):
                policy.overrides.model.path = str(tmp_path)
    for policy in (cfg.pettingllms.get("policies") or {}).values():  # an adapter's start folder (make real-warm-start): a peft folder of its rank
        if (policy or {}).get("adapter") and policy.adapter.get("path") and not Path(policy.adapter.path).is_dir():
            from peft import LoraConfig
            from safetensors.torch import save_file

            LoraConfig(r=policy.adapter.rank, lora_alpha=policy.adapter.alpha, target_modules="all-linear").save_pretrained(policy.adapter.path)
            save_file({}, str(Path(policy.adapter.path) / "adapter_model.safetensors"))
    check(cfg)
