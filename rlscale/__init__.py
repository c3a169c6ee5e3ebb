"""rlscale: batch-size scaling laws for RL of language models, in JAX."""

__version__ = "0.1.0"
