"""Bad configurations, one per row: each is refused by validate() before anything is compiled,
in one line that names the field. A few go through the command line instead.

A row is (config, field, value, expected text); `also` sets more fields first, `name` is the
field's name as the message spells it when that differs from `field`. Values `Folder(...)`
are paths made in a temporary directory (a missing folder, a file, a folder lacking files).
"""

import os
import re
import shutil

import jax
import pytest

from tests.support import REPO, FIXTURES
from tests.support.cli import run_in_process
from rlscale.run import command_line
from rlscale.config import files as config_files
from rlscale.config.errors import ConfigError
from rlscale.config.fields import EVAL_METRICS
from rlscale.resolve.resolved import validate

# A Hugging Face folder with config.json and weights but no tokenizer.json.
FIXTURE = os.path.join(FIXTURES, "hf", "qwen3")
NAN = float("nan")


class Folder(str):
  """A path under the test's temporary directory, made by `_folders`."""


MISSING, FILE, UNDER_FILE = Folder("missing"), Folder("file"), Folder("file/run")
CONFIG_ONLY, BAD_JSON = Folder("config_only"), Folder("bad_json")
KEPT_2 = Folder("run_kept_2")  # a run directory that kept the checkpoint of step 2 only


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  return make_folders(tmp_path_factory.mktemp("bad_configs"))


def make_folders(root):
  """The folders the table's `Folder` values name, made under `root`."""
  (root / "file").write_text("not a folder")
  (root / "config_only").mkdir()
  shutil.copy(os.path.join(FIXTURE, "config.json"), root / "config_only")
  (root / "bad_json").mkdir()
  (root / "bad_json" / "config.json").write_text("{")
  (root / "bad_json" / "tokenizer.json").write_text("{}")
  (root / "run_kept_2" / "checkpoints" / "2").mkdir(parents=True)
  return root


def row(config, field, value, expect, *, also=None, name=None, workdir=None):
  return pytest.param(config, field, value, expect, also or {}, name or field, workdir,
                      id=f"{config}:{field}={value!r}"[:80])


