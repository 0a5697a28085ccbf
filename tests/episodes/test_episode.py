"""The AT-GRPO episode runner: tree nodes, branches, greedy continuation, group keys."""

import asyncio
import random
from collections import defaultdict

import pytest

from pettingllms_verl import envs
from pettingllms_verl.rollout.agent_loop import group_key
from pettingllms_verl.episodes.core import best_branch, run_episode
from pettingllms_verl.config import PettingLLMsConfig, SettingsError, load
from pettingllms_verl.envs.tictactoe.env import DRAW, LOSS, WIN

MOVES = ["U", "D", "L", "R"]


class ScriptedEngine:
    """Stands in for the rollout: replies are texts, 'tokenised' one character per id."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.calls = []  # (role, prompt ids, n) per engine call

    async def generate(self, role, prompt_ids, n):
        self.calls.append((role, tuple(prompt_ids), n))
        replies = []
        for _ in range(n):
            if role == "tool":
                text = f"```python\nprint('{self.rng.choice(MOVES)}')\n```"
            else:
                text = "<answer>" + " ".join(self.rng.choice(MOVES) for _ in range(self.rng.randint(1, 3))) + "</answer>"
            replies.append(([ord(c) for c in text], [-0.1] * len(text)))
        return replies


def render(role, messages):
    return [ord(c) for c in "".join(m["content"] for m in messages)]


def decode(role, ids):
    return "".join(chr(i) for i in ids)


def play(seed, k=4, mode="mas", alpha=1.0, engine=None):
    env = envs.make("plan_path", size=6, max_turns=3)
    env.reset(seed=seed)
    workflow = env.workflow(mode)
    engine = engine or ScriptedEngine(seed)
    episode = asyncio.run(run_episode(env, workflow.turn_order, workflow.max_turns, k, alpha, engine.generate, render, decode))
    return env, episode, engine


def nodes(episode):
    grouped = defaultdict(list)
    for sample in episode.samples:
        grouped[(sample.turn, sample.role, sample.node)].append(sample)
    return grouped


def test_every_node_has_k_branches_sharing_one_prompt():
    _, episode, _ = play(seed=3, k=4)
    assert nodes(episode)
    for samples in nodes(episode).values():
        assert [s.branch for s in samples] == [0, 1, 2, 3]
        assert len({tuple(s.prompt_ids) for s in samples}) == 1


def test_one_batched_engine_call_per_node():
    _, episode, engine = play(seed=4, k=4)
    assert len(engine.calls) == len(nodes(episode))
    assert all(n == 4 for _, _, n in engine.calls)


def test_greedy_choice_is_the_argmax_of_the_mixed_reward():
    _, episode, _ = play(seed=5, k=4, alpha=0.5)
    for samples in nodes(episode).values():
        chosen = [s for s in samples if s.chosen]
        assert len(chosen) == 1
        assert chosen[0].reward == max(s.reward for s in samples)
        assert chosen[0].branch == min(s.branch for s in samples if s.reward == chosen[0].reward)
        for s in samples:
            assert s.reward == pytest.approx(0.5 * s.global_reward + s.local_reward)
    assert best_branch([0.1, 0.3, 0.3, -1.0]) == 1


def test_episode_continues_from_the_chosen_branch():
    # The next node's prompt is the chosen clone's observation: replay the chosen replies on a
    # fresh env and compare the prompts the runner used.
    env, episode, _ = play(seed=6, k=3)
    replay = envs.make("plan_path", size=6, max_turns=3)
    replay.reset(seed=6)
    for samples in nodes(episode).values():
        assert samples[0].prompt_ids == render(samples[0].role, replay.observation(samples[0].role))
        chosen = next(s for s in samples if s.chosen)
        replay.step(chosen.role, decode(chosen.role, chosen.response_ids))
    assert replay.success == episode.success


def test_the_parent_env_is_never_stepped():
    env, episode, _ = play(seed=7, k=4)
    fresh = envs.make("plan_path", size=6, max_turns=3)
    fresh.reset(seed=7)
    assert env.view() == fresh.view() and env.turn == 0 and not env.done
    assert episode.turns >= 1


def test_no_group_spans_two_problems_or_two_states():
    settings = PettingLLMsConfig(rollout_mode="tree", k=4)
    groups = defaultdict(list)
    for uid, seed in (("1", 11), ("11", 12), ("1|t1", 13)):  # uids that collide under naive joins
        _, episode, _ = play(seed=seed, k=4)
        for sample in episode.samples:
            groups[group_key(uid, 0, sample, settings)].append((uid, tuple(sample.prompt_ids)))
    for members in groups.values():
        assert len(members) == 4
        assert len({uid for uid, _ in members}) == 1
        assert len({prompt for _, prompt in members}) == 1


def test_independent_mode_groups_across_sessions_by_turn_and_role():
    settings = PettingLLMsConfig(rollout_mode="independent", k=4)
    assert settings.branches(validate=False) == 1 and PettingLLMsConfig(k=4).branches(validate=True) == 1
    keys = set()
    for session in range(3):
        _, episode, _ = play(seed=20 + session, k=1)
        keys |= {group_key("p", session, s, settings) for s in episode.samples if s.turn == 0}
    assert keys == {"p|t0|tool|indep", "p|t0|plan|indep"}


@pytest.mark.parametrize("group_by, groups", [([], 1), (["role"], 2), (["turn"], 2), (["turn", "role"], 4)])
def test_group_by_keeps_only_the_named_parts_of_the_key(group_by, groups):
    """The credit-assignment ablation: with fewer parts, replies of other turns, roles and nodes of
    the same problem share a group (one tree, K = 4, two turns: one node per turn and role)."""
    _, episode, _ = play(seed=7, k=4)
    assert {s.turn for s in episode.samples} == {0, 1}
    full = {group_key("p", 0, s, PettingLLMsConfig(k=4)) for s in episode.samples}
    keys = {group_key("p", 0, s, PettingLLMsConfig(k=4, group_by=group_by)) for s in episode.samples}
    assert len(keys) == groups <= len(full) == 4 and all(key.startswith("p") for key in keys)


@pytest.mark.parametrize(
    "section, message",
    [
        ({"workflow": "team"}, "pettingllms.workflow"),
        ({"rollout_mode": "beam"}, "pettingllms.rollout_mode"),
        ({"group_by": ["turn", "problem"]}, "pettingllms.group_by"),
        ({"group_by": ["role", "role"]}, "pettingllms.group_by"),
        ({"k": 0}, "pettingllms.k"),
        ({"roles": {"plan": {"sampling": {"temprature": 1.0}}}}, "pettingllms.roles.plan.sampling"),
        ({"alhpa": 1.0}, "pettingllms.alhpa"),
        ({"policies": {"../../x": {}, "b": {}}, "roles": {"plan": {"policy": "../../x"}, "tool": {"policy": "b"}}},
         r"names the policy's checkpoint folder"),  # a path out of the checkpoint folder
        ({"policies": {"a b": {}}}, r"pettingllms.policies.a b: the name 'a b'"),
        ({"roles": {"plan": {"sampling": {"temperature": 1e-300}}}}, r"roles.plan.sampling.temperature: 1e-300; 0 \(greedy\) or a finite number of at least "
                                                                     r"1e-05"),
        ({"roles": {"plan": {"val_sampling": {"temperature": -1.0}}}}, r"roles.plan.val_sampling.temperature: -1.0"),
        ({"roles": {"plan": {"sampling": {"temperature": float("inf")}}}}, r"roles.plan.sampling.temperature: inf"),
        ({"policies": {"a": {"overrides": {"rollout": {"temperature": 1e-9}}}}}, r"policies.a.overrides.rollout.temperature: 1e-09"),
        ({"policies": {"a": {"overrides": {"rollout": {"temperature": True}}}}}, r"policies.a.overrides.rollout.temperature: True"),
        ({"policies": {"a": {"overrides": {"rollout": {"temperature": "hot"}}}}}, r"policies.a.overrides.rollout.temperature: 'hot'"),
        ({"policies": {"a": {"overrides": {"rollout": 0.5}}}}, r"policies.a.overrides.rollout: 0.5; a mapping"),
    ],
)
def test_bad_settings_name_the_key(section, message):
    from omegaconf import OmegaConf

    with pytest.raises(SettingsError, match=message):
        load(OmegaConf.create(section))


@pytest.mark.parametrize(
    "old, new",
    [
        ("artifacts", "paths.artifacts"),
        ("batch_dump_dir", "paths.batch_dump_dir"),
        ("episode_log_dir", "paths.episode_log_dir"),
        ("mini_batches_per_step", "trainer.mini_batches_per_step"),
        ("replay_poll_interval_s", "trainer.replay_poll_interval_s"),
    ],
)
def test_a_moved_key_names_where_it_went(old, new):
    from omegaconf import OmegaConf

    with pytest.raises(SettingsError, match=rf"^pettingllms\.{old}: moved to pettingllms\.{new}$"):
        load(OmegaConf.create({old: None}))
    with pytest.raises(SettingsError, match=rf"moved to pettingllms\.{new}"):
        load({"k": 2, old: "/somewhere"})  # a plain dict too


def test_paths_and_trainer_knobs_load_from_their_sub_sections():
    from omegaconf import OmegaConf

    settings = load(OmegaConf.create({
        "k": 2,
        "paths": {"artifacts": "/a", "batch_dump_dir": "/a/batches", "episode_log_dir": "/a/episodes"},
        "trainer": {"mini_batches_per_step": 3, "replay_poll_interval_s": 0.05},
    }))
    assert (settings.paths.artifacts, settings.paths.batch_dump_dir, settings.paths.episode_log_dir) == ("/a", "/a/batches", "/a/episodes")
    assert (settings.trainer.mini_batches_per_step, settings.trainer.replay_poll_interval_s) == (3, 0.05)
    assert settings.k == 2
    defaults = load(None)
    assert defaults.paths.episode_log_dir is None and defaults.trainer.mini_batches_per_step is None
    with pytest.raises(SettingsError, match="pettingllms.trainer.mini_batches_per_step: 0; need at least 1"):
        load(OmegaConf.create({"trainer": {"mini_batches_per_step": 0}}))
    with pytest.raises(SettingsError, match="pettingllms.paths.episode_lg_dir"):
        load(OmegaConf.create({"paths": {"episode_lg_dir": "/x"}}))


def test_roles_route_to_their_policies_and_the_swap_exchanges_two():
    from omegaconf import OmegaConf

    settings = load(OmegaConf.create({
        "policies": {"a": {}, "b": {}, "c": {}},
        "roles": {"tool": {"policy": "a"}, "plan": {"policy": "b"}, "judge": {"policy": "c"}},
        "swap_policies": ["a", "b"],
    }))
    assert [settings.policy_of(r) for r in ("tool", "plan", "judge")] == ["a", "b", "c"]
    assert [settings.policy_of(r, swapped=True) for r in ("tool", "plan", "judge")] == ["b", "a", "c"]
    assert load(None).policy_of("anything") == "shared"  # L0: the table of one policy
    with pytest.raises(SettingsError, match="pettingllms.roles.tool.policy: not set"):
        load(OmegaConf.create({"policies": {"a": {}, "b": {}}})).policy_of("tool")


def test_router_sends_each_request_to_its_policy_and_never_forwards_the_name():
    import asyncio

    from verl.workers.rollout.replica import TokenOutput

    from pettingllms_verl.trainer.policies import PolicyRouterClient

    class Recorder:
        def __init__(self, stamp):
            self.stamp, self.calls = stamp, []

        async def generate(self, request_id, **kwargs):
            self.calls.append((request_id, kwargs))
            return TokenOutput(token_ids=[1], extra_fields=self.stamp)

    clients = {"a": Recorder({"policy": "a"}), "b": Recorder({}), "lora": Recorder({})}  # b: stamps nothing (vLLM)
    routes = {"a": ("a", None), "b": ("b", None), "coder": ("lora", "coder"), "tester": ("lora", "tester")}
    router = PolicyRouterClient(config=None, clients=clients, routes=routes)
    assert asyncio.run(router.generate("r1", policy="a", prompt_ids=[1])).extra_fields["policy"] == "a"
    assert asyncio.run(router.generate("r2", policy="b", prompt_ids=[2])).extra_fields["policy"] == "b"
    assert clients["b"].calls == [("r2", {"prompt_ids": [2]})] and clients["a"].calls == [("r1", {"prompt_ids": [1]})]
    # adapter policies (L1): one group's replicas, each request naming its policy's adapter
    asyncio.run(router.generate("r3", policy="tester", prompt_ids=[3]))
    asyncio.run(router.generate("r4", policy="coder", prompt_ids=[4]))
    assert clients["lora"].calls == [("r3", {"prompt_ids": [3], "adapter": "tester"}), ("r4", {"prompt_ids": [4], "adapter": "coder"})]
    with pytest.raises(KeyError, match="no policy 'c'"):
        asyncio.run(router.generate("r2", policy="c", prompt_ids=[1]))


def test_an_advantage_group_spanning_two_policies_is_refused():
    from pettingllms_verl.trainer.batching import check_groups_within_policies

    check_groups_within_policies(["g1", "g1", "g2"], ["a", "a", "b"])
    with pytest.raises(AssertionError, match="spans policies 'a' and 'b'"):
        check_groups_within_policies(["g1", "g1"], ["a", "b"])


def test_validation_samples_as_val_kwargs_unless_the_role_says_otherwise():
    from omegaconf import OmegaConf

    settings = load(OmegaConf.create({"roles": {
        "tool": {"sampling": {"temperature": 1.2, "top_p": 0.9, "max_tokens": 48, "stop": ["</code>"]}},
        "plan": {"sampling": {"temperature": 1.2, "max_tokens": 24}, "val_sampling": {"temperature": 0.3}},
    }}))
    assert settings.sampling_overrides("tool", validate=False) == {"temperature": 1.2, "top_p": 0.9, "max_tokens": 48, "stop": ["</code>"]}
    # the training temperature must not turn verl's greedy validation into sampling
    assert settings.sampling_overrides("tool", validate=True) == {"max_tokens": 48, "stop": ["</code>"]}
    assert settings.sampling_overrides("plan", validate=True) == {"max_tokens": 24, "temperature": 0.3}


@pytest.mark.parametrize("name", envs.available())
def test_every_env_refuses_an_option_it_does_not_declare(name):
    """A misspelt option (``max_turn``) must not silently fall back to its default."""
    cls = type(envs.make(name))
    assert cls.options and all(isinstance(help, str) and help for help in cls.options.values())
    with pytest.raises(ValueError, match=f"{name}: unknown option 'max_turn'; its options are"):
        envs.make(name, max_turn=2)


def test_sandbox_runs_reach_the_metrics_per_role_and_status():
    from pettingllms_verl.trainer.metrics import episode_metrics

    def row(role, runs):
        return {"mas_role": role, "mas_local_reward": 0.0, "mas_parse_ok": True, "mas_sandbox_runs": runs}

    metrics = episode_metrics([row("tool", {"ok": 1}), row("tool", {"timeout": 1}), row("tool", {"ok": 1}), row("plan", {})])
    assert (metrics["mas/tool/sandbox/runs"], metrics["mas/tool/sandbox/ok"], metrics["mas/tool/sandbox/timeout"]) == (3, 2, 1)
    assert not any(key.startswith("mas/plan/sandbox") for key in metrics)  # plan runs no code


def test_the_loser_of_a_game_is_credited_on_its_last_move():
    """MAS Tic-Tac-Toe: x wins on its third move; o's LOSS is added to o's last chosen reply (the move
    that let x win), not only reported on x's winning step."""
    episode = tictactoe_episode({"x": iter([["0"], ["1"], ["2"]]), "o": iter([["3"], ["4"]])}, k=1)
    x_moves = [s for s in episode.samples if s.role == "x"]
    o_moves = [s for s in episode.samples if s.role == "o"]
    assert x_moves[-1].local_reward == WIN and x_moves[-1].info["final_rewards"]["o"] == LOSS
    assert o_moves[-1].local_reward == LOSS  # credited once
    assert o_moves[-1].reward == 1.0 * o_moves[-1].global_reward + LOSS
    assert o_moves[0].local_reward == 0.0  # earlier moves keep their own reward

    # in a K = 2 tree the final outcome is not pinned on the chosen branch alone (its sibling was never
    # played on): each branch gets the value of its own position, LOSS for both o moves, once
    script = {"x": iter([["0", "0"], ["1", "1"], ["2", "2"]]), "o": iter([["3", "3"], ["4", "4"]])}
    episode = tictactoe_episode(script, k=2)
    last_o = [s for s in episode.samples if s.role == "o" and s.turn == 1]
    assert [s.local_reward for s in last_o] == [LOSS, LOSS] and [s.info["position_value"] for s in last_o] == [LOSS, LOSS]
    last_x = [s for s in episode.samples if s.role == "x" and s.turn == 2]
    assert [s.local_reward for s in last_x] == [WIN, WIN] and "position_value" not in last_x[0].info  # the win, once


