"""Evaluation: ``python -m pettingllms_verl.eval`` plays recipes and checkpoints through ``main_ppo``'s
validation and writes tables and logs (``runs`` what a run is, ``results`` logs into tables)."""
