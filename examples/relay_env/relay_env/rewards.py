"""A reward of the user's own for one role, named in the recipe as
``pettingllms.roles.describer.reward: relay_env.rewards:short_clue``.

pettingllms-verl calls it for every reply of that role, after the environment's step, with the
keywords ``role``, ``reply`` (the text), ``result`` (the env's StepResult) and ``env`` (the state
after the step); its value replaces the env's local reward (kept in ``info["env_local_reward"]``).
"""

WORD_COST = 0.01


def short_clue(role: str, reply: str, result, env) -> float:
    """The env's reward, less a cost per word of the clue: a good clue is a short one."""
    return result.local_reward - WORD_COST * len(reply.split())
