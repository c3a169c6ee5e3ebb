"""The run configuration as types: one frozen dataclass per section, every field typed,
defaulted and documented in one line.

ml_collections stays at the edge, where a config is written or edited: a config file's
get_config (rlscale/config/sections.py builds its sections), the command line's
--config.x=y overrides and a run directory's config.json. The resolve step checks and converts
a config once (rlscale/config/typed.py: `check`, `from_dict`), and the library then reads
typed fields (`run.cfg.rl.group_size`), never a field that may be absent; `to_dict` is the
inverse. rlscale/config/reference.py writes docs/config.md from the fields' docs.

Variants. The task section has one type per task name (`TASKS`): the shared fields in `Task`,
those of the tasks on text in `TextTask`, each task's own in its class; `task.name` picks the
type. The rl section has the fields every algorithm reads in `Rl` (rl.dual_clip and
rl.prox_com among them: the shared policy loss and the batch plan read them for every kind)
and each algorithm's own fields in a subclass (`GrpoRl`: rl.advantage; `PpoRl`: GAE and
whitening); `kind` picks the type (`RL_TYPES`). Sections a kind lacks are None: an SFT config
has no init, rollout, rl, critic, noise or target; only PPO has a critic.

Checks. Each section checks its own values in `check(s, cfg)`: `s` is the section as a plain
dict with every field (an absent one reads as its default), `cfg` the whole config, for the few
checks that read another section (the target's metric against the evaluation's switches).
They run on the plain values, before types are enforced, so a wrong value is named with what
the field allows ("must be True or False"); typed.check runs every section's, in one order,
and then the type check for the fields no check named. What needs the devices or the files of the
run (the mesh, the model's weights, a task's files, the batch plan's sizes and the memory they
take) is checked where it is built, in the resolve step (rlscale/resolve/); the names of an
algorithm's registered parts (advantages, loss aggregations, KL estimators) by the algorithm.

Defaults live here alone: rlscale/config/sections.py builds a config file's ConfigDicts from
them. A field a builder takes as an argument gets the shipped configs' most common value, said
in its comment. What a config written before a field existed ran with is the migration's
(config/migrate.py, applied where a config enters, before the check), never the schema's.

Each section also answers dict-style reads (`get`, `[]`, `in`, `keys`), for code that handles
plain dicts as well (the batch plan reads a run's config.json too); none of them writes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types
import typing
from typing import Any, Literal

from rlscale.config.errors import ConfigError
from rlscale.config.fields import (EVAL_METRICS, FRACTIONS, REFERENCE_METRICS, boolean,
                                   check_directory, has_weights, hf_folder, integer, number)

MISSING = dataclasses.MISSING


def f(default: Any = MISSING, doc: str = "") -> Any:
  """A field with its default (a section class: built fresh for each instance) and its doc."""
  if isinstance(default, type) or isinstance(default, functools.partial):
    return dataclasses.field(default_factory=default, metadata={"doc": doc})
  return dataclasses.field(default=default, metadata={"doc": doc})


@functools.lru_cache(maxsize=None)
def _names(cls) -> tuple[str, ...]:
  return tuple(fl.name for fl in dataclasses.fields(cls))


class _Fields:
  """Dict-style reads of a section's fields, for code that also handles plain dicts."""
  __slots__ = ()

  def keys(self) -> tuple[str, ...]:
    return _names(type(self))

  def get(self, name: str, default: Any = None) -> Any:
    return getattr(self, name) if name in self.keys() else default

  def __getitem__(self, name: str) -> Any:
    if name not in self.keys():
      raise KeyError(name)
    return getattr(self, name)

  def __contains__(self, name: object) -> bool:
    return name in self.keys()

  def to_dict(self) -> dict:
    """The section's fields as a nested plain dict (as a ConfigDict's to_dict)."""
    return to_dict(self)

  @classmethod
  def check(cls, s: dict, cfg: dict) -> list[str]:
    """The errors of this section's values `s` (every field present: a field the config lacks
    reads as its default) in the whole config `cfg`, each naming the field and its value.
    Values may be of any type here: the schema's type check comes after, for the fields these
    checks do not name."""
    return []



