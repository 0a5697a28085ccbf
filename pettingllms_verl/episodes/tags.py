"""Names an episode's rows carry that the trainer, the fault tally and the evaluation read: why an
episode ended, and the validation column of the swapped-policy pass. A module with no imports, so
that the trainer (imported in every verl process that loads the plugin) reads them without importing
the environments, the gateway or its HTTP server."""

# Why an episode ended: None = the environment finished it.
# out of turns | a prompt over the rollout's prompt budget | a team program stopped at its call or time
# limit, rewarded pettingllms.program.limit_reward
TRUNCATIONS = ("max_turns", "prompt_overflow", "program_limit")
# the engine failed a request | the environment raised | the engine's server is dead (the run stops);
# a team program (programs/) raised or printed no reward | ran past its time limit | made no model
# call | made more calls than allowed
ERRORS = ("engine_error", "env_error", "engine_dead", "program_error", "program_timeout", "program_no_call", "program_call_limit")

SWAPPED_KWARG = "pettingllms_swapped"  # a column of the trainer's swapped-policy validation pass