BAD = [
    # model
    row("grpo.py", "model.name", "gpt5", "model.name='gpt5' is not a known size"),
    row("grpo.py", "model.dtype", "int8", "model.dtype='int8': use float32"),
    row("grpo.py", "model.param_dtype", "fp8", "model.param_dtype='fp8'"),
    row("grpo.py", "model.num_kv_heads", 3, "is not a multiple of num_kv_heads=3",
        name="model.num_heads"),
    row("grpo.py", "model.head_dim", 33, "model.head_dim=33 must be even"),
    row("grpo.py", "model.d_model", 0, "model.d_model=0 must be positive"),
    row("grpo.py", "model.vocab_size", 8, "model.vocab_size=8 is smaller than the task's"),
    row("grpo.py", "model.hf_checkpoint", MISSING, "does not exist: give a Hugging Face folder"),
    row("grpo.py", "model.hf_checkpoint", FILE, "is not a directory"),
    row("grpo.py", "model.hf_checkpoint", FIXTURE, "lacks tokenizer.json"),
    row("sft.py", "model.hf_checkpoint", BAD_JSON, "not valid JSON"),
    # mesh
    row("grpo.py", "mesh.shape", (3, 1, 1), "mesh.shape=(3, 1, 1) does not fit 8 devices"),
    row("grpo.py", "mesh.shape", (-1, -1, 2), "at most one -1"),
    row("grpo.py", "mesh.shape", (8, 1), "mesh.shape=(8, 1) must be 3 positive sizes"),
    row("sft.py", "mesh.rules", (("batch", "gpu"),), "'gpu' is not a mesh axis"),
    # task
    row("grpo.py", "task.name", "chess", "task.name='chess' is not one of"),
    row("grpo.py", "task.num_eval", 0, "task.num_eval=0 must be a positive integer"),
    row("grpo.py", "task.num_eval", 20_000, "task.num_eval=20000 leaves too few training"),
    row("sft.py", "task.digits", 0, "task.digits=0 must be a positive integer"),
    row("grpo.py", "task.ops", "+/", "task.ops='+/'"),
    row("grpo.py", "task.restate", 1.5, "task.restate=1.5 must be in [0, 1]"),
    row("grpo.py", "task.seed", -1, "task.seed=-1 must be an integer >= 0"),
    row("grpo.py", "task.name", "tfds_math", "needs a tokenizer: set model.hf_checkpoint"),
    # rl: the batch, GRPO's and the shared policy-loss fields
    row("grpo.py", "rl.num_prompts", 0, "rl.num_prompts=0 must be a positive integer"),
    row("grpo.py", "rl.group_size", 1, "rl.group_size=1: advantage 'grpo' needs groups of 2+"),
    row("grpo.py", "rl.num_minibatches", 3, "rl.num_minibatches=3 does not divide"),
    row("grpo.py", "rl.num_epochs", 0, "rl.num_epochs=0 must be a positive integer"),
    row("grpo.py", "rl.microbatch", 96, "rl.microbatch=96 does not divide the mini-batch"),
    row("grpo.py", "rl.microbatch", 4, "rl.microbatch=4 must split over 8 batch shards"),
    row("grpo.py", "rl.microbatch", "many", "rl.microbatch='many' must be a positive integer or"),
    row("grpo.py", "rl.advantage", "ppo", "rl.advantage='ppo'; known:"),
    row("grpo.py", "rl.loss_aggregation", "mean", "rl.loss_aggregation='mean'; known:"),
    row("grpo.py", "rl.kl_estimator", "k4", "rl.kl_estimator='k4'; known:"),
    row("grpo.py", "rl.old_logprobs", "cached", "rl.old_logprobs='cached'; known:"),
    row("grpo.py", "rl.clip_eps_low", 1.5, "rl.clip_eps_low=1.5"),
    row("grpo.py", "rl.kl_coef", -0.1, "rl.kl_coef=-0.1"),
    row("grpo.py", "rl.entropy_coef", -1.0, "rl.entropy_coef=-1.0"),
    row("grpo.py", "kind", "a2c", "kind='a2c'; known: sft, grpo"),
    row("grpo.py", "kind", "ppo", "kind='ppo' needs rl.gamma"),
    row("ppo.py", "kind", "grpo", "kind='grpo' needs rl.advantage"),
    # rl: PPO's fields
    row("ppo.py", "rl.gamma", 1.5, "rl.gamma=1.5 must be in [0, 1]"),
    row("ppo.py", "rl.lam", -0.1, "rl.lam=-0.1 must be in [0, 1]"),
    row("ppo.py", "rl.dual_clip", 0.5, "rl.dual_clip=0.5 must be > 1"),
    row("grpo.py", "rl.dual_clip", 0.5, "rl.dual_clip=0.5 must be > 1"),
    row("ppo.py", "rl.prox_com", -1.0, "rl.prox_com=-1.0 must be >= 0"),
    row("ppo.py", "rl.prox_com", 2.0, "rl.prox_com=2.0 turns on the proximal policy"),
    row("ppo.py", "rl.prox_com", 0.0, "rl.prox_com=0.0: ppo_ewma needs", also={"kind": "ppo_ewma"}),
    row("ppo.py", "rl.whiten_advantages", "yes", "rl.whiten_advantages='yes' must be True or"),
    # critic
    row("ppo.py", "critic.num_minibatches", 3, "critic.num_minibatches=3 does not divide"),
    row("ppo.py", "critic.microbatch", 96, "critic.microbatch=96 does not divide the critic's"),
    row("ppo.py", "critic.num_epochs", 0, "critic.num_epochs=0 must be a positive integer"),
    row("ppo.py", "critic.value_clip", -0.1, "critic.value_clip=-0.1 must be >= 0"),
    row("ppo.py", "critic.warmup_steps", -1, "critic.warmup_steps=-1 must be an integer >= 0"),
    row("ppo.py", "critic.hf_checkpoint", MISSING, "does not exist: give a Hugging Face folder"),
    row("ppo.py", "critic.optim.lr", 0.0, "critic.optim.lr=0.0 must be a positive number"),
    row("ppo.py", "critic.optim.b2", 1.0, "critic.optim.b2=1.0 must be in [0, 1)"),
    # rollout
    row("grpo.py", "rollout.temperature", 0.0, "rollout.temperature=0.0 must be > 0"),
    row("grpo.py", "rollout.top_p", 1.5, "rollout.top_p=1.5 must be in (0, 1]"),
    row("grpo.py", "rollout.top_k", -1, "rollout.top_k=-1 must be >= 0"),
    row("grpo.py", "rollout.max_new_tokens", 0, "rollout.max_new_tokens=0 must be >= 1"),
    row("grpo_chain_sum.py", "task.terms", 5, "rollout.max_new_tokens=24 is shorter than the "
        "task's longest right response (30 tokens", name="rollout.max_new_tokens"),
    row("ppo.py", "rollout.decode_chunk", 0, "rollout.decode_chunk=0 must be >= 1"),
    row("grpo.py", "rollout.generation_batch", 12, "rollout.generation_batch=12 must split over"),
    row("grpo.py", "rollout.generation_batch", 0, "rollout.generation_batch=0 must be a positive"),
    # dynamic sampling
    row("ppo.py", "rollout.dynamic_sampling", True, "rollout.dynamic_sampling=True with kind='ppo': "
        "filtering groups of equal rewards has meaning only for a group-relative advantage"),
    row("grpo.py", "rollout.dynamic_sampling", True, "rollout.dynamic_sampling=True with "
        "rl.group_size=1: a group of one response", also={"rl.advantage": "dr_grpo",
                                                         "rl.group_size": 1}),
    row("grpo.py", "rollout.dynamic_sampling", "yes", "rollout.dynamic_sampling='yes' must be True"),
    row("grpo.py", "rollout.max_rounds", 0, "rollout.max_rounds=0 must be a positive integer"),
    row("grpo.py", "rollout.max_staleness", -1, "rollout.max_staleness=-1 must be an integer >= 0"),
    row("grpo.py", "rl.off_policy_correction", "vtrace",
        "rl.off_policy_correction='vtrace'; known: none, tis, mis, decoupled"),
    row("ppo.py", "rl.off_policy_correction", "tis", "rl.is_cap=0.5 must be a finite number > 1",
        also={"rl.is_cap": 0.5}),
    row("grpo.py", "rollout.filter_min_std", -0.1, "rollout.filter_min_std=-0.1 must be >= 0"),
    row("grpo.py", "rollout.oversample", 0.5, "rollout.oversample=0.5 must be 'auto' or a number"),
    row("grpo.py", "rollout.generation_batch", 8, "rollout.dynamic_sampling=True decodes whole "
        "groups per call: rollout.generation_batch=8 must be a multiple of rl.group_size",
        also={"rollout.dynamic_sampling": True, "rl.group_size": 16, "rl.microbatch": "auto"}),
    row("grpo.py", "optim.lr_batch", "trained", "optim.lr_batch='trained'; known: nominal, effective"),
    row("grpo.py", "rollout.dynamic_sampling", True, "rollout.dynamic_sampling=True assembles the "
        "step on the sampler's devices: rl.num_prompts x rl.group_size = 512 must split over its "
        "6 batch shards", also={"mesh.roles": "split", "mesh.sampler_devices": 6,
                                "mesh.shape": (-1, 1, 1), "mesh.sampler_shape": (-1, 1, 1)}),
    # shared-prompt training
    row("grpo.py", "train.shared_prompt", "yes", "train.shared_prompt='yes' must be 'auto', True "
        "or False"),
    row("grpo.py", "train.shared_prompt", True, "train.shared_prompt=True needs micro-batches of "
        "whole groups on every batch shard: rl.microbatch=8 is not a multiple of rl.group_size x "
        "batch shards (8 x 8)", also={"rl.microbatch": 8}),
    row("grpo.py", "train.pack_responses", "auto", "train.pack_responses='auto' must be True or "
        "False"),
    row("grpo.py", "train.compile_buckets", "early", "train.compile_buckets='early' must be one "
        "of 'auto', 'ahead', 'on_use'"),
    # optim (the actor's; SFT's)
    row("grpo.py", "optim.lr", 0.0, "optim.lr=0.0 must be a positive number"),
    row("grpo.py", "optim.lr", NAN, "optim.lr=nan must be a positive number"),
    row("grpo.py", "optim.schedule", "step", "optim.schedule='step'; known:"),
    row("grpo.py", "optim.lr_scaling", "cubic", "optim.lr_scaling='cubic'; known:"),
    row("grpo.py", "optim.b1", 1.5, "optim.b1=1.5 must be in [0, 1)"),
    row("ppo.py", "optim.b2", -0.1, "optim.b2=-0.1 must be in [0, 1)"),
    row("grpo.py", "optim.eps", 0.0, "optim.eps=0.0 must be > 0"),
    row("grpo.py", "optim.grad_clip", -1.0, "optim.grad_clip=-1.0 must be >= 0"),
    row("sft.py", "optim.warmup_responses", -5, "optim.warmup_responses=-5 must be >= 0"),
    row("grpo.py", "optim.final_lr_frac", 2.0, "optim.final_lr_frac=2.0 must be in [0, 1]"),
    row("sft.py", "optim.weight_decay", -0.01, "optim.weight_decay=-0.01 must be >= 0"),
    row("grpo.py", "optim.reference_batch", 0, "optim.reference_batch=0 must be a positive"),
    row("grpo.py", "optim.adam_scaling", "yes", "optim.adam_scaling='yes' must be True or False"),
    # noise
    row("grpo.py", "noise.decay", 1.0, "noise.decay=1.0 must be in (0, 1)"),
    row("grpo.py", "noise.decay", 0.0, "noise.decay=0.0 must be in (0, 1)"),
    row("grpo.py", "noise.enabled", "yes", "noise.enabled='yes' must be True or False"),
    row("grpo.py", "rl.microbatch", 512, "rl.microbatch=512 leaves one pass per mini-batch"),
    # target
    row("grpo.py", "target.metric", "eval/acc", "target.metric='eval/acc' is not an evaluation"),
    row("grpo.py", "target.metric", "", "target.metric='' is not an evaluation metric"),
    row("grpo.py", "target.metric", "eval/accuracy_sampled", "eval.sampled=False: no *_sampled",
        also={"eval.sampled": False}),
    row("grpo.py", "target.value", 1.5, "target.value=1.5 must be in [0, 1]"),
    row("ppo.py", "target.value", NAN, "target.value=nan must be in [0, 1]"),
    row("grpo.py", "target.stop", 1, "target.stop=1 must be True or False"),
    # train and the run's own fields
    row("grpo.py", "train.keep_checkpoints", 0, "train.keep_checkpoints=0 must be a positive"),
    row("sft.py", "train.keep_checkpoints", -1, "train.keep_checkpoints=-1 must be a positive"),
    row("grpo.py", "train.num_steps", 0, "train.num_steps=0 must be a positive integer"),
    row("grpo.py", "train.total_responses", 1000, "train.total_responses=1000 is not a whole"),
    row("grpo.py", "train.total_responses", -512, "train.total_responses=-512 must be a positive"),
    row("grpo.py", "train.eval_every", -1, "train.eval_every=-1 must be an integer >= 0"),
    row("sft.py", "train.checkpoint_every", -1, "train.checkpoint_every=-1 must be an integer"),
    row("grpo.py", "train.log_every", 2.5, "train.log_every=2.5 must be an integer >= 0"),
    row("grpo.py", "train.eval_every_responses", -1, "train.eval_every_responses=-1 must be"),
    row("grpo.py", "train.peak_flops", -1.0, "train.peak_flops=-1.0 must be >= 0"),
    row("grpo.py", "train.tensorboard", "no", "train.tensorboard='no' must be True or False"),
    row("grpo.py", "seed", -1, "seed=-1 must be an integer >= 0"),
    row("grpo.py", "seed", 0, "is a file; give a directory", workdir=FILE, name="--workdir="),
    row("sft.py", "seed", 0, "cannot be created:", workdir=UNDER_FILE, name="--workdir="),
    # eval
    row("grpo.py", "eval.generation_batch", 0, "eval.generation_batch=0 must be a positive"),
    row("sft.py", "eval.generation_batch", -64, "eval.generation_batch=-64 must be a positive"),
    row("grpo.py", "eval.sampled", "yes", "eval.sampled='yes' must be True or False"),
    row("grpo.py", "eval.greedy", "no", "eval.greedy='no' must be True or False"),
    row("grpo.py", "eval.greedy", False, "the held-out set would never be scored",
        also={"eval.sampled": False}),
    row("grpo.py", "target.metric", "eval/accuracy_greedy", "eval.greedy=False: no *_greedy",
        also={"eval.greedy": False}),
    row("grpo.py", "eval.reference", "yes", "eval.reference='yes' must be True or False"),
    row("grpo.py", "target.metric", "eval/reference_prob", "is not an evaluation metric"),
    row("grpo.py", "train.keep_period", -1, "train.keep_period=-1 must be an integer >= 0"),
    row("grpo.py", "init.branch_step", -2, "init.branch_step=-2 must be an integer >= 0"),
    row("grpo.py", "init.branch_from", MISSING, "has no checkpoints/ folder"),
    row("grpo.py", "init.branch_optimizer", "warm", "init.branch_optimizer='warm'; known: fresh"),
    row("grpo.py", "init.branch_from", KEPT_2, "keeps the checkpoints of steps [2]",
        also={"init.branch_step": 5}, name="init.branch_step=5"),
    # init
    row("grpo.py", "init.hf_checkpoint", MISSING, "does not exist: give a Hugging Face folder"),
    row("grpo.py", "init.hf_checkpoint", CONFIG_ONLY, "lacks *.safetensors"),
    row("grpo.py", "init.sft_config", "nope.py", "config file 'nope.py' not found"),
    row("grpo.py", "init.sft_config", "configs/sft.py:bogus", "config argument 'bogus'"),
    row("grpo.py", "init.sft_config", "configs/grpo.py", "the base policy needs kind='sft'"),
    row("grpo.py", "init.sft_config", "configs/sft.py:lr=0", "optim.lr=0.0 must be a positive"),
    row("grpo.py", "init.cache_dir", FILE, "is a file; give a directory"),
    # sizes that cannot fit a device, refused by the plan with the numbers (in ~0.1 s)
    row("grpo.py", "rl.num_prompts", 10**9, "rl.num_prompts x rl.group_size = 8000000000 rows"),
    row("grpo.py", "rl.group_size", 10**8, "GiB per device while the step trains",
        name="rl.group_size"),
    row("grpo.py", "rollout.max_new_tokens", 10**8, "of activations in the actor's training pass"),
    row("ppo.py", "rollout.max_new_tokens", 10**7, "of activations in the critic's training pass"),
    row("grpo.py", "model.num_layers", 10**5, "the model's state (parameters, gradients",
        name="model"),
    row("grpo.py", "rollout.generation_batch", 4096, "the KV cache of rollout.generation_batch",
        also={"rollout.max_new_tokens": 30000, "train.logprob_chunk": 64,
              "train.remat": "full"}),
    row("grpo.py", "task.max_prompt_len", 1, "the arithmetic task sizes its prompts and answers "
        "itself"),
    # values of the wrong type or shape, which parts built after the checks would trip on
    row("grpo.py", "task.name", ["x"], "task.name=['x'] is not one of"),
    row("grpo.py", "rollout", 5, "rollout=5: a section"),
    row("ppo.py", "rl.gamma", "x", "rl.gamma='x': a float"),
    row("grpo.py", "optim.state_dtype", "x", "optim.state_dtype='x'; known:"),
    row("grpo.py", "init.cache_dir", None, "init.cache_dir=None must name a directory"),
    row("grpo.py", "rollout.max_new_tokens", "x", "rollout.max_new_tokens='x': an int"),
    row("grpo.py", "rl.advantage", ["grpo"], "rl.advantage=['grpo']; known:"),
    row("grpo.py", "rl.kl_coef", NAN, "rl.kl_coef=nan, rl.entropy_coef=0.0 must be >= 0"),
    row("grpo.py", "model.rope_theta", -1.0, "model.rope_theta=-1.0 must be a positive number"),
    # sft
    row("sft.py", "sft.batch_size", 0, "sft.batch_size=0 must be a positive integer"),
    row("sft.py", "sft.microbatch", 48, "sft.microbatch=48 does not divide the mini-batch"),
    row("sft.py", "sft.microbatch", 4, "sft.microbatch=4 must split over 8 batch shards"),
    row("sft.py", "sft.batch_size", 100,
        "sft.microbatch=128 does not divide the mini-batch (100 rows = sft.batch_size)"),
]


