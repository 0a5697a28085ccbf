"""Reproduce "MAS + AT-GRPO beats SA + GRPO" on CPU: ``python -m pettingllms_verl.eval.reproduce`` (``make reproduce``).

Plan-Path 4x4 in one turn with routes of 2-3 moves, models warm-started by verl's SFT trainer on
noisy demonstrations, and methods with the same steps, replies per step and optimizer steps
(``recipes/base/repro_plan_path.yaml``), four of them on the tiny model:

- ``sa``: SA + GRPO (the plan agent alone, ``plan_path_sa_grpo_repro_cpu``);
- ``mas``: MAS + AT-GRPO, one policy shared by both roles (``plan_path_mas_atgrpo_repro_cpu``);
- ``mas_by_problem``: the same with each reply's group keyed by its problem alone, not by (problem,
  turn, agent, tree node) (``plan_path_mas_grpo_by_problem_repro_cpu``): the credit-assignment ablation;
- ``per_role``: MAS + AT-GRPO, a model per role (``plan_path_mas_full_repro_cpu``), also evaluated
  with the two trained policies swapped;
- ``control``: its null-training control, the same runs with each reward shuffled within its AT-GRPO
  group (``plan_path_mas_full_control_repro_cpu``); the primary claim (``PRIMARY``, ``--primary``) is
  ``per_role`` against it on the final confirmation split, declared into ``primary.json`` before any
  "after" exists;
- ``per_role_async`` (not in the default ``--methods``): ``per_role`` trained under verl's colocate_async
  schedule (``plan_path_mas_full_async_repro_cpu``, docs/async.md), compared with ``per_role`` after training;
- ``ppo`` (not in the default ``--methods``): MAS + PPO, the shared policy of ``mas`` trained with a
  critic (``algorithm.adv_estimator=gae``) instead of AT-GRPO (``plan_path_mas_ppo_repro_cpu``);
- ``program`` (not in the default ``--methods``; ``make reproduce-program`` runs it beside ``mas``): the
  team of ``mas`` written as a LangGraph program (``examples/agents/plan_path_langgraph.py``) that calls
  the shared policy through the gateway, tree-sampled by replay (``plan_path_program_repro_cpu``; run
  from the repository root). It plays its own "before": the program, not the environment, plays it;
- ``real`` (not in the default ``--methods``; ``make reproduce-real``): the real model, SmolLM2-135M
  with a LoRA adapter per role, each warm-started on its role's demonstrations
  (``plan_path_mas_lora_smollm2_repro_cpu``), also evaluated swapped.

Each method trains once per seed through ``main_ppo`` (validating on the val split; a rerun resumes
a run cut short and skips a finished one, when it was made from the same warm start, with the same
training settings and by the same code; otherwise it trains it again, saying why, the earlier run kept
aside), ``--jobs`` runs at once. ``pettingllms-eval`` then plays, on each held-out split
(``--splits``: the development test split and the final confirmation split), each method's recipe at its
warm start ("before", once per training seed, sampling with that seed; kept from an earlier invocation
only when the package's source, the composed evaluation config, the problems and the warm start are
the same, else evaluated again with the reason said; a team whose policies start apart also
swapped) and each run's best step on val and its last step ("after",
sampling with the run's seed; kept likewise when the run's weights are also the same). ``--set`` can start the roles of ``per_role`` apart, e.g. ``--methods
per_role --set ++pettingllms.policies.plan_policy.overrides.model.path=DIR``. A training run that
fails is reported as failed (its seed is left out of the method's figures, and said so); the others go
on. Writes to --out: ``reproduce.md`` and ``reproduce.json`` (per split and method, success before
and after training per seed and as a mean over seeds with its t interval between runs, the gain over
the warm start across runs (Welch's t) and paired over problems (bootstrap), the comparisons between
methods, the primary claim's test and every other p with its Holm adjustment, the swap's difference in
differences, collapsed runs, each warm start's sha256; ``eval/stats.py``), ``reproduce.png`` (the same as bars), ``learning_curves.png``, the
evaluations (``before/<split>/s<seed>/``, ``after/<split>/s<seed>/``), the training logs (``logs/``)
and checkpoints (``checkpoints/``). ``--archive DIR`` keeps what a new machine needs to go on, small
enough to commit (``eval/archive.py``). ``--report`` writes the table into --out again from the
evaluations saved in --archive (without it, in --out), playing and training nothing: all must be
there, made by one source.
"""
