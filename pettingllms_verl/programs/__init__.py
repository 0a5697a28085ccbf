"""Team programs: multi-agent programs that speak the OpenAI API (a bare ``openai`` client,
LangGraph, AutoGen, ...), trained as a team with a policy per agent.

``gateway``: the OpenAI-compatible HTTP door, one session per program run. ``program``: running a
program and reading its reward. ``runner``: the process a ``module:function`` program runs in.
``episode``: a program's calls as training samples, K runs per AT-GRPO tree node by replay.
"""