def tictactoe_episode(script, k, max_turns=None):
    """MAS Tic-Tac-Toe, x first; ``script[role]`` yields the K reply texts of each of that role's nodes."""

    async def generate(role, prompt_ids, n):
        texts = next(script[role])
        assert len(texts) == n
        return [([ord(c) for c in text], [-0.1] * len(text)) for text in texts]

    env = envs.make("tictactoe")
    env.reset(seed=0, task={"seed": 0, "first": "x", "opponent": "random"})
    workflow = env.workflow("mas")
    return asyncio.run(run_episode(env, workflow.turn_order, max_turns or workflow.max_turns, k, 1.0, generate, render, decode))


def test_a_tree_credits_each_branch_with_what_its_move_allows():
    """After x 0, o 4, x 1 (x threatens 0-1-2), o's branch 0 plays 8 and lets x win on its next
    reply, branch 1 blocks at 2. The win would land on x's step; the tree credits each o branch with
    the value of its own position, so the block gets the higher reward and AT-GRPO advantage."""
    import torch

    from pettingllms_verl.algo import compute_at_grpo_advantage

    script = {
        "x": iter([["0", "0"], ["1", "1"], ["6", "6"], ["5", "5"], ["8", "8"]]),
        "o": iter([["4", "4"], ["8", "2"], ["3", "3"], ["7", "7"]]),
    }
    episode = tictactoe_episode(script, k=2)
    settings = PettingLLMsConfig(rollout_mode="tree", k=2)
    keys = [group_key("p", 0, s, settings) for s in episode.samples]
    scores = torch.tensor([[0.0, s.reward] for s in episode.samples])  # the reward sits on the last token
    advantages, _ = compute_at_grpo_advantage(scores, torch.ones_like(scores), keys)
    node = [i for i, s in enumerate(episode.samples) if (s.turn, s.role) == (1, "o")]
    allows, blocks = (episode.samples[i] for i in node)
    assert (allows.local_reward, blocks.local_reward) == (LOSS, DRAW) and blocks.reward > allows.reward
    assert advantages[node[1], -1] > 0 > advantages[node[0], -1]
    assert blocks.chosen and episode.end_cause is None and episode.final_global_reward == DRAW  # played on to a draw


def test_an_end_by_the_rules_on_the_last_turn_is_no_truncation():
    # x forfeits its first reply, so o's win lands on the last reply of the 5-turn budget
    game = {"x": ["pass", "2", "5", "6", "7"], "o": ["0", "1", "3", "4", "8"]}
    episode = tictactoe_episode({role: iter([[text] for text in texts]) for role, texts in game.items()}, k=1)
    assert (episode.turns, episode.samples[-1].info["result"]["x"], episode.end_cause) == (5, "loss", None)
    # the same game cut by the loop's budget, and a game that ran out of the env's own turns
    cut = tictactoe_episode({role: iter([[text] for text in texts]) for role, texts in game.items()}, k=1, max_turns=3)
    unfinished = tictactoe_episode({role: iter([["pass"]] * 5) for role in ("x", "o")}, k=1)
    assert (cut.end_cause, unfinished.end_cause) == ("max_turns", "max_turns")
