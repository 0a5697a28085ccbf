"""The recipes (Hydra configs for ``python -m verl.trainer.main_ppo``), shipped in the package:
``--config-path pkg://pettingllms_verl.recipes --config-name <recipe>`` from anywhere."""
