"""The episode core, below both ways of playing one: ``rollout/`` (the native environments through
verl's agent loop) and ``programs/`` (a team program through the gateway). ``core``: one episode's
types, AT-GRPO tree sampling and returns; ``tags``: the names rows carry that others read."""