def _set(cfg, field, value):
  """Set a dotted field, whatever its type (a ConfigDict refuses a str where an int was)."""
  *path, key = field.split(".")
  node = cfg
  for name in path:
    node = node[name]
  with cfg.unlocked():
    if key in node:
      del node[key]
    node[key] = value


@pytest.fixture
def no_compilation():
  """Fails the test if JAX compiled anything while it ran."""
  events = []
  listener = lambda name, *a, **k: events.append(name) if "compile" in name else None  # noqa: E731
  jax.monitoring.register_event_duration_secs_listener(listener)
  yield
  jax.monitoring.unregister_event_duration_listener(listener)
  assert not events, events


def _path(value, folders):
  return str(folders / value) if isinstance(value, Folder) else value


@pytest.mark.parametrize("config, field, value, expect, also, name, workdir", BAD)
def test_bad_config_fails_naming_the_field(config, field, value, expect, also, name, workdir,
                                           folders, no_compilation):
  config_file = os.path.join(REPO, "configs", config)
  cfg = config_files.load(config_file)
  for f, v in also.items():
    _set(cfg, f, v)
  _set(cfg, field, _path(value, folders))
  with pytest.raises(ConfigError) as e:
    validate(cfg, config_file=config_file,
             workdir=_path(workdir, folders) if workdir else None)
  lines = [line for line in str(e.value).splitlines() if expect in line]
  assert lines, f"{expect!r} not in:\n{e.value}"
  assert name in lines[0], lines[0]
  printed = command_line.one_line(e.value)  # what the command line prints
  assert "\n" not in printed and printed.startswith("error: ") and expect in printed


