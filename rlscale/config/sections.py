"""Config sections that every experiment file shares (model, mesh, task, optimizer, run).

Experiment files in configs/ build their ConfigDict from these and set what differs; every
field carries its comment here, where it is defined.
"""

from __future__ import annotations

import ml_collections
from ml_collections.config_dict import FieldReference, placeholder


def auto_or_int() -> FieldReference:
  """A size field that is 'auto' (the batch plan chooses, rlscale/plan/batch.py) or an integer."""
  return FieldReference("auto", field_type=object)


def model(name: str = "tiny", **overrides) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = name  # a named size of rlscale.models.NAMED; ignored when hf_checkpoint is set
  c.hf_checkpoint = ""  # a Hugging Face folder (config.json, safetensors, tokenizer.json)
  c.dtype = "float32"  # activations and matmuls; 'bfloat16' on GPU and TPU
  c.param_dtype = "float32"  # stored parameters and optimizer moments
  # Overrides of the named size; None keeps its value.
  c.vocab_size = placeholder(int)  # rows of the embedding; at least the tokenizer's vocabulary
  c.d_model = placeholder(int)  # model width
  c.num_layers = placeholder(int)  # decoder layers
  c.num_heads = placeholder(int)  # query heads
  c.num_kv_heads = placeholder(int)  # key/value heads (grouped-query attention)
  c.head_dim = placeholder(int)  # width of one head
  c.mlp_dim = placeholder(int)  # SwiGLU hidden width
  c.rope_theta = placeholder(float)  # rotary base
  for k, v in overrides.items():
    c[k] = v
  return c


def arithmetic_default(c: ml_collections.ConfigDict) -> None:
  """The embedded default every shipped config shares: model shape, mesh and task.

  configs/sft.py builds the base policy with them, and the RL configs rebuild (or reuse) that
  base from the same sections, so a change here is a new base policy for all of them.
  """
  # The tiny shape at half width (0.8M parameters): trains in minutes on two CPU cores.
  c.model = model("tiny", vocab_size=32, d_model=128, head_dim=32, mlp_dim=384)
  c.mesh = mesh()
  c.task = task("arithmetic")
  c.task.digits = 2  # operands below 100: learnable in the time the default run has
  c.task.restate = 0.5  # half the base's demonstrations restate the equation (tasks/arithmetic.py)


def chain_sum_default(c: ml_collections.ConfigDict) -> None:
  """The chained-sum testbed (rlscale/tasks/chain_sum.py): the default's model shape and mesh.

  Its own task section, so the default task (and its cached base policy's hash) is unchanged.
  """
  c.model = model("tiny", vocab_size=32, d_model=128, head_dim=32, mlp_dim=384)
  c.mesh = mesh()
  c.task = chain_sum_task()


def chain_sum_task() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = "chain_sum"  # sums of `terms` operands with a worked scratchpad (tasks/chain_sum.py)
  c.seed = 0  # problem streams and the held-out set derive from it
  # The held-out set: 2,000 problems put one evaluation's standard error near 0.011 (at 45%
  # accuracy), well inside a study's 0.05 band. It also fixes the base policy (the SFT trains
  # on the other problems): on the 2-core machine the base starts at 11.6% greedy and GRPO
  # levels off near 60%.
  c.num_eval = 2000
  c.terms = 4  # operands per problem: terms - 1 scratchpad steps (<= 23 tokens at 4 one-digit)
  c.digits = 1  # operands below 10**digits
  c.flaw = 0.65  # chance that a demonstration's step drops its ones carry (the base's headroom)
  c.demo_files = ""  # PPO-ptx demonstrations; empty: the task's own
  return c


def mesh() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.shape = (-1, 1, 1)  # devices along (data, fsdp, tensor); one -1 takes the remaining devices
  c.rules = ()  # extra (logical axis, mesh axis or axes) pairs over sharding.DEFAULT_RULES
  # colocated: sample and train on every device; split: the sampler gets `sampler_devices` of
  # them (a mesh of `sampler_shape`), the trainer the rest (a mesh of `shape`); rlscale/parallel/roles.py
  c.roles = "colocated"
  c.sampler_devices = 0  # split: devices that sample (a multiple of the processes)
  c.sampler_shape = (-1, 1, 1)  # split: the sampler's mesh over its devices
  return c


