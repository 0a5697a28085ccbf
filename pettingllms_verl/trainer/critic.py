"""The value model of PPO (``algorithm.adv_estimator=gae``): verl's own critic worker, one per
full-model policy (``trainer/mas_trainer.py`` colocates it with the policy's actor).

verl's value-model loader asks transformers for ``flash_attention_2`` whatever the model config
says, so a machine without flash-attn (every CPU) cannot build a critic. This worker loads the
same model class (a one-label token-classification head on the policy's model) with the attention
that ``critic.model.override_config.attn_implementation`` names, as verl's actor loader does.
"""

from __future__ import annotations

import verl.utils.model
from transformers import AutoModelForTokenClassification
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import TrainingWorker


def load_value_model(local_path, torch_dtype, model_config, trust_remote_code):
    """verl's ``load_valuehead_model`` with the config's attention (``model_config._attn_implementation``,
    set from ``override_config`` by verl's HFModelConfig) instead of flash_attention_2."""
    return AutoModelForTokenClassification.from_pretrained(
        local_path, torch_dtype=torch_dtype, config=model_config, trust_remote_code=trust_remote_code
    )


class ValueModelWorker(TrainingWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reset(self):
        # verl's engine imports the loader from verl.utils.model when it builds the module
        verl_loader, verl.utils.model.load_valuehead_model = verl.utils.model.load_valuehead_model, load_value_model
        try:
            return super().reset()
        finally:
            verl.utils.model.load_valuehead_model = verl_loader