def test_the_table_covers_every_section():
  fields = {p.values[1] for p in BAD}
  sections = {f.split(".")[0] for f in fields if "." in f}
  assert sections >= {"model", "mesh", "task", "rl", "critic", "rollout", "optim", "noise",
                      "target", "train", "eval", "init", "sft"}
  assert "critic.optim" in {f.rsplit(".", 1)[0] for f in fields}
  assert len(BAD) >= 60


def test_a_relative_sft_config_is_left_to_the_run_without_its_config_file():
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny"))
  cfg.init.sft_config = "configs/my_sft.py"  # may sit beside a config file validate is not told of
  validate(cfg)
  with pytest.raises(ConfigError, match="init.sft_config='configs/my_sft.py': config file"):
    validate(cfg, config_file="/elsewhere/configs/grpo.py")


def test_target_metrics_are_what_the_evaluation_reports():
  with open(os.path.join(REPO, "rlscale", "trainer", "evaluation.py")) as f:
    reported = set(re.findall(r'f"(eval/\w+_)\{name\}"', f.read()))
  assert len(reported) == 4
  assert set(EVAL_METRICS) == {k + m for k in reported for m in ("greedy", "sampled")}


# --- the command line, in this process (tests/support/cli.py) ------------------------------

def _cli(*args, cwd=REPO):
  from rlscale.run import main
  return run_in_process(main.run, list(args), cwd=cwd)


