"""A team of two model families: each role's prompts rendered, and its replies read, in its own
policy's tokens (``rollout/codecs.py``), through the real agent loop with a scripted server."""

import pytest
from transformers import AutoTokenizer
from verl.workers.rollout.replica import TokenOutput

from pettingllms_verl import envs
from pettingllms_verl.config import load
from pettingllms_verl.rollout.codecs import MODELS_KEY, Codec, codecs_of

from support.episodes import play_env

TOOL_REPLY = "```python\nprint('R')\n```"  # the tool's program: its text reaches the planner's prompt
PLAN_REPLY = "<answer>D</answer>"


@pytest.fixture(scope="module")
def bracket_model_dir(tmp_path_factory) -> str:
    from pettingllms_verl.models.tiny import build

    return build(str(tmp_path_factory.mktemp("bracket")), seed=0, family="bracket")


class FamilyServer:
    """Answers each policy in its own tokens, and keeps what each policy was asked."""

    def __init__(self, tokenizers: dict):
        self.tokenizers, self.prompts = tokenizers, {policy: [] for policy in tokenizers}

    async def generate(self, request_id, prompt_ids, sampling_params, policy=None):
        self.prompts[policy].append(list(prompt_ids))
        reply = self.tokenizers[policy].encode(TOOL_REPLY if policy == "tool_policy" else PLAN_REPLY)
        return TokenOutput(token_ids=reply, log_probs=[-0.5] * len(reply), extra_fields={"policy": policy, "global_steps": 0})


def mixed_team(chatml: str, bracket: str) -> tuple[dict, dict]:
    settings = {"policies": {"tool_policy": {"overrides": {"model": {"path": chatml}}}, "plan_policy": {"overrides": {"model": {"path": bracket}}}},
                "roles": {"tool": {"policy": "tool_policy"}, "plan": {"policy": "plan_policy"}}}
    custom = {"policy": "tool_policy", MODELS_KEY: {"tool_policy": {"path": chatml}, "plan_policy": {"path": bracket}}}
    return settings, custom


def test_each_roles_prompts_and_replies_are_in_its_own_policys_tokens_and_text_crosses_as_text(tiny_model_dir, bracket_model_dir):
    chatml, bracket = AutoTokenizer.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(bracket_model_dir)
    server = FamilyServer({"tool_policy": chatml, "plan_policy": bracket})
    settings, custom = mixed_team(tiny_model_dir, bracket_model_dir)
    source = envs.make("plan_path", size=4)
    source.reset(seed=3)
    outputs = play_env(chatml, server, "plan_path", source.task, settings=settings, rollout={"custom": custom}, max_turns=1, size=4)
    rows = {role: [o for o in outputs if o.extra_fields["mas_role"] == role] for role in ("tool", "plan")}
    assert rows["tool"] and rows["plan"] and all(o.extra_fields["mas_policy"] == role + "_policy" for role in rows for o in rows[role])
    for o in rows["tool"]:  # the worker's own tokenizer: ChatML
        assert chatml.decode(o.prompt_ids).startswith("<|im_start|>system") and chatml.decode(o.response_ids) == TOOL_REPLY
    for o in rows["plan"]:  # the other family's template and vocabulary, the tool's program in it as text
        prompt = bracket.decode(o.prompt_ids)
        assert prompt.startswith("<s>[SYSTEM] ") and prompt.endswith("[ASSISTANT] ") and "<|im_start|>" not in prompt
        assert "print('R')" in prompt and max(o.prompt_ids) < len(bracket)
        assert bracket.decode(o.response_ids) == PLAN_REPLY
        assert o.extra_fields["mas_parse_ok"]  # read with its own tokenizer: the move parsed
    assert [o.prompt_ids for o in rows["plan"]] == server.prompts["plan_policy"][:len(rows["plan"])]


def test_a_policy_on_the_first_groups_tokenizer_shares_the_workers_own(tiny_model_dir):
    """Two full models whose tokenizer is the same folder: no second tokenizer is loaded; L0 (and
    adapters, which live on the first group's base) always use the worker's."""
    settings, custom = mixed_team(tiny_model_dir, tiny_model_dir)
    own = Codec(AutoTokenizer.from_pretrained(tiny_model_dir))
    codecs = codecs_of(load(settings), {"custom": custom}, own)
    assert codecs["tool_policy"] is own and codecs["plan_policy"] is own
    assert codecs_of(load({}), {}, own) == {"shared": own}