def task(name: str = "arithmetic") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = name  # arithmetic | chain_sum (embedded) | files | tfds_math | reasoning_gym
  c.seed = 0  # problem streams and the held-out set derive from it
  c.num_eval = 500  # size of the held-out set
  # arithmetic: operands of 1..digits digits, ops from '+-*', products' second factor <= mul_digits
  c.digits = 3
  c.ops = "+-*"
  c.mul_digits = 1
  c.partial_credit = False  # reward up to 0.5 for an integer with some place values right
  c.restate = 0.0  # share of demonstrations that restate the equation (a style the verifier rejects)
  # tfds_math: a prepared TFDS math_dataset config read with tfds.data_source (no download)
  c.tfds_name = "math_dataset/arithmetic__add_or_sub"
  c.data_dir = ""  # the user's TFDS data_dir
  # reasoning_gym: one of its procedural generators (pip install 'rlscale[reasoning]')
  c.rg_dataset = "basic_arithmetic"
  c.rg_size = 100_000  # problems in the training stream before it repeats
  c.max_prompt_len = 256  # prompts longer than this (in tokens) are skipped and counted, never cut
  c.max_answer_len = 32  # tokens a correct response needs (tfds, reasoning_gym)
  # files: prompts and answers from the user's disk (rlscale/tasks/files.py). Comma-separated
  # paths or globs of JSONL (.jsonl/.json), Parquet (.parquet) or a `datasets` save_to_disk folder.
  c.train_files = ""
  c.eval_files = ""  # the held-out set; empty: `eval_fraction` of the training rows
  c.eval_fraction = 0.0  # share of the training rows held out when eval_files is empty
  c.prompt_field = "question"  # the column with the problem text
  c.answer_field = "answer"  # the column with the reference ("... #### 72" and \boxed{} work)
  # Prompts of text tasks (files, tfds_math, reasoning_gym) through the checkpoint's template.
  c.system_prompt = ""  # a system message before the problem; empty: none
  c.instruction = "Put the final answer in \\boxed{}."  # appended to every problem
  c.enable_thinking = placeholder(bool)  # Qwen3 templates: thinking on/off; None: the default
  # Graders (rlscale/tasks/graders.py): math (math-verify: boxed or final-line answers, numeric
  # and symbolic equivalence) | numeric | exact | regex. Model text is never evaluated.
  c.grader = "math"
  c.grader_regex = ""  # regex: the answer is the pattern's first group (or match) in the response
  c.grader_timeout_s = 2.0  # per check; a check that takes longer scores 0
  c.demo_files = ""  # PPO-ptx demonstrations (prompt_field, demo_field); empty: the task's own
  c.demo_field = "response"  # the column with a demonstration's response text
  return c


def optim(lr: float) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.lr = lr  # peak learning rate at the reference batch
  c.lr_scaling = "none"  # none | linear | sqrt: how lr follows the batch (rlscale/rl/optim.py)
  # the batch lr_scaling follows: nominal (responses per optimizer step) | effective (its
  # informative responses, step by step: rollout/effective_batch)
  c.lr_batch = "nominal"
  c.reference_batch = placeholder(int)  # responses per optimizer step at which lr was tuned
  c.adam_scaling = False  # also scale Adam's betas and eps with the batch
  c.schedule = "constant"  # constant | cosine | linear (decay after warmup, to the run's end)
  c.warmup_responses = 0  # linear warmup from 0 over this many responses (or demonstrations)
  c.final_lr_frac = 0.0  # cosine/linear decay ends at lr * final_lr_frac
  c.b1 = 0.9  # Adam beta1
  c.b2 = 0.999  # Adam beta2
  c.eps = 1e-8  # Adam epsilon
  c.weight_decay = 0.0  # decoupled weight decay (AdamW)
  c.grad_clip = 1.0  # clip the global gradient norm to this; 0 turns clipping off
  c.state_dtype = ""  # Adam moments' dtype; empty: the parameters' ('float32' under bf16 ones)
  return c