def _one_line_error(out, *expect):
  assert out.returncode == 2, out.stderr
  assert "Traceback" not in out.stderr, out.stderr
  errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and out.stderr.strip().endswith(errors[0]), out.stderr
  for text in expect:
    assert text in errors[0], errors[0]


CLI = [
    pytest.param(["--config.rl.num_promts=3"], ["--config.rl.num_promts", "rl.num_prompts?"],
                 id="unknown-key"),
    pytest.param(["--config.nosuch.x=3"], ["the config has no field 'nosuch'", "its fields:"],
                 id="unknown-section"),
    pytest.param(["--config=configs/nope.py"], ["--config:", "'configs/nope.py' not found"],
                 id="missing-config-file"),
    pytest.param(["--config=configs/grpo.py:bogus"], ["--config=", "config argument 'bogus'"],
                 id="config-argument"),
    pytest.param(["--config.rl.num_prompts=abc"], ["--config.rl.num_prompts=abc", "int()"],
                 id="bad-literal"),
]


@pytest.mark.parametrize("args, expect", CLI)
def test_command_line_mistakes_are_one_line(args, expect, tmp_path):
  out = _cli("--config=configs/grpo.py:tiny", *args, f"--workdir={tmp_path}/run")
  _one_line_error(out, *expect)
  assert not os.path.exists(tmp_path / "run")


