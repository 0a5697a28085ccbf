"""verl 0.9.1's Qwen2-VL forward, made to run a micro-batch without images on transformers 5.

verl patches Qwen2-VL's forward (``verl.models.transformers.qwen2_vl``); for a micro-batch with no
image it still runs the vision tower on a dummy input, so that every rank's forward touches the
same parameters, and adds ``0.0 * embeddings.mean()``. Since transformers 5 the tower returns an
output object, not the embeddings: verl unpacks it in the branches with images
(``unpack_visual_output``) but not in that one, so a text row of a vision-language policy (the tool
agent beside a plan agent that sees) fails there. ``fix_text_only_batches`` routes that one branch
through the same unpacking; the rest is verl's.
"""

from __future__ import annotations

VISION_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")  # the models whose forward verl patches with this module


def fix_text_only_batches() -> None:
    import torch
    from verl.models.transformers import qwen2_vl

    original = qwen2_vl._get_input_embeds
    if getattr(original, "text_only_fixed", False):
        return

    def get_input_embeds(model, input_ids, attention_mask=None, pixel_values=None, pixel_values_videos=None,
                         image_grid_thw=None, video_grid_thw=None):
        if pixel_values is not None or pixel_values_videos is not None:
            return original(model, input_ids, attention_mask, pixel_values, pixel_values_videos, image_grid_thw, video_grid_thw)
        embeds = model.get_input_embeddings()(input_ids)
        vision = model.config.vision_config  # verl's dummy pass: 16 zero patches, one 4 x 4 image
        dummy = torch.zeros((16, vision.in_channels * vision.temporal_patch_size * vision.patch_size**2), dtype=embeds.dtype, device=embeds.device)
        image_embeds, _ = qwen2_vl.unpack_visual_output(model.visual(dummy, grid_thw=torch.tensor([[1, 4, 4]], device=embeds.device)))
        return embeds + 0.0 * image_embeds.mean(), None if attention_mask is None else attention_mask.to(embeds.device)

    get_input_embeds.text_only_fixed = True
    qwen2_vl._get_input_embeds = get_input_embeds