def run(num_steps: int) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.num_steps = num_steps  # steps of the run (ignored when total_responses is set)
  c.total_responses = 0  # run length in responses instead; equal-sample runs across batch sizes
  c.eval_every = 25  # held-out evaluation every N steps (and at the end); 0 only at the end
  c.eval_every_responses = 0  # evaluate at multiples of this responses_seen instead of steps
  c.checkpoint_every = 50  # save every N steps (and at the end); 0 only at the end
  c.keep_checkpoints = 2  # checkpoints kept on disk
  # Also keep every checkpoint whose step is a multiple of this (0: none): the points a
  # critical-batch probe can branch from (launch/cbs_probe.py).
  c.keep_period = 0
  c.async_checkpoint = True  # write checkpoints while the next steps run
  # Several processes: one that sends jax.distributed no heartbeat for this many seconds (killed,
  # its host lost) is lost, and the others stop with exit status 75 to be requeued
  # (rlscale/run/supervise.py). Whole seconds; no number the run computes depends on it.
  c.peer_timeout_s = 100
  c.log_every = 10  # console progress line every N steps
  c.tensorboard = True  # TensorBoard event files beside metrics.jsonl
  c.peak_flops = 0.0  # peak FLOP/s of one device for MFU; 0: known accelerators only, not CPU
  # Memory of the training forward (rlscale/models/memory.py): rematerialization of each
  # decoder block (none | full | dots: keep matmul outputs) and the vocabulary columns per chunk
  # of the float32 log-softmax (0: the whole vocabulary at once).
  c.remat = "none"
  c.logprob_chunk = 8192
  # RL: micro-batches of whole groups run each group's shared prompt once, forward and
  # backward (rlscale/models/shared_prompt.py). 'auto': when the micro-batch holds whole groups
  # on every batch shard (the plan prefers one) and each model takes one optimizer step per
  # epoch (num_minibatches 1: the shuffle then changes no gradient); True: required; False:
  # every row on its own.
  # With it every update shuffles by whole groups: the noise scale is measured in prompts only.
  c.shared_prompt = auto_or_int()  # "auto" | True | False
  # With shared-prompt training: each micro-batch's responses packed into fewer rows when they
  # fit (rlscale/rl/packing.py): no compute after a response's last token; one compiled update
  # per bucket of packed rows met (at most 8). False: every response padded to the longest.
  c.pack_responses = True
  # When each bucket's update compiles: 'ahead', all at the first update (a long run's host
  # memory is then set in its first step; ~8 compilations up front), 'on_use', when each is
  # first met, or 'auto': 'ahead' from 1,000 steps on. No number of the run depends on it.
  c.compile_buckets = "auto"
  return c


def noise_scale() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.enabled = True  # measure it (needs at least 2 micro-batches per mini-batch)
  c.decay = 0.9  # EMA decay of |G|^2 and tr(Sigma) estimates (per RL step), bias-corrected
  c.prompt_level = True  # on alternate steps, micro-batches of whole groups (B in prompts)
  return c


def target(metric: str, value: float) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.metric = metric  # an evaluation metric, e.g. eval/accuracy_greedy
  c.value = value  # the target is met at the first evaluation where metric >= value
  c.stop = False  # end the run there (after a checkpoint)
  # With stop: go on to the first evaluation at or past (1 + stop_margin) x the responses to
  # target, so that what follows the crossing (a collapse, the curve's shape) is still seen.
  c.stop_margin = 0.0
  return c