def test_command_line_config_errors_before_the_run_directory(tmp_path):
  """Through JAX's start and validate(), with the config file and the run directory."""
  (tmp_path / "file").write_text("")
  out = _cli("--config=configs/grpo.py:tiny", "--config.train.keep_checkpoints=0",
             "--config.init.sft_config=nope.py", "--config.task.num_eval=0",
             f"--workdir={tmp_path}/file")
  _one_line_error(out, "train.keep_checkpoints=0", "init.sft_config='nope.py'",
                  "task.num_eval=0", f"--workdir='{tmp_path}/file' is a file")
  out = _cli("--config=configs/grpo.py:tiny", "--config.train.keep_checkpoints=0",
             f"--workdir={tmp_path}/run")
  _one_line_error(out, "train.keep_checkpoints=0 must be a positive integer")
  assert not os.path.exists(tmp_path / "run")


def test_a_run_directory_the_system_refuses_is_one_line(tmp_path):
  """/proc passes the writable check (for root) and refuses the directory: one line."""
  out = _cli("--config=configs/grpo.py:tiny", f"--config.init.cache_dir={tmp_path}/cache",
             "--workdir=/proc/rlscale-test")
  _one_line_error(out, "/proc/rlscale-test: No such file or directory")
  assert not os.path.exists(tmp_path / "cache")  # refused before the base policy


