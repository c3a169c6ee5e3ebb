"""Sampling responses from the policy with a KV cache, on the same mesh as training."""

from rlscale.sampling.decode import Rollout, Sampler, generate
from rlscale.sampling.sample import SamplingParams

__all__ = ["Rollout", "Sampler", "SamplingParams", "generate"]
