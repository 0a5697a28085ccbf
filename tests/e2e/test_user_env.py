"""A user's own environment and reward, from a package of their own (``examples/relay_env``),
without editing pettingllms-verl: found by the recipe's ``pettingllms.envs`` or the package's entry
point, in every rollout worker; a role's reward replaced by the user's function; bad names refused
in the driver, naming the key."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from pettingllms_verl import envs
from pettingllms_verl.envs.base import StepResult
from pettingllms_verl.preflight import ConfigError, check
from pettingllms_verl.episodes.core import ENV_LOCAL_REWARD
from support import REPO
from support.launch import checked as _run  # a command that must succeed, its output in the failure

EXAMPLE = REPO / "examples" / "relay_env"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The example installed as a user installs it (pip, from its own folder), into a folder of its own."""
    source, site = tmp_path_factory.mktemp("relay_source") / "relay_env", tmp_path_factory.mktemp("relay_site")
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))  # pip builds in place
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site), str(source)])
    return site


def _with(site: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(site)}


@pytest.fixture()
def relay_importable(monkeypatch):
    """The example's package importable in this process (its source folder on sys.path)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield
    for name in [n for n in sys.modules if n == "relay_env" or n.startswith("relay_env.")]:
        del sys.modules[name]


def test_an_installed_package_declares_its_environment_through_the_entry_point_group(site, tmp_path):
    probe = (
        "from pettingllms_verl import envs; import relay_env.env as m; env = envs.make('relay'); env.reset(3);"
        "print(envs.declared()); print(type(env) is m.RelayEnv, m.__file__); print(envs.available())"
    )
    out = _run([sys.executable, "-c", probe], cwd=tmp_path, env=_with(site)).stdout.splitlines()
    assert "'relay': 'relay_env.env:RelayEnv'" in out[0] and out[1].startswith("True " + str(site))  # the installed copy
    assert "relay" not in out[2]  # what is built from available() (the tiny corpus, --envs all) is the shipped set


@pytest.mark.slow
def test_the_example_recipe_trains_a_step_through_main_ppo_with_the_users_env_and_reward(site, tmp_path, tiny_model_dir):
    artifacts = tmp_path / "artifacts"
    (artifacts / "data").mkdir(parents=True)
    (artifacts / "tiny_model").symlink_to(tiny_model_dir)
    env = {**_with(site), "PETTINGLLMS_ARTIFACTS": str(artifacts), "VERL_FILE_LOGGER_PATH": str(tmp_path / "metrics.jsonl")}
    _run([sys.executable, "-m", "relay_env.data_prep", "--out-dir", str(artifacts / "data" / "relay")], cwd=tmp_path, env=env)
    episodes = tmp_path / "episodes"
    _run(
        [sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", str(site / "relay_env" / "recipes"),
         "--config-name", "relay_mas_cpu", "trainer.total_training_steps=1", f"pettingllms.paths.episode_log_dir={episodes}"],
        cwd=tmp_path, env=env,
    )
    [step] = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    data = step["data"]
    assert step["step"] == 1 and data["mas/episode_errors"] == 0
    assert {"mas/describer/reward_mean", "mas/guesser/reward_mean"} <= set(data) and data["at_grpo/mean_group_size"] == 4
    records = [json.loads(line) for path in episodes.iterdir() for line in open(path)]
    describer = [s for r in records for s in r["samples"] if s["role"] == "describer"]
    assert records and {r["env"] for r in records} == {"relay"} and len(describer) >= 4
    # the recipe's reward (relay_env.rewards:short_clue) replaced the env's for the describer only
    for sample in describer:
        assert sample["local_reward"] == pytest.approx(sample["info"][ENV_LOCAL_REWARD] - 0.01 * len(sample["reply"].split()))
    assert not any(ENV_LOCAL_REWARD in s["info"] for r in records for s in r["samples"] if s["role"] == "guesser")


def test_the_agent_loop_registers_the_recipes_environments_and_rewards_in_its_own_process(relay_importable, tiny_model_dir):
    """What every rollout worker does: ``pettingllms.envs`` and ``roles.<role>.reward`` come with
    the config, so a name no registry knows (``my_relay``) plays, scored by the user's function."""
    from support.episodes import K, ReplyingServer, play_env
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    settings = {
        "envs": {"my_relay": "relay_env.env:RelayEnv"},
        "roles": {"describer": {"reward": str(EXAMPLE / "relay_env" / "rewards.py") + ":short_clue"}},
    }
    task = {"word": "apple", "choices": ["apple", "river", "cloud", "tiger"]}
    try:
        outputs = play_env(tokenizer, ReplyingServer(tokenizer, "red fruit <answer>apple</answer>"), "my_relay", task, settings)
    finally:
        envs._ENVS.pop("my_relay", None)
    rows = [o.extra_fields for o in outputs]
    describer = [r for r in rows if r["mas_role"] == "describer"]
    guesser = [r for r in rows if r["mas_role"] == "guesser"]
    assert len(describer) == len(guesser) == K and rows[-1]["mas_success"]
    reply = tokenizer.decode(tokenizer.encode("red fruit <answer>apple</answer>")[:16], skip_special_tokens=True)  # play_env's 16-token replies
    # the file's function: the env's reward (the clue names the word: LEAK_PENALTY) less 0.01 a word
    assert all(r["mas_local_reward"] == pytest.approx(-1.0 - 0.01 * len(reply.split())) for r in describer)
    assert all(r["mas_local_reward"] == 1.0 for r in guesser)  # the env's own


