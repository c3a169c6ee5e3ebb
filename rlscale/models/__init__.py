"""Llama / Qwen decoder family: config, layers, policy and critic, sharded construction."""

from rlscale.models.config import (NAMED, ModelConfig, RopeScaling, YarnScaling, from_config_dict,
                                   named)
from rlscale.models.sharded_init import abstract_model, create_sharded
from rlscale.models.transformer import CausalLM, Decoder, ValueModel

__all__ = ["NAMED", "ModelConfig", "RopeScaling", "YarnScaling", "from_config_dict", "named",
           "abstract_model", "create_sharded", "CausalLM", "Decoder", "ValueModel"]
