"""GRPO on math word problems with your own Hugging Face checkpoint and prompt files.

    python launch/main.py --config=configs/grpo_math.py --workdir=runs/math \
        --config.model.hf_checkpoint=/models/Qwen2.5-0.5B-Instruct \
        --config.task.train_files=/data/gsm8k/train.jsonl \
        --config.task.eval_files=/data/gsm8k/test.jsonl
    python launch/main.py --config=configs/grpo_math.py:bf16 ...   # 7-8B on one 80-141 GB GPU
    python launch/main.py --config=configs/grpo_math.py:tiny ...   # seconds, for tests

Without task.*_files it trains on the GSM8K-style set the package ships
(rlscale/data/gsm8k_style: 64 templated word problems, 24 held out). Files are JSONL, Parquet
or `datasets` save_to_disk folders with `question` and `answer` columns (task.prompt_field,
task.answer_field); a GSM8K answer "... #### 72" and a MATH answer with \\boxed{...} both work.
Prompts go through the checkpoint's chat template; responses are graded by math-verify
(task.grader). The run evaluates, checkpoints, and exports the policy to <workdir>/policy as a
Hugging Face folder. README: "Your model, your data".
"""

import ml_collections

from rlscale.config import sections as common
from rlscale.data import gsm8k_style


def tiny(c: ml_collections.ConfigDict) -> None:
  """Minutes on two CPU cores with a small checkpoint: the tests' shape."""
  c.model.dtype = "float32"  # bf16 matmuls are emulated on CPUs
  c.rollout.max_new_tokens = 24
  c.rl.num_prompts, c.rl.group_size = 4, 4
  c.task.num_eval, c.eval.generation_batch = 8, 8
  c.train.num_steps, c.train.eval_every, c.train.checkpoint_every = 2, 2, 2


def bf16(c: ml_collections.ConfigDict) -> None:
  """bfloat16 parameters with float32 Adam moments (7-8B on one GPU: 2 + 8 bytes a parameter
  and bf16 gradients), full rematerialization."""
  c.model.param_dtype = "bfloat16"
  c.optim.state_dtype = "float32"
  c.train.remat = "full"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "grpo"
  c.seed = 0
  # The policy: your checkpoint (its config.json decides the shape; its tokenizer and chat
  # template the prompts). Compute in bfloat16, parameters and optimizer in float32.
  c.model = common.model("qwen2.5-0.5b", dtype="bfloat16")
  c.mesh = common.mesh()
  c.mesh.shape = (1, -1, 1)  # FSDP over every device: parameters and moments sharded

  c.task = common.task("files")
  c.task.train_files = gsm8k_style.TRAIN
  c.task.eval_files = gsm8k_style.TEST
  c.task.num_eval = 500
  c.task.max_prompt_len = 256  # longer prompts are counted and skipped, never cut
  c.task.instruction = "Let's think step by step and output the final answer within \\boxed{}."
  c.task.grader = "math"

  c.init = common.init()  # starts from model.hf_checkpoint
  c.rollout = common.rollout(max_new_tokens=512)
  c.rl = common.rl(num_prompts=64, group_size=8)
  c.rl.advantage = "grpo"
  c.optim = common.optim(lr=1e-6)  # the usual GRPO learning rate for 0.5B-8B policies
  c.optim.reference_batch = 512
  c.optim.warmup_responses = 512 * 5
  c.noise = common.noise_scale()
  c.target = common.target("eval/accuracy_greedy", 0.5)

  c.train = common.run(num_steps=200)
  c.train.eval_every, c.train.checkpoint_every = 10, 10
  c.train.remat = "dots"  # keep matmul outputs, recompute the rest of each block
  c.eval = common.evaluation()
  c.eval.generation_batch = 64  # held-out rows per decode call (a real model's KV cache)
  common.apply_arg(c, arg, {"tiny": tiny, "bf16": bf16}, common.ALIASES)
  return c