def test_a_reward_function_that_raises_ends_its_episode_as_an_env_error(relay_importable):
    import asyncio

    from pettingllms_verl.episodes.core import run_episode

    env = envs.env_class("relay_env.env:RelayEnv")()  # a 'module:Class' name needs no registration
    env.reset(seed=1)

    async def generate(role, prompt_ids, n):
        return [([1, 2], [-0.1, -0.1])] * n

    def broken(**_):
        raise ZeroDivisionError("the user's bug")

    episode = asyncio.run(run_episode(env, ("describer", "guesser"), 1, 2, 1.0, generate, lambda role, m: [0], lambda role, ids: "clue",
                                      rewards={"describer": broken}))
    assert episode.end_cause == "env_error" and isinstance(episode.error, ZeroDivisionError)


def _mas_config(tmp_path, rows: str, **overrides):
    from support.configs import mas_config

    return mas_config(tmp_path, **{"data.train_files": rows, "pettingllms.envs.relay": "relay_env.env:RelayEnv", **overrides})


@pytest.fixture()
def relay_rows(tmp_path, relay_importable):
    from pettingllms_verl.data.rows import task_row, write_parquet

    path = tmp_path / "relay.parquet"  # not train.parquet: test_preflight's config() writes an empty one there
    write_parquet([task_row("relay", 0, {"word": "apple", "choices": ["apple", "river"]}, "train", 0)], str(path))
    yield str(path)
    envs._ENVS.pop("relay", None)


@pytest.mark.parametrize(
    "overrides, key, problem",
    [
        ({"pettingllms.envs.relay": "relay_env.nowhere:RelayEnv"}, "pettingllms.envs.relay", "cannot import 'relay_env.nowhere'"),
        ({"pettingllms.envs.relay": "relay_env.env:Nothing"}, "pettingllms.envs.relay", "has no 'Nothing'"),
        ({"pettingllms.envs.relay": "relay_env.env:generate_task"}, "pettingllms.envs.relay", "not a subclass of pettingllms_verl.envs.Env"),
        ({"pettingllms.envs.relay": "RelayEnv"}, "pettingllms.envs.relay", "is not 'package.module:name'"),
        ({"pettingllms.roles.describer.reward": "relay_env.rewards:WORD_COST"}, "pettingllms.roles.describer.reward", "not a function"),
        ({"pettingllms.roles.describer.reward": "/no/such/file.py:fn"}, "pettingllms.roles.describer.reward", "file not found"),
    ],
)
def test_bad_user_code_names_are_refused_in_the_driver_naming_the_key(tmp_path, relay_rows, overrides, key, problem):
    check(_mas_config(tmp_path, relay_rows, **{"pettingllms.roles.describer.reward": "relay_env.rewards:short_clue"}))
    envs._ENVS.pop("relay", None)
    with pytest.raises(ConfigError) as error:
        check(_mas_config(tmp_path, relay_rows, **overrides))
    assert error.value.key == key and problem in str(error.value), str(error.value)


def test_rows_naming_an_environment_nobody_declared_are_refused_naming_the_key(tmp_path, relay_rows):
    from support.configs import mas_config

    with pytest.raises(ConfigError) as error:
        check(mas_config(tmp_path, **{"data.train_files": relay_rows}))
    assert error.value.key == "pettingllms.envs.relay" and "names the environment 'relay'" in str(error.value)
    assert "+pettingllms.envs.relay=package.module:Class on the command line" in str(error.value)


def test_user_code_that_fails_to_import_is_a_target_error_naming_it(tmp_path):
    from pettingllms_verl.targets import TargetError, load_target

    broken = tmp_path / "broken.py"
    broken.write_text("import numpy\nraise RuntimeError('the user module broke')\n")
    with pytest.raises(TargetError, match=r"importing '.*broken.py' \(for '.*broken.py:Env'\) failed: RuntimeError\('the user module broke'\)"):
        load_target(f"{broken}:Env")
    assert not [m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == str(broken)]  # no half-run module left
    needs = tmp_path / "needs.py"
    needs.write_text("import a_dependency_nobody_installed\n")
    with pytest.raises(TargetError, match="importing .* failed: ModuleNotFoundError"):  # the module is there, its import is not
        load_target(f"{needs}:Env")
    with pytest.raises(TargetError, match="cannot import 'no_such_package.env' .* install the package"):
        load_target("no_such_package.env:Env")
    with pytest.raises(TargetError, match="give an absolute path"):
        load_target("relative/missing.py:Env")


def test_a_reward_is_not_asked_about_a_reply_the_env_ignored():
    from pettingllms_verl.envs.base import ignored
    from pettingllms_verl.episodes.core import _step

    class Over:
        def step(self, role, text):
            return ignored("episode is done")

    assert _step(Over(), "r", "late", lambda **_: 99.0) == ignored("episode is done")


def test_a_step_result_keeps_the_envs_own_reward_beside_the_users():
    from pettingllms_verl.episodes.core import _step

    class One:
        def step(self, role, text):
            return StepResult(0.5, True, {"seen": text})

    result = _step(One(), "r", "a b c", lambda role, reply, result, env: result.local_reward * 2 + len(reply.split()))
    assert result == StepResult(4.0, True, {"seen": "a b c", ENV_LOCAL_REWARD: 0.5})
    assert _step(One(), "r", "x", None) == StepResult(0.5, True, {"seen": "x"})
