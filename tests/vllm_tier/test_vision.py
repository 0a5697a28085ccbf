"""A role that sees, below the trainer: the tiny vision-language model and its processor
(models/tiny_vl.py), the hf engine and server answering prompts with images (the image matters, and
every log-prob is the model's own), the checks before Ray starts. Here, in the vLLM tier's
environment: Qwen2-VL's processor needs torchvision, which the main environment's CPU torch has no
build of on a machine without PyTorch's own index."""

import asyncio

import pytest
import torch
from omegaconf import OmegaConf

from pettingllms_verl import envs
from pettingllms_verl.backends.hf.engine import HFGenerationEngine, SamplingSpec
from pettingllms_verl.envs.images import chat_inputs, message_images
from pettingllms_verl.models.tiny_vl import image_tokens
from pettingllms_verl.preflight import ConfigError, check

from support.configs import mas_config, two_policies

LOGPROB_ATOL = 1e-5


@pytest.fixture(scope="module")
def processor(tiny_vl_model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_vl_model_dir)


@pytest.fixture(scope="module")
def model(tiny_vl_model_dir):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir, dtype=torch.float32).eval()


def plan_prompt(processor, seed: int):
    """The plan agent's Plan-Path prompt with the grid drawn: (prompt ids, its images, the image tensors)."""
    env = envs.make("plan_path", size=6, image_roles=["plan"])
    env.reset(seed=seed)
    messages = env.observation("plan")
    inputs = chat_inputs(processor.tokenizer, processor, messages)
    return inputs["input_ids"], message_images(messages), {key: inputs[key] for key in ("pixel_values", "image_grid_thw")}


def test_a_placeholders_text_in_what_the_seeing_role_reads_is_taken_out(processor):
    """A reply or program output that spells the image placeholder, shown to the seeing role, would
    be one more image than the chat holds: the processor would fail on the prompt, and a text-only
    chat would send the model an image token with no image. It is taken out of the text."""
    env = envs.make("plan_path", size=6, image_roles=["plan"])
    env.reset(seed=0)
    messages = env.observation("plan")
    token = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    spelled = f"{processor.image_token} <|image_{processor.image_token}pad|>{getattr(processor, 'video_token', '')}"
    hostile = [{**m, "content": m["content"] + spelled if isinstance(m["content"], str) else [*m["content"], {"type": "text", "text": spelled}]}
               for m in messages]
    clean = chat_inputs(processor.tokenizer, processor, messages)["input_ids"]
    assert chat_inputs(processor.tokenizer, processor, hostile)["input_ids"].count(token) == clean.count(token) > 0
    assert token not in chat_inputs(processor.tokenizer, processor, [{"role": "user", "content": "printed " + spelled}])["input_ids"]


