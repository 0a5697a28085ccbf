"""What the hf engine's output is checked against: a direct transformers forward, and the LoRA
settings of the peft reference model."""

import torch

LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "up_proj"], "init_lora_weights": False}


def reference_log_probs(model, prompt, response, temperature=1.0):
    """Direct transformers forward over prompt + response, unpadded."""
    ids = torch.tensor([prompt + response], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float().cpu()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]
