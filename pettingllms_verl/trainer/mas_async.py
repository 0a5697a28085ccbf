"""verl V1 trainer ``mas_colocate_async``: verl's ``colocate_async`` schedule over the table of policies.

Select it with ``trainer.v1.trainer_mode=mas_colocate_async`` (docs/async.md). Everything a step
does is ``mas_sync``'s (``trainer/mas_trainer.py``); what differs is verl's schedule, taken from
verl's own ``PPOTrainerColocateAsync`` hooks and run over every policy at once:

    start: num_warmup_batches more prompts than a step trains go to the rollout
    sample: the step takes the first train_batch_size prompt groups that finish, whole
            (every row of a problem: each AT-GRPO group complete); the others play on
    then every policy's generation pauses (a request under way waits, or is continued, after the push)
    train each policy on its rows (as mas_sync)
    push every trainable policy's weights, resume generation, submit the next batch of prompts

So a step never waits for its slowest episode: an episode that straddles a push goes on with the
new weights, a reply sampled before it keeps its version (each row records the versions of its
role's replies; verl's ``trainer.v1.sampler.max_off_policy_threshold`` bounds how old a group's
weights may be, checked per row in ``_check_versions``), and a tree node whose K branches came from
two versions is sampled again (``rollout/agent_loop.py``).
"""

from __future__ import annotations

from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

from pettingllms_verl.trainer.mas_trainer import MASTrainer


@register_trainer("mas_colocate_async")
class MASColocateAsyncTrainer(MASTrainer):
    mode = "mas_colocate_async"
    llm_client_cls = FullyAsyncLLMServerClient  # continues a request a server aborted, after the weight push
    # verl's colocate_async hooks as they are, over MultiCheckpointManager (every policy's replicas)
    on_init_end = PPOTrainerColocateAsync.on_init_end
    on_train_begin = PPOTrainerColocateAsync.on_train_begin
    on_sample_end = PPOTrainerColocateAsync.on_sample_end
    on_step_end = PPOTrainerColocateAsync.on_step_end