def forward_log_probs(model, prompt, media, response):
    """A direct forward over prompt + response with the prompt's images, unpadded."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids, mm_token_type_ids=(ids == model.config.image_token_id).long(), **media).logits[0]
    return torch.log_softmax(logits[len(prompt) - 1 : -1].float(), -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_the_warm_started_model_answers_the_image_prompt_in_format_and_the_random_one_does_not(warm_model, tmp_path, processor, model):
    """``tiny_vl --warm-start plan_path`` (the vision recipes' model): sampled at temperature 1, the plan
    agent's replies to its prompt with the grid drawn are moves the env reads; from random weights, none is."""
    from transformers import AutoModelForImageTextToText

    warm = AutoModelForImageTextToText.from_pretrained(warm_model("plan_path", tmp_path / "warm", vision=True), dtype=torch.float32).eval()
    env = envs.make("plan_path", size=6)
    env.reset(seed=0)  # the parser reads the env's move cap

    def readable(policy) -> int:
        torch.manual_seed(0)
        count = 0
        for seed in range(8):
            prompt, _, media = plan_prompt(processor, seed)
            ids = torch.tensor([prompt])
            out = policy.generate(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=(ids == policy.config.image_token_id).long(),
                                  **media, do_sample=True, temperature=1.0, max_new_tokens=24)
            count += env.parse_actions(processor.tokenizer.decode(out[0, len(prompt):], skip_special_tokens=True)) is not None
        return count

    random, warmed = readable(model), readable(warm)
    assert random == 0 and warmed >= 6, (random, warmed)


def test_a_drawn_grid_becomes_the_processors_image_tokens_and_the_image_changes_the_model(processor, model):
    prompt, images, media = plan_prompt(processor, seed=0)
    assert images[0].size == (84, 84)  # 6 x 6 cells of 14 pixels: the processor's size, one patch a cell
    assert prompt.count(model.config.image_token_id) == image_tokens() == 9
    other_prompt, _, other_media = plan_prompt(processor, seed=1)
    reply = processor.tokenizer.encode("<answer>R D</answer>")
    mine, swapped = forward_log_probs(model, prompt, media, reply), forward_log_probs(model, prompt, other_media, reply)
    assert (mine - swapped).abs().max() > 1e-3  # the same tokens with another grid's image: other log-probs


def test_an_image_over_the_processors_limit_is_resized_and_one_over_the_prompt_budget_ends_the_episode(processor):
    """The agent loop's render: an image larger than the processor allows becomes the processor's
    size (Qwen2-VL's processors resize to their pixel bounds); an image whose tokens do not fit the
    prompt budget raises PromptTooLong, which ends the episode as ``prompt_overflow`` (test_faults)."""
    import copy
    from types import SimpleNamespace

    from PIL import Image

    from pettingllms_verl.envs.images import image_part
    from pettingllms_verl.rollout.agent_loop import EpisodeAgentLoop
    from pettingllms_verl.rollout.codecs import Codec
    from pettingllms_verl.episodes.core import PromptTooLong

    env = envs.make("plan_path", size=6, image_roles=["plan"])
    env.reset(seed=0)
    messages = env.observation("plan")
    huge = Image.new("RGB", (2800, 2800), (200, 30, 30))
    messages[-1]["content"] = [image_part(huge) if part["type"] == "image" else part for part in messages[-1]["content"]]
    loop = SimpleNamespace(prompt_length=1024, apply_chat_template_kwargs={})
    ids = EpisodeAgentLoop.render(loop, Codec(processor.tokenizer, processor), messages)
    assert ids.count(processor.image_token_id) == image_tokens() == 9  # resized to the processor's bound, 84 x 84 pixels
    generous = copy.deepcopy(processor)  # a processor that keeps the image whole: (2800 / 28)^2 = 10,000 tokens
    generous.image_processor.size = {"shortest_edge": 84 * 84, "longest_edge": 2800 * 2800}
    with pytest.raises(PromptTooLong, match="10[0-9]{3}-token prompt exceeds data.max_prompt_length=1024"):
        EpisodeAgentLoop.render(loop, Codec(generous.tokenizer, generous), messages)


def test_the_engine_samples_image_prompts_with_their_own_log_probs_beside_text_prompts(processor, model, chat_ids):
    engine = HFGenerationEngine(model, processor.tokenizer)
    (a, _, media_a), (b, _, media_b) = plan_prompt(processor, 0), plan_prompt(processor, 1)
    text = chat_ids("a text prompt in the same call")
    greedy = SamplingSpec(max_tokens=6, temperature=0)
    together = engine.generate([a, text, b], [greedy] * 3, images=[media_a, None, media_b])  # left-padded, one call
    alone = [engine.generate([prompt], [greedy], images=[media])[0] for prompt, media in ((a, media_a), (b, media_b))]
    assert [together[0].token_ids, together[2].token_ids] == [g.token_ids for g in alone]
    assert together[1].token_ids == engine.generate([text], [greedy])[0].token_ids
    torch.manual_seed(0)
    sampled = engine.generate([a, a, b], [SamplingSpec(max_tokens=6, temperature=1.0)] * 3, images=[media_a, media_a, media_b])
    for prompt, media, generation in zip((a, a, b), (media_a, media_a, media_b), sampled):
        reference = forward_log_probs(model, prompt, media, generation.token_ids)
        assert torch.allclose(torch.tensor(generation.log_probs), reference, atol=LOGPROB_ATOL)


def test_the_server_answers_an_image_prompt_and_refuses_images_that_do_not_match_it(tiny_vl_model_dir, processor, tiny_model_dir):
    from verl.workers.config import RolloutConfig

    from pettingllms_verl.backends.hf.rollout import HFRolloutServer

    config = RolloutConfig(name="hf", tensor_model_parallel_size=1, prompt_length=256, response_length=8, dtype="float32")
    server = HFRolloutServer(config, OmegaConf.create({"path": tiny_vl_model_dir}), 0)
    prompt, images, _ = plan_prompt(processor, seed=0)
    def ask(ids, data):
        return asyncio.run(server.generate("r", ids, {"temperature": 0.0, "max_tokens": 4}, image_data=data))

    assert len(ask(prompt, images).token_ids) > 0
    with pytest.raises(ValueError, match="the prompt has 9 image tokens, and its 2 image\\(s\\) make 18"):
        ask(prompt, images * 2)
    text_server = HFRolloutServer(config, OmegaConf.create({"path": tiny_model_dir}), 0)
    with pytest.raises(ValueError, match="this server's model is text-only"):
        asyncio.run(text_server.generate("r", prompt, {"temperature": 0.0, "max_tokens": 4}, image_data=images))


def test_image_roles_need_a_vision_language_model_with_its_processor_and_no_shared_prefix_forward(tmp_path, plan_path_rows, tiny_model_dir, tiny_vl_model_dir):
    """The plan role shown the grid as an image (the env option image_roles): refused, naming the
    key, for a vision model folder without its processor and for the shared-prefix forward (a
    text-only model: tests/test_preflight.py); accepted with the tiny vision-language model, shared
    or beside a text-only policy whose tokenizer lacks only the image tokens."""
    import shutil

    images = {"pettingllms.env_kwargs.image_roles": "[plan]", "actor_rollout_ref.actor.use_prefix_grouper": "false"}
    vision = {**images, "actor_rollout_ref.model.path": tiny_vl_model_dir}
    check(two_policies(tmp_path, plan_path_rows, **vision))
    check(mas_config(tmp_path, **{"data.train_files": plan_path_rows, **vision}))
    bare = tmp_path / "vl_without_processor"
    shutil.copytree(tiny_vl_model_dir, bare)
    (bare / "processor_config.json").unlink()
    with pytest.raises(ConfigError, match="role plan's model .*vl_without_processor has no image processor") as error:
        check(two_policies(tmp_path, plan_path_rows, **{**vision, "actor_rollout_ref.model.path": str(bare)}))
    assert error.value.key == "pettingllms.env_kwargs.image_roles"
    # L2: the tool role's policy (the first) sees, the plan role's is a text-only model (its tokenizer: the same, less
    # the image tokens); the first policy's processor renders every prompt, so a text-only first policy is refused
    text_plan = {**vision, "pettingllms.env_kwargs.image_roles": "[tool]", "pettingllms.policies.b.overrides.model.path": tiny_model_dir}
    check(two_policies(tmp_path, plan_path_rows, **text_plan))
    with pytest.raises(ConfigError, match=r"role plan is played by .*, a text-only model") as error:
        check(two_policies(tmp_path, plan_path_rows, **{**text_plan, "pettingllms.env_kwargs.image_roles": "[tool,plan]"}))
    with pytest.raises(ConfigError, match=r"the first policy, a, is a text-only model .*: its tokenizer renders every prompt") as error:
        check(two_policies(tmp_path, plan_path_rows, **{**vision, "pettingllms.policies.a.overrides.model.path": tiny_model_dir}))
    assert error.value.key == "pettingllms.policies" and "fix: list a vision-language policy first" in str(error.value)
    with pytest.raises(ConfigError, match=r"with image roles \['plan'\]: the shared-prefix forward packs text rows only") as error:
        check(two_policies(tmp_path, plan_path_rows, **{**vision, "actor_rollout_ref.actor.use_prefix_grouper": "true"}))
    assert error.value.key == "actor_rollout_ref.actor.use_prefix_grouper"