def init(sft_config: str = "configs/sft.py") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.hf_checkpoint = ""  # start from this folder (else model.hf_checkpoint, else the SFT base)
  c.sft_config = sft_config  # the base policy's recipe (its model/task/mesh are the run's)
  c.cache_dir = "runs/base"  # base policies are cached here by the SFT config's hash
  # A branch (launch/cbs_probe.py): start from the checkpoint of step `branch_step` of the run
  # in `branch_from` (its weights and optimizer state, not its counters), on the prompts after
  # those it trained on. Empty: start from the base policy.
  c.branch_from = ""
  c.branch_step = 0
  # The branch's optimizer state: "fresh" (Adam's moments start empty, as every run's do) or
  # "parent" (the parent's moments and bias-correction count; beta2 = 0.999 remembers ~1,000
  # of the parent's steps, so a short branch stays partly a continuation at the parent's batch).
  c.branch_optimizer = "fresh"
  return c


def rollout(max_new_tokens: int) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.max_new_tokens = max_new_tokens  # response budget in tokens (EOS included)
  c.temperature = 1.0  # sampling temperature of the training responses
  c.top_k = 0  # 0 keeps every token
  c.top_p = 1.0  # 1 keeps every token
  # responses per compiled decode call; auto: the largest whose compiled decode fits the
  # device memory (rlscale/sampling/memory_fit.py), recorded in summary.json
  c.generation_batch = auto_or_int()
  # KV-cache slots per chunk of generated tokens; 'auto': 16 from 128 rows per device, else 64
  c.decode_chunk = auto_or_int()
  # Staleness bound k: step t trains on responses sampled with the weights after update
  # max(0, t - 1 - k), so the sampler decodes up to k steps ahead of the trainer (0:
  # synchronous; 1: step N+1 generates while step N trains, as verl, AReaL, PipelineRL). The
  # lag is fixed, not left to timing; it is recorded (rollout/policy_lag) and the ratio's
  # denominator is the sampler's log-probs, which know it.
  c.max_staleness = 0
  # Dynamic sampling (verl's filter_groups): drop groups whose rewards are all equal (zero
  # group-relative advantage) and refill the step from more prompts until it holds P groups
  # that carry signal (rlscale/trainer/refill.py). responses_seen counts every response
  # generated, responses_trained those trained on.
  c.dynamic_sampling = False
  c.filter_min_std = 0.0  # also drop groups whose reward std (ddof=1) is at most this
  c.max_rounds = 4  # rounds of decode calls per step at most; then it trains on what it has
  # prompts a round sends per informative group it needs: 'auto' = 1 / (1 - the filtered
  # fraction seen so far, at most 4x), or a number >= 1
  c.oversample = FieldReference("auto", field_type=object)
  return c


def evaluation() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.greedy = True  # score the greedy (temperature 0) response to every held-out problem
  c.sampled = True  # score one temperature-1 response per held-out problem
  # The log-likelihood of the task's reference response to every held-out problem, teacher
  # forced: eval/reference_logprob (its mean) and eval/reference_prob (the mean probability of
  # writing exactly it), free of sampling noise (launch/cbs_probe.py's progress measure).
  c.reference = False
  c.generation_batch = 512  # held-out rows per compiled decode call
  # Evaluation in stages (rlscale/trainer/evaluation.Stop), for studies: score the first
  # generation batch of the held-out set, then 2x, 4x, ... the rows, and stop once the target
  # metric lies more than adaptive_z standard errors from target.value; once the run has
  # reached its target, the first stage only. Each evaluation logs eval/rows, the problems
  # it rests on. False: the whole set every time.
  c.adaptive = False
  c.adaptive_z = 2.0
  return c


