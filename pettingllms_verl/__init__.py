"""pettingllms-verl: multi-agent LLM RL (AT-GRPO) as a plugin for stock verl."""

__version__ = "0.1.0"
