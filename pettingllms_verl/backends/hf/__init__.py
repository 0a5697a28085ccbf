"""The transformers (``hf``) rollout: an engine and a verl rollout replica; runs on CPU and CUDA."""
