"""Model checkpoints in the Hugging Face format (safetensors) and their tokenizers."""

from rlscale.checkpoints.safetensors_io import CheckpointError

__all__ = ["CheckpointError"]