@dataclasses.dataclass(frozen=True, kw_only=True)
class Model(_Fields):
  """The policy's architecture and dtypes (None: the named size's value)."""
  name: str = f("tiny", "a named size of rlscale.models.NAMED; unused when hf_checkpoint is set")
  hf_checkpoint: str = f("", "Hugging Face folder (config.json, safetensors, tokenizer.json) "
                             "to build the model from")
  dtype: Literal["float32", "bfloat16", "float16"] = f(
      "float32", "dtype of activations and matmuls ('bfloat16' on GPU and TPU)")
  param_dtype: Literal["float32", "bfloat16", "float16"] = f(
      "float32", "dtype of the stored parameters and the optimizer moments")
  vocab_size: int | None = f(None, "embedding rows, at least the tokenizer's vocabulary")
  d_model: int | None = f(None, "model width")
  num_layers: int | None = f(None, "decoder layers")
  num_heads: int | None = f(None, "query heads")
  num_kv_heads: int | None = f(None, "key/value heads (grouped-query attention)")
  head_dim: int | None = f(None, "width of one attention head")
  mlp_dim: int | None = f(None, "hidden width of the SwiGLU MLP")
  rope_theta: float | None = f(None, "base of the rotary position embedding")

  @classmethod
  def check(cls, s, cfg):
    dtypes = choices(cls, "dtype")
    errors = [f"model.{f}={s[f]!r}: use {', '.join(dtypes[:-1])} or {dtypes[-1]}"
              for f in ("dtype", "param_dtype") if s[f] not in dtypes]
    if s["hf_checkpoint"]:
      hf_folder(errors, "model.hf_checkpoint", s["hf_checkpoint"], tokenizer=True)
    if s["rope_theta"] is not None:  # the shape's other overrides: models/config.py
      number(errors, "model.rope_theta", s["rope_theta"], "a positive number (None: the named "
             "size's)", lambda v: v > 0)
    return errors


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mesh(_Fields):
  """The device mesh, and how sampling and training share the devices."""
  shape: tuple[int, ...] = f((-1, 1, 1), "devices along (data, fsdp, tensor); one -1 takes "
                                         "the devices left over")
  rules: tuple[tuple[str, str | tuple[str, ...] | None], ...] = f(
      (), "(logical axis, mesh axis or axes) pairs applied over sharding.DEFAULT_RULES")
  roles: Literal["colocated", "split"] = f(
      "colocated", "colocated: every device samples and trains; split: the sampler gets "
                   "devices of its own")
  sampler_devices: int = f(0, "split: devices given to the sampler (a multiple of the "
                              "processes)")
  sampler_shape: tuple[int, ...] = f((-1, 1, 1), "split: the sampler's mesh over its devices")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task(_Fields):
  """The fields every task reads; a task's type adds its own (TASKS)."""
  name: Literal["arithmetic", "chain_sum", "files", "tfds_math", "reasoning_gym"] = f(
      "arithmetic", "the task that makes the problems (it picks the section's type)")
  seed: int = f(0, "seed of the problem streams and of the held-out set")
  num_eval: int = f(500, "problems in the held-out set")
  # Read for every task (rlscale/rl/algorithm.py); a non-empty value is refused for the
  # embedded tasks when PPO-ptx runs.
  demo_files: str = f("", "PPO-ptx demonstration files (tasks on text); empty: the task's "
                          "own demonstrations")

  @classmethod
  def check(cls, s, cfg):
    """The task's own fields, before anything is built or read (a text task's files are read
    when the run builds it, and checked there)."""
    name = s["name"]
    if not isinstance(name, str) or name not in TASKS:
      return [f"task.name={name!r} is not one of {tuple(TASKS)}"]
    errors: list[str] = []
    integer(errors, "task.num_eval", s["num_eval"])
    integer(errors, "task.seed", s["seed"], minimum=0)
    if not issubclass(TASKS[name], TextTask):  # an embedded task sizes its prompts itself
      unread = [f"task.{f}={s[f]!r}" for f in ("max_prompt_len", "max_answer_len")
                if f in s and s[f] != default(TextTask, f)]
      if unread:
        errors.append(f"{', '.join(unread)}: the {name} task sizes its prompts and answers "
                      f"itself (from its digits and terms) and does not read it; leave it unset")
    return errors


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArithmeticTask(Task):
  """The embedded arithmetic task (rlscale/tasks/arithmetic.py)."""
  name: Literal["arithmetic"] = f("arithmetic", "the embedded arithmetic task")
  digits: int = f(3, "operands have 1 to this many digits")
  ops: str = f("+-*", "the operators problems draw from, a subset of '+-*'")
  mul_digits: int = f(1, "digits of a product's second factor at most")
  partial_credit: bool = f(False, "reward up to 0.5 for an integer with some place values "
                                  "right")
  restate: float = f(0.0, "share of demonstrations that restate the equation (which the "
                          "verifier rejects)")

  @classmethod
  def check(cls, s, cfg):
    errors = super().check(s, cfg)
    integer(errors, "task.digits", s["digits"])
    integer(errors, "task.mul_digits", s["mul_digits"])
    boolean(errors, "task.partial_credit", s["partial_credit"])
    ops = s["ops"]
    if not errors and isinstance(ops, str) and ops and not set(ops) - set("+-*"):
      n, m = 10 ** s["digits"], 10 ** s["mul_digits"]
      space = sum({"+": n * n, "-": n * (n + 1) // 2, "*": n * m}[op] for op in set(ops))
      if s["num_eval"] > space // 2:  # the held-out set and training draw from them
        errors.append(f"task.num_eval={s['num_eval']} leaves too few training problems: "
                      f"task.digits={s['digits']}, task.ops={ops!r} give {space} problems; "
                      f"use at most {space // 2}")
    return errors


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChainSumTask(Task):
  """The embedded chained-sum testbed (rlscale/tasks/chain_sum.py)."""
  name: Literal["chain_sum"] = f("chain_sum", "sums of `terms` operands written out as a "
                                              "scratchpad")
  num_eval: int = f(2000, "problems in the held-out set (2,000: a standard error near 0.011)")
  terms: int = f(4, "operands per problem (terms - 1 scratchpad steps)")
  digits: int = f(1, "operands are below 10**digits")
  flaw: float = f(0.65, "chance that a demonstration's step drops its ones carry")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TextTask(Task):
  """The fields of the tasks on text, whose prompts go through the checkpoint's template."""
  max_prompt_len: int = f(256, "prompts longer than this many tokens are skipped and counted, "
                               "never cut")
  max_answer_len: int = f(32, "tokens a correct response needs at most")
  system_prompt: str = f("", "system message before each problem; empty: none")
  instruction: str = f("Put the final answer in \\boxed{}.",
                       "line appended to every problem; empty: none")
  enable_thinking: bool | None = f(None, "Qwen3 templates' thinking switch; None: the "
                                         "template's default")
  grader: Literal["math", "numeric", "exact", "regex"] = f(
      "math", "how a response is graded against the reference (rlscale/tasks/graders.py)")
  grader_regex: str = f("", "regex grader: the answer is the pattern's first group (or its "
                            "match)")
  grader_timeout_s: float = f(2.0, "seconds one check may take before it scores 0")
  prompt_field: str = f("question", "the column with the problem text (of the files and "
                                    "demo_files)")
  demo_field: str = f("response", "the column of demo_files with a demonstration's response")

  @classmethod
  def check(cls, s, cfg):
    errors = super().check(s, cfg)
    if not cfg["model"]["hf_checkpoint"]:
      errors.append(f"task.name={s['name']!r} needs a tokenizer: set model.hf_checkpoint")
    for name in ("max_prompt_len", "max_answer_len"):
      integer(errors, f"task.{name}", s[name])
    return errors


@dataclasses.dataclass(frozen=True, kw_only=True)
class FilesTask(TextTask):
  """Problems and answers from the user's files (rlscale/tasks/files.py)."""
  name: Literal["files"] = f("files", "prompts and answers read from the user's files")
  train_files: str = f("", "comma-separated paths or globs of JSONL, Parquet or save_to_disk "
                           "folders")
  eval_files: str = f("", "the held-out set's files; empty: eval_fraction of the training rows")
  eval_fraction: float = f(0.0, "share of the training rows held out when eval_files is empty")
  answer_field: str = f("answer", "the column with the reference answer ('#### 72' and "
                                  "\\boxed{} work)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TfdsMathTask(TextTask):
  """A prepared TFDS math_dataset config (rlscale/tasks/tfds_math.py)."""
  name: Literal["tfds_math"] = f("tfds_math", "a prepared TFDS math_dataset config")
  tfds_name: str = f("math_dataset/arithmetic__add_or_sub", "the TFDS dataset and config "
                                                            "to read")
  data_dir: str = f("", "the TFDS data_dir holding it; empty: TFDS's default")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReasoningGymTask(TextTask):
  """One of reasoning_gym's procedural generators (rlscale/tasks/reasoning_gym.py)."""
  name: Literal["reasoning_gym"] = f("reasoning_gym", "a reasoning_gym procedural generator")
  rg_dataset: str = f("basic_arithmetic", "the reasoning_gym generator's name")
  rg_size: int = f(100_000, "problems in the training stream before it repeats")

  @classmethod
  def check(cls, s, cfg):
    errors = super().check(s, cfg)
    integer(errors, "task.rg_size", s["rg_size"])
    return errors


TASKS = {"arithmetic": ArithmeticTask, "chain_sum": ChainSumTask, "files": FilesTask,
         "tfds_math": TfdsMathTask, "reasoning_gym": ReasoningGymTask}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rollout(_Fields):
  """Sampling of the training responses."""
  # max_new_tokens: a builder argument; 6 as configs/grpo.py and configs/ppo.py.
  max_new_tokens: int = f(6, "response budget in tokens, EOS included")
  temperature: float = f(1.0, "sampling temperature of the training responses")
  top_k: int = f(0, "keep the k most likely tokens; 0 keeps every token")
  top_p: float = f(1.0, "nucleus sampling mass; 1 keeps every token")
  generation_batch: int | str = f("auto", "responses per compiled decode call; 'auto': the "
                                          "largest that fits the device memory")
  decode_chunk: int | str = f("auto", "KV-cache slots per chunk of generated tokens; 'auto': "
                                      "16 or 64 by rows per device")
  max_staleness: int = f(0, "step t trains on responses of the weights after update "
                            "max(0, t - 1 - k); 0: synchronous")
  dynamic_sampling: bool = f(False, "drop groups of equal rewards and refill the step from "
                                    "more prompts")
  filter_min_std: float = f(0.0, "dynamic sampling also drops groups whose reward std is at "
                                 "most this")
  max_rounds: int = f(4, "rounds of decode calls per step at most before training on what "
                         "is there")
  oversample: float | str = f("auto", "prompts sent per informative group needed: 'auto' "
                                      "(from the filtered share) or a number >= 1")

  @classmethod
  def check(cls, s, cfg):
    """The sampling temperature, the sampler's cut-offs, and the staleness bound: a step
    trains on responses of the policy up to k updates back, so the ratio's denominator must be
    the sampler's log-probs, which know the lag."""
    errors: list[str] = []
    number(errors, "rollout.temperature", s["temperature"], "> 0 for RL sampling",
           lambda v: v > 0)
    k = s["max_staleness"]
    integer(errors, "rollout.max_staleness", k, minimum=0)
    stale = isinstance(k, int) and not isinstance(k, bool) and k > 0
    if stale and cfg["rl"].get("old_logprobs") == "recompute":
      errors.append(f"rollout.max_staleness={k} with rl.old_logprobs='recompute': the "
                    "recomputed log-probs are the trainer's, not the policy that sampled (up to "
                    f"{k} update(s) older); use rl.old_logprobs='sampler'")
    if stale and k > 1 and s["dynamic_sampling"] is True:
      errors.append(f"rollout.max_staleness={k} with rollout.dynamic_sampling=True: a step's "
                    "refill rounds decide where the next step's prompts start, so the sampler "
                    "can run one step ahead at most; use rollout.max_staleness=1 (or 0)")
    boolean(errors, "rollout.dynamic_sampling", s["dynamic_sampling"])
    number(errors, "rollout.filter_min_std", s["filter_min_std"], ">= 0", lambda v: v >= 0)
    integer(errors, "rollout.max_rounds", s["max_rounds"], minimum=1)
    if s["oversample"] != "auto":
      number(errors, "rollout.oversample", s["oversample"], "'auto' or a number >= 1",
             lambda v: v >= 1)
    return errors

  @classmethod
  def sampler_errors(cls, s) -> list[str]:
    """The cut-offs the sampler reads (rlscale/sampling: SamplingParams holds them)."""
    errors = []
    new, top_k, top_p, chunk = (s["max_new_tokens"], s["top_k"], s["top_p"],
                                s["decode_chunk"])
    if _real(new) and new < 1:
      errors.append(f"rollout.max_new_tokens={new} must be >= 1")
    if _real(top_k) and top_k < 0:
      errors.append(f"rollout.top_k={top_k} must be >= 0")
    if _real(top_p) and not 0 < top_p <= 1:
      errors.append(f"rollout.top_p={top_p} must be in (0, 1]")
    if chunk != "auto" and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
      errors.append(f"rollout.decode_chunk={chunk!r} must be >= 1 or 'auto'")
    return errors


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rl(_Fields):
  """The RL step's batch and the policy loss every algorithm shares (GrpoRl and PpoRl add
  their own fields)."""
  # num_prompts, group_size: builder arguments; 64 and 8 as configs/grpo.py.
  num_prompts: int = f(64, "P: prompts per RL step")
  group_size: int = f(8, "G: responses per prompt")
  num_minibatches: int = f(1, "optimizer steps per epoch; a mini-batch is P*G/num_minibatches")
  num_epochs: int = f(1, "passes over each step's responses")
  microbatch: int | str = f("auto", "responses per forward/backward pass (never changes the "
                                    "gradient); 'auto': the plan's")
  clip_eps_low: float = f(0.2, "the ratio is clipped below at 1 - clip_eps_low")
  clip_eps_high: float = f(0.28, "the ratio is clipped above at 1 + clip_eps_high (DAPO's "
                                 "clip-higher)")
  kl_coef: float = f(0.0, "weight of the KL penalty to the frozen base policy; 0 skips it")
  kl_estimator: str = f("k3", "the KL estimator, a name in rlscale.rl.losses.KL_ESTIMATORS "
                              "(k1 | k2 | k3)")
  entropy_coef: float = f(0.0, "weight of the entropy bonus")
  loss_aggregation: str = f("token-mean", "how token losses are averaged, a name in "
                                          "rlscale.rl.losses.AGGREGATIONS")
  old_logprobs: Literal["sampler", "recompute"] = f(
      "sampler", "the ratio's old log-probs: recorded while sampling, or one forward more")
  off_policy_correction: Literal["none", "tis", "mis", "decoupled"] = f(
      "none", "correction of stale responses' tokens (rlscale/rl/off_policy.py)")
  is_cap: float = f(2.0, "tis and mis truncate, decoupled masks, the importance weight above "
                         "this")
  mis_threshold: float = f(2.0, "mis: responses whose geometric-mean ratio lies outside "
                                "[1/t, t] are masked")
  ptx_coef: float = f(0.0, "PPO-ptx: weight of the demonstrations' mean NLL in the policy "
                           "loss; 0: off")
  ptx_rows: int = f(8, "PPO-ptx: demonstration rows per optimizer step")
  dual_clip: float = f(0.0, "dual clip c > 1 of negative advantages' loss (Ye et al. 2020); "
                            "0: off")
  prox_com: float = f(0.0, "ppo_ewma: the proximal policy's centre of mass in optimizer "
                           "steps; 0: none")

  @classmethod
  def check(cls, s, cfg):
    """The shared policy loss's values (the names of registered losses, KL estimators and
    advantages are the algorithm's to check: rlscale/rl/algorithm.py)."""
    errors: list[str] = []
    if s["old_logprobs"] not in choices(cls, "old_logprobs"):
      errors.append(f"rl.old_logprobs={s['old_logprobs']!r}; known: "
                    f"{', '.join(choices(cls, 'old_logprobs'))}")
    low, high = s["clip_eps_low"], s["clip_eps_high"]
    if _real(low) and _real(high) and (not 0 <= low < 1 or not high >= 0):
      errors.append(f"rl.clip_eps_low={low}, rl.clip_eps_high={high}: need 0 <= low < 1 and "
                    f"high >= 0")
    errors += cls._ptx_errors(s)
    errors += cls._correction_errors(s)
    kl, entropy = s["kl_coef"], s["entropy_coef"]
    if _real(kl) and _real(entropy) and not (kl >= 0 and entropy >= 0):  # NaN is refused
      errors.append(f"rl.kl_coef={kl}, rl.entropy_coef={entropy} must be >= 0")
    if _real(s["dual_clip"]) and s["dual_clip"] and not s["dual_clip"] > 1:
      errors.append(f"rl.dual_clip={s['dual_clip']} must be > 1 (or 0 to turn it off)")
    if _real(s["prox_com"]) and not s["prox_com"] >= 0:
      errors.append(f"rl.prox_com={s['prox_com']} must be >= 0")
    return errors

  @staticmethod
  def _ptx_errors(s) -> list[str]:
    coef, rows = s["ptx_coef"], s["ptx_rows"]
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not coef >= 0:
      return [f"rl.ptx_coef={coef!r} must be a number >= 0 (0 turns PPO-ptx off)"]
    if coef and (isinstance(rows, bool) or not isinstance(rows, int) or rows <= 0):
      return [f"rl.ptx_rows={rows!r} must be a positive multiple of 1 (batch shards x "
              f"processes) when rl.ptx_coef > 0"]
    return []

  @classmethod
  def _correction_errors(cls, s) -> list[str]:
    """A known correction, cap > 1 and threshold > 1 where they are used, and the behaviour's
    log-probs from the sampler (the correction recomputes the trainer's)."""
    mode = s["off_policy_correction"]
    if mode not in choices(cls, "off_policy_correction"):
      return [f"rl.off_policy_correction={mode!r}; known: "
              f"{', '.join(choices(cls, 'off_policy_correction'))}"]
    if mode == "none":
      return []
    out: list[str] = []
    for name in ("is_cap",) + (("mis_threshold",) if mode == "mis" else ()):
      number(out, f"rl.{name}", s[name],
             f"a finite number > 1 (rl.off_policy_correction={mode!r})", lambda v: v > 1)
    if s["old_logprobs"] != "sampler":
      out.append(f"rl.off_policy_correction={mode!r} with rl.old_logprobs="
                 f"{s['old_logprobs']!r}: the correction's denominator is the sampler's "
                 "log-probs and it recomputes the trainer's itself; use "
                 "rl.old_logprobs='sampler'")
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class GrpoRl(Rl):
  """GRPO's rl section: the shared fields and its group-relative advantage."""
  advantage: str = f("grpo", "group-relative advantage, a name in rlscale.rl.advantages."
                             "ADVANTAGES (grpo | dr_grpo | rloo)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PpoRl(Rl):
  """PPO's (and PPO-EWMA's) rl section: the shared fields and its GAE advantages."""
  gamma: float = f(1.0, "discount of the token-level rewards")
  lam: float = f(0.95, "GAE lambda")
  whiten_advantages: bool = f(True, "normalize the advantages over the batch's valid tokens")

  @classmethod
  def check(cls, s, cfg):
    errors = super().check(s, cfg)
    for name in ("gamma", "lam"):
      if _real(s[name]) and not 0 <= s[name] <= 1:
        errors.append(f"rl.{name}={s[name]} must be in [0, 1]")
    boolean(errors, "rl.whiten_advantages", s["whiten_advantages"])
    return errors


RL_TYPES = {"grpo": GrpoRl, "ppo": PpoRl, "ppo_ewma": PpoRl}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Optim(_Fields):
  """An AdamW optimizer with batch-size scaling rules (rlscale/rl/optim.py)."""
  # lr: a builder argument; 1e-4 as configs/grpo.py and configs/ppo.py's actor.
  lr: float = f(1e-4, "peak learning rate at the reference batch")
  lr_scaling: Literal["none", "linear", "sqrt"] = f(
      "none", "how lr follows the batch relative to reference_batch")
  lr_batch: Literal["nominal", "effective"] = f(
      "nominal", "the batch lr_scaling follows: responses per step, or its informative ones")
  reference_batch: int | None = f(None, "responses per optimizer step at which lr was tuned; "
                                        "None: the run's own")
  adam_scaling: bool = f(False, "also scale Adam's betas and eps with the batch")
  schedule: Literal["constant", "cosine", "linear"] = f(
      "constant", "the learning rate after warmup, decayed to the run's end or not")
  warmup_responses: int = f(0, "linear warmup from 0 over this many responses "
                               "(demonstrations in SFT)")
  final_lr_frac: float = f(0.0, "cosine and linear decay end at lr * final_lr_frac")
  b1: float = f(0.9, "Adam beta1")
  b2: float = f(0.999, "Adam beta2")
  eps: float = f(1e-8, "Adam epsilon")
  weight_decay: float = f(0.0, "decoupled (AdamW) weight decay")
  grad_clip: float = f(1.0, "clip the global gradient norm to this; 0: no clipping")
  state_dtype: Literal["", "float32"] = f("", "dtype of Adam's moments; empty: the "
                                              "parameters'")

  @classmethod
  def check(cls, s, cfg, prefix: str = "optim"):
    errors: list[str] = []
    number(errors, f"{prefix}.lr", s["lr"], "a positive number", lambda v: v > 0)
    for name in ("schedule", "lr_scaling", "lr_batch"):
      if s[name] not in choices(cls, name):
        errors.append(f"{prefix}.{name}={s[name]!r}; known: {', '.join(choices(cls, name))}")
    ref = s["reference_batch"]
    if ref is not None and (isinstance(ref, bool) or not isinstance(ref, (int, float))
                            or ref <= 0):
      errors.append(f"{prefix}.reference_batch={ref!r} must be a positive number of responses "
                    f"(or None: the run's own batch)")
    boolean(errors, f"{prefix}.adam_scaling", s["adam_scaling"])
    for name, allowed, ok in (
        ("warmup_responses", ">= 0", lambda v: v >= 0),
        ("final_lr_frac", "in [0, 1] (a fraction of lr)", lambda v: 0 <= v <= 1),
        ("weight_decay", ">= 0", lambda v: v >= 0),
        ("grad_clip", ">= 0 (0 turns clipping off)", lambda v: v >= 0),
        ("b1", "in [0, 1)", lambda v: 0 <= v < 1), ("b2", "in [0, 1)", lambda v: 0 <= v < 1),
        ("eps", "> 0", lambda v: v > 0)):
      number(errors, f"{prefix}.{name}", s[name], allowed, ok)
    if s["state_dtype"] not in choices(cls, "state_dtype"):
      errors.append(f"{prefix}.state_dtype={s['state_dtype']!r}; known: '' (the parameters' "
                    f"dtype), 'float32'")
    return errors


@dataclasses.dataclass(frozen=True, kw_only=True)
class Critic(_Fields):
  """PPO's value model: its backbone, batches, loss and optimizer."""
  hf_checkpoint: str = f("", "the critic's backbone folder; empty: the base policy's")
  num_minibatches: int = f(1, "critic optimizer steps per epoch")
  num_epochs: int = f(1, "critic passes over each step's responses")
  microbatch: int | str = f("auto", "responses per forward/backward pass of the critic; "
                                    "'auto': the plan's")
  value_clip: float = f(0.2, "clip of the value update around the old values; 0: off")
  warmup_steps: int = f(10, "first RL steps that train the critic alone (its head starts "
                            "random)")
  # lr and reference_batch: builder arguments; 3e-4 and 256 as configs/ppo.py.
  optim: Optim = f(functools.partial(Optim, lr=3e-4, reference_batch=256),
                   "the critic's own optimizer")

  @classmethod
  def check(cls, s, cfg):
    errors: list[str] = []
    if _real(s["value_clip"]) and not s["value_clip"] >= 0:
      errors.append(f"critic.value_clip={s['value_clip']} must be >= 0 (0 turns it off)")
    integer(errors, "critic.warmup_steps", s["warmup_steps"], minimum=0)
    if s["hf_checkpoint"]:
      hf_folder(errors, "critic.hf_checkpoint", s["hf_checkpoint"], weights=True)
    return errors


@dataclasses.dataclass(frozen=True, kw_only=True)
class Init(_Fields):
  """Where an RL run's policy starts."""
  hf_checkpoint: str = f("", "start from this folder (else model.hf_checkpoint, else the SFT "
                             "base)")
  sft_config: str = f("configs/sft.py", "the base policy's SFT recipe (its model, task and "
                                        "mesh are the run's)")
  cache_dir: str = f("runs/base", "base policies are cached here by their SFT config's hash")
  branch_from: str = f("", "run directory whose checkpoint a branch starts from; empty: the "
                           "base policy")
  branch_step: int = f(0, "step of branch_from's checkpoint to start from")
  branch_optimizer: Literal["fresh", "parent"] = f(
      "fresh", "a branch's Adam state: empty moments, or the parent's")

  @classmethod
  def check(cls, s, cfg):
    """Folders an RL run reads (checkpoints) and writes (the base policy cache), and the
    checkpoint a branch starts from; the SFT recipe itself is resolved as the run will
    resolve it (rlscale/resolve/resolved.py)."""
    errors: list[str] = []
    model = cfg["model"]["hf_checkpoint"]
    if s["hf_checkpoint"]:
      hf_folder(errors, "init.hf_checkpoint", s["hf_checkpoint"], weights=True)
    elif model:  # its own base: its weights are read too
      if isinstance(model, str) and os.path.isdir(model) and not has_weights(model):
        errors.append(f"model.hf_checkpoint={model!r} lacks *.safetensors: the run starts "
                      f"from its weights (or set init.hf_checkpoint)")
    else:
      errors += check_directory(s["cache_dir"], "init.cache_dir")
    integer(errors, "init.branch_step", s["branch_step"], minimum=0)
    if s["branch_optimizer"] not in choices(cls, "branch_optimizer"):
      errors.append(f"init.branch_optimizer={s['branch_optimizer']!r}; known: "
                    f"{', '.join(choices(cls, 'branch_optimizer'))}")
    return errors + cls._branch_errors(s)

  @staticmethod
  def _branch_errors(s) -> list[str]:
    """init.branch_from names a run directory holding the checkpoint of init.branch_step."""
    origin, step = s["branch_from"], s["branch_step"]
    if not origin:
      return []
    if not isinstance(origin, str):
      return [f"init.branch_from={origin!r} must name a run directory"]
    folder = os.path.join(origin, "checkpoints")
    if not os.path.isdir(folder):
      return [f"init.branch_from={origin!r} has no checkpoints/ folder: name the run "
              "directory of the run to branch from"]
    steps = sorted(int(n) for n in os.listdir(folder) if n.isdigit())
    if isinstance(step, int) and step not in steps:
      return [f"init.branch_step={step!r}: {origin} keeps the checkpoints of steps "
              f"{steps or 'none'} (train.keep_period keeps more)"]
    return []


@dataclasses.dataclass(frozen=True, kw_only=True)
class Train(_Fields):
  """The run's length, evaluation and checkpoint cadence, logging and memory."""
  # num_steps: a builder argument; 200 as configs/grpo.py, ppo.py and grpo_math.py.
  num_steps: int = f(200, "steps of the run (unused when total_responses is set)")
  total_responses: int = f(0, "run length in responses instead of steps; 0: num_steps")
  eval_every: int = f(25, "held-out evaluation every N steps and at the end; 0: at the end "
                          "only")
  eval_every_responses: int = f(0, "evaluate at multiples of this many responses instead; 0: "
                                   "eval_every")
  checkpoint_every: int = f(50, "save every N steps and at the end; 0: at the end only")
  keep_checkpoints: int = f(2, "checkpoints kept on disk")
  keep_period: int = f(0, "also keep checkpoints of steps that are multiples of this; 0: none")
  async_checkpoint: bool = f(True, "write checkpoints while the next steps run")
  peer_timeout_s: int = f(100, "whole seconds without a heartbeat after which a process "
                               "counts as lost")
  log_every: int = f(10, "console progress line every N steps")
  tensorboard: bool = f(True, "write TensorBoard event files beside metrics.jsonl")
  peak_flops: float = f(0.0, "one device's peak FLOP/s for MFU; 0: known accelerators only")
  remat: Literal["none", "full", "dots"] = f(
      "none", "rematerialization of each decoder block in the training forward")
  logprob_chunk: int = f(8192, "vocabulary columns per chunk of the log-softmax; 0: all at "
                               "once")
  shared_prompt: Literal["auto", True, False] = f(
      "auto", "RL: run each group's shared prompt once per micro-batch ('auto': when it fits)")
  pack_responses: bool = f(True, "with shared prompts: pack a micro-batch's responses into "
                                 "fewer rows")
  compile_buckets: Literal["auto", "ahead", "on_use"] = f(
      "auto", "when packed buckets' updates compile: all at first, as met, or 'auto'")

  @classmethod
  def check(cls, s, cfg):
    errors: list[str] = []
    for name in ("eval_every", "checkpoint_every", "log_every", "eval_every_responses"):
      integer(errors, f"train.{name}", s[name], minimum=0)
    integer(errors, "train.keep_checkpoints", s["keep_checkpoints"],
            why=" (at 0 orbax deletes every checkpoint it saves)")
    integer(errors, "train.keep_period", s["keep_period"], minimum=0)
    integer(errors, "train.peer_timeout_s", s["peer_timeout_s"],
            why=" (whole seconds: jax.distributed's heartbeat timeout)")
    for name in ("async_checkpoint", "tensorboard"):
      boolean(errors, f"train.{name}", s[name])
    if s["compile_buckets"] not in choices(cls, "compile_buckets"):
      errors.append(f"train.compile_buckets={s['compile_buckets']!r} must be one of "
                    f"{', '.join(map(repr, choices(cls, 'compile_buckets')))}")
    number(errors, "train.peak_flops", s["peak_flops"], ">= 0 (0: known accelerators only)",
           lambda v: v >= 0)
    return errors

  @classmethod
  def memory_errors(cls, s) -> list[str]:
    """train.remat and train.logprob_chunk: the training pass's memory (models/memory.py)."""
    errors = []
    if s["remat"] not in choices(cls, "remat"):
      errors.append(f"train.remat={s['remat']!r}; known: {', '.join(choices(cls, 'remat'))}")
    chunk = s["logprob_chunk"]
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
      errors.append(f"train.logprob_chunk={chunk!r} must be an integer >= 0 (vocabulary columns "
                    f"per chunk; 0: the whole vocabulary at once)")
    return errors


@dataclasses.dataclass(frozen=True, kw_only=True)
class Eval(_Fields):
  """Held-out evaluation."""
  greedy: bool = f(True, "score the greedy response to every held-out problem")
  sampled: bool = f(True, "score one temperature-1 response per held-out problem")
  reference: bool = f(False, "score the teacher-forced log-likelihood of the reference "
                             "responses")
  generation_batch: int = f(512, "held-out rows per compiled decode call")
  adaptive: bool = f(False, "evaluate in doubling stages until the target's side is settled")
  adaptive_z: float = f(2.0, "standard errors from target.value that settle an adaptive "
                             "evaluation")

  @classmethod
  def check(cls, s, cfg):
    errors: list[str] = []
    integer(errors, "eval.generation_batch", s["generation_batch"],
            why=" (held-out rows per compiled decode call)")
    for name in ("sampled", "reference", "greedy"):
      boolean(errors, f"eval.{name}", s[name])
    if s["greedy"] is False and s["sampled"] is False and s["reference"] is not True:
      errors.append("eval.greedy=False with eval.sampled=False: the held-out set would never "
                    "be scored; keep one of them (or eval.reference=True)")
    boolean(errors, "eval.adaptive", s["adaptive"])
    number(errors, "eval.adaptive_z", s["adaptive_z"], "> 0 (standard errors)", lambda v: v > 0)
    metric = cfg.get("target", {}).get("metric") if cfg["kind"] != "sft" else None
    if s["adaptive"] is True and metric not in ("eval/accuracy_sampled", "eval/accuracy_greedy"):
      errors.append(f"eval.adaptive=True with target.metric={metric!r}: an evaluation in "
                    f"stages settles the target's side on an accuracy (eval/accuracy_sampled "
                    f"or eval/accuracy_greedy)")
    return errors


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target(_Fields):
  """The evaluation value an RL run aims at."""
  # metric and value: builder arguments; as configs/grpo.py and configs/ppo.py.
  metric: str = f("eval/accuracy_greedy", "the evaluation metric the target is read from")
  value: float = f(0.6, "the target is met at the first evaluation with metric >= value")
  stop: bool = f(False, "end the run once the target is met (after a checkpoint)")
  stop_margin: float = f(0.0, "with stop: go on to (1 + stop_margin) x the responses to "
                              "target")

  @classmethod
  def check(cls, s, cfg):
    """The target is read from an evaluation metric: one no evaluation reports is never met."""
    errors: list[str] = []
    ev = cfg["eval"]
    on = {"sampled": ev["sampled"] is True, "greedy": ev["greedy"] is not False}
    known = [m for m in EVAL_METRICS if on[m.rsplit("_", 1)[1]]]
    known += list(REFERENCE_METRICS) if ev["reference"] is True else []
    metric = s["metric"]
    if metric not in known:
      off = [k for k, v in on.items() if not v]
      hint = (f" (eval.{off[0]}=False: no *_{off[0]} metric)" if off and metric in EVAL_METRICS
              else "")
      errors.append(f"target.metric={metric!r} is not an evaluation metric{hint}; known: "
                    f"{', '.join(known)}")
    name = metric.split("/")[-1] if isinstance(metric, str) else ""
    if name.split("_")[0] in FRACTIONS or name in FRACTIONS:
      number(errors, "target.value", s["value"], f"in [0, 1] ({metric} is a fraction)",
             lambda v: 0 <= v <= 1)
    else:
      number(errors, "target.value", s["value"], "a finite number", lambda v: True)
    boolean(errors, "target.stop", s["stop"])
    number(errors, "target.stop_margin", s["stop_margin"], ">= 0 (a fraction of the responses "
           "to target)", lambda v: v >= 0)
    return errors


@dataclasses.dataclass(frozen=True, kw_only=True)
class Noise(_Fields):
  """The gradient noise scale measurement."""
  enabled: bool = f(True, "measure it (needs 2 or more micro-batches per mini-batch)")
  decay: float = f(0.9, "EMA decay per RL step of the |G|^2 and tr(Sigma) estimates")
  prompt_level: bool = f(True, "on alternate steps, micro-batches of whole groups (B in "
                               "prompts)")

  @classmethod
  def check(cls, s, cfg):
    errors: list[str] = []
    boolean(errors, "noise.enabled", s["enabled"])
    boolean(errors, "noise.prompt_level", s["prompt_level"])
    number(errors, "noise.decay", s["decay"], "in (0, 1)", lambda v: 0 < v < 1)
    return errors


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sft(_Fields):
  """Supervised training of the base policy (configs/sft.py)."""
  # No builder in sections.py: the values of configs/sft.py.
  batch_size: int = f(128, "demonstrations per step, over all processes")
  microbatch: int | str = f(128, "rows per forward/backward pass; 'auto': the batch plan's")


KINDS = ("sft", "grpo", "ppo", "ppo_ewma")
_OPTIONAL = ("init", "rollout", "rl", "critic", "noise", "target", "sft")


def _needs(kind: str) -> frozenset[str]:
  """The optional sections a config of `kind` has."""
  if kind == "sft":
    return frozenset({"sft"})
  return frozenset({"init", "rollout", "rl", "noise", "target"}
                   | ({"critic"} if RL_TYPES.get(kind) is PpoRl else set()))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(_Fields):
  """A whole run's config; a section its kind lacks is None (and not among keys())."""
  # Not a Literal: an algorithm registered in rlscale/rl/algorithm.py is a kind too (its own
  # check refuses a kind no one registered); its rl section reads as Rl.
  kind: str = f(doc="sft, or the RL algorithm registered under this name (grpo, ppo, ppo_ewma)")
  seed: int = f(0, "every random draw of the run derives from it")
  model: Model = f(Model, "the policy's architecture")
  mesh: Mesh = f(Mesh, "the device mesh")
  task: (ArithmeticTask | ChainSumTask | FilesTask | TfdsMathTask
         | ReasoningGymTask) = f(ArithmeticTask, "the problems, prompts and verifier")
  init: Init | None = f(None, "RL: where the policy starts")
  rollout: Rollout | None = f(None, "RL: sampling of the training responses")
  rl: GrpoRl | PpoRl | None = f(None, "RL: the step's batch and the algorithm's loss")
  optim: Optim = f(Optim, "the policy's optimizer")
  critic: Critic | None = f(None, "PPO: the value model")
  noise: Noise | None = f(None, "RL: the gradient noise scale measurement")
  target: Target | None = f(None, "RL: the evaluation value the run aims at")
  train: Train = f(Train, "the run's length and cadence")
  eval: Eval = f(Eval, "held-out evaluation")
  sft: Sft | None = f(None, "SFT: the demonstrations' batch")

  def __post_init__(self):
    errors = _kind_errors(self.kind, {n for n in _OPTIONAL if getattr(self, n) is not None})
    if self.kind in RL_TYPES and self.rl is not None and type(self.rl) is not RL_TYPES[self.kind]:
      errors.append(f"rl: kind={self.kind!r} takes a {RL_TYPES[self.kind].__name__}, not a "
                    f"{type(self.rl).__name__}")
    if errors:
      raise ConfigError("invalid config:\n  " + "\n  ".join(errors))

  def keys(self) -> tuple[str, ...]:
    return tuple(n for n in _names(Config) if getattr(self, n) is not None)


def _kind_errors(kind: str, present: set[str]) -> list[str]:
  """Sections `present` that `kind` lacks, and those it needs that are absent."""
  if not kind:
    return []
  needs = _needs(kind)
  return ([f"{n}: kind={kind!r} has no {n} section" for n in _OPTIONAL
           if n in present and n not in needs]
          + [f"{n}: missing (kind={kind!r} needs it)" for n in _OPTIONAL
             if n in needs and n not in present])


# --- reading the sections' fields ---


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def _is_union(hint) -> bool:
  return typing.get_origin(hint) in (typing.Union, types.UnionType)


def choices(cls, name: str) -> tuple:
  """The values a Literal field of `cls` takes, in the order its type lists them."""
  hint = _hints(cls)[name]
  return next(typing.get_args(a) for a in (typing.get_args(hint) if _is_union(hint) else (hint,))
              if typing.get_origin(a) is Literal)


def default(cls, name: str) -> Any:
  """The default of field `name` of `cls` (a section's: its fields as a plain dict)."""
  field = next(fl for fl in dataclasses.fields(cls) if fl.name == name)
  value = field.default_factory() if field.default_factory is not MISSING else field.default
  return to_dict(value) if isinstance(value, _Fields) else value


def _real(value) -> bool:
  """A number to compare (not a bool): the type check names any other value."""
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def with_defaults(cls, raw) -> dict:
  """A section's plain dict with every field of `cls`: an absent field reads as its default."""
  out = {fl.name: default(cls, fl.name) for fl in dataclasses.fields(cls)}
  return {**out, **raw} if isinstance(raw, dict) else out


def to_dict(cfg: Config) -> dict:
  """The nested plain dict of `cfg`'s fields (from_dict's inverse): sections that are None
  are left out, tuples stay tuples."""
  def plain(node):
    return {k: plain(node[k]) if isinstance(node[k], _Fields) else node[k]
            for k in node.keys()}
  return plain(cfg)