def rl(num_prompts: int, group_size: int, **overrides) -> ml_collections.ConfigDict:
  """The RL step's batch and the policy loss terms every algorithm shares."""
  c = ml_collections.ConfigDict()
  c.num_prompts = num_prompts  # P: prompts per RL step
  c.group_size = group_size  # G: responses per prompt
  c.num_minibatches = 1  # optimizer steps per epoch; a mini-batch is P*G/num_minibatches
  c.num_epochs = 1  # passes over each step's responses
  c.microbatch = auto_or_int()  # responses per forward/backward pass (never changes the gradient)
  c.clip_eps_low = 0.2  # ratio clip 1 - eps_low
  c.clip_eps_high = 0.28  # ratio clip 1 + eps_high (DAPO's clip-higher)
  c.kl_coef = 0.0  # weight of the KL penalty to the frozen base policy; 0 skips it
  c.kl_estimator = "k3"  # k1 | k2 | k3
  c.entropy_coef = 0.0  # entropy bonus weight
  c.loss_aggregation = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum-norm
  c.old_logprobs = "sampler"  # sampler: log-probs recorded while sampling; recompute: a forward
  # Responses of an older policy (rollout.max_staleness > 0): none | tis | mis | decoupled
  # (rlscale/rl/off_policy.py). A correction clips around the trainer's own log-probs (one
  # forward more) and weights each token by pi_old / pi_sampler, truncated at is_cap (tis),
  # masked above it (decoupled, AReaL), or with whole responses masked whose geometric-mean
  # ratio lies outside [1 / mis_threshold, mis_threshold] (mis).
  c.off_policy_correction = "none"
  c.is_cap = 2.0
  c.mis_threshold = 2.0
  # PPO-ptx (InstructGPT): ptx_coef x the mean NLL of `ptx_rows` demonstrations (task.demo_files)
  # added to every optimizer step's policy loss; 0 turns it off.
  c.ptx_coef = 0.0
  c.ptx_rows = 8
  c.dual_clip = 0.0  # dual clip c > 1 of negative advantages' loss (Ye et al. 2020); 0: off
  c.prox_com = 0.0  # ppo_ewma: the proximal policy's centre of mass, optimizer steps at ref. B
  c.update(overrides)
  return c


def critic(lr: float, reference_batch: int) -> ml_collections.ConfigDict:
  """PPO's value model: its backbone, batches, loss and optimizer."""
  c = ml_collections.ConfigDict()
  c.hf_checkpoint = ""  # the critic's backbone; empty: the base policy's
  c.num_minibatches = 1  # critic optimizer steps per epoch
  c.num_epochs = 1  # critic passes over each step's responses
  c.microbatch = auto_or_int()  # responses per forward/backward pass of the critic
  c.value_clip = 0.2  # clip of the value update around the old values; 0: off
  c.warmup_steps = 10  # RL steps that train only the critic (its head starts random)
  c.optim = optim(lr=lr)
  c.optim.reference_batch = reference_batch  # responses per critic optimizer step of lr
  return c


def apply_arg(c: ml_collections.ConfigDict, arg: str | None, variants=None, aliases=None) -> None:
  """big_vision-style config arguments: `tiny`, `p=16,g=8`, `tiny,rl.num_epochs=2`.

  A bare word names a variant (a function that edits `c`); `key=value` sets a field, by its
  dotted path or an alias (`p` for rl.num_prompts), parsed as the field's current type.
  """
  variants, aliases = variants or {}, aliases or {}
  for token in filter(None, (t.strip() for t in (arg or "").split(","))):
    key, eq, value = token.partition("=")
    if not eq:
      if key not in variants:
        raise ValueError(f"config argument {key!r}: not a variant; known: {sorted(variants)}, "
                         f"or key=value with keys {sorted(aliases)} or a dotted field")
      variants[key](c)
      continue
    path = aliases.get(key, key).split(".")
    node = c
    for name in path[:-1]:
      node = node[name]
    if path[-1] not in node:
      raise ValueError(f"config argument {token!r}: no field {'.'.join(path)}")
    node[path[-1]] = _parse(value, node[path[-1]])


def _parse(text: str, like):
  if isinstance(like, bool):
    return text.lower() in ("1", "true", "yes")
  for kind in (int, float):
    if isinstance(like, kind):
      return kind(text)
  if like == "auto" or like is None:
    if text.lower() in ("true", "false"):  # train.shared_prompt: 'auto' | True | False
      return text.lower() == "true"
    try:
      return int(text)
    except ValueError:
      return text
  return text


ALIASES = {"p": "rl.num_prompts", "g": "rl.group_size", "lr": "optim.lr",
           "model": "model.name", "steps": "train.num_steps",
           "responses": "train.total_responses", "seed": "seed"}