def test_verbose_shows_the_traceback():
  out = _cli("--config=configs/grpo.py:tiny", "--config.rl.num_promts=3", "--verbose")
  assert out.returncode != 0 and "Traceback" in out.stderr and "num_promts" in out.stderr


def test_a_complete_hf_folder_is_accepted(tmp_path):
  """config.json, tokenizer.json and weights: what the folder checks ask for is enough."""
  folder = tmp_path / "hf"
  shutil.copytree(FIXTURE, folder)
  (folder / "tokenizer.json").write_text("{}")  # read only when the run builds its task
  cfg = config_files.load(os.path.join(REPO, "configs", "ppo.py:tiny"))
  cfg.model.hf_checkpoint = cfg.init.hf_checkpoint = cfg.critic.hf_checkpoint = str(folder)
  validate(cfg)


def test_a_misspelled_allowed_change_and_an_empty_workdir_are_errors(tmp_path):
  """Neither is ignored: a field --allow_config_change names must exist, and --workdir= (empty)
  is not the default run directory."""
  out = _cli("--config=configs/grpo.py:tiny", "--allow_config_change=train.num_step",
             f"--workdir={tmp_path}/run")
  _one_line_error(out, "--allow_config_change='train.num_step' is not a field of the config",
                  "did you mean train.num_steps?")
  assert not os.path.exists(tmp_path / "run")
  out = _cli("--config=configs/grpo.py:tiny", "--workdir=", cwd=tmp_path)
  _one_line_error(out, "--workdir='' must name a directory")
  assert not os.path.exists(tmp_path / "runs")
