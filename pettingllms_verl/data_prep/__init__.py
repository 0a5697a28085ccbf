"""Dataset preparation: ``python -m pettingllms_verl.data_prep.<script> --out-dir DIR`` (each
script's ``--help`` lists its options); in a checkout also ``python data_prep/<script>.py``."""
