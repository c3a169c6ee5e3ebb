"""A user's Hugging Face folder, damaged one way at a time: each is refused by the resolve step,
before anything is compiled or loaded, with one message naming the folder's field and what is
wrong (the file, the tensor, the field); NaN weights are refused as they load."""

import json
import os
import shutil

import numpy as np
import pytest

from tests.support import FIXTURES, REPO
from tests.support.cli import run_in_process
from tests.support.tiny_tokenizer import make_tokenizer_folder
from rlscale.checkpoints import safetensors_io
from rlscale.config import files as config_files
from rlscale.config.errors import ConfigError
from rlscale.resolve.resolved import validate

VOCAB = 320  # the tokenizer's 300 ids, rounded up as checkpoints do
ROWS = [{"problem": f"What is {i} + {i + 3}?", "solution": f"#### {2 * i + 3}"}
        for i in range(12)]


def _tensors(folder) -> dict[str, np.ndarray]:
  f = safetensors_io.SafetensorsFolder(str(folder))
  return {n: np.array(f.get(n)) for n in f.keys()}


def _write(folder, tensors) -> None:
  for n in os.listdir(folder):
    if n.endswith(".safetensors"):
      os.remove(os.path.join(folder, n))
  safetensors_io.write(os.path.join(folder, "model.safetensors"), tensors)


def _edit_json(folder, name, **fields) -> None:
  path = os.path.join(folder, name)
  with open(path) as f:
    d = json.load(f)
  for k, v in fields.items():
    if v is None:
      d.pop(k)
    else:
      d[k] = v
  with open(path, "w") as f:
    json.dump(d, f)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
  """A complete folder: the qwen3 fixture with a tokenizer and its vocabulary widened to it."""
  root = tmp_path_factory.mktemp("hf")
  folder = root / "good"
  shutil.copytree(os.path.join(FIXTURES, "hf", "qwen3"), folder)
  tok = make_tokenizer_folder(str(root / "tok"))
  for n in os.listdir(tok):
    shutil.copy(os.path.join(tok, n), folder)
  tensors = _tensors(folder)
  for n in _VOCAB_ROWS:
    if n in tensors:
      t = tensors[n]
      tensors[n] = np.concatenate([t, np.zeros((VOCAB - len(t),) + t.shape[1:], t.dtype)])
  _write(folder, tensors)
  _edit_json(folder, "config.json", vocab_size=VOCAB)
  with open(root / "train.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in ROWS)
  return folder


def _cfg(folder, kind="grpo.py", train=None):
  cfg = config_files.load(os.path.join(REPO, "configs", f"{kind}:tiny"))
  with cfg.unlocked():
    cfg.model.hf_checkpoint = cfg.init.hf_checkpoint = str(folder)
    if "critic" in cfg:
      cfg.critic.hf_checkpoint = str(folder)
    cfg.task.name = "files"
    cfg.task.train_files = train or os.path.join(os.path.dirname(folder), "train.jsonl")
    cfg.task.prompt_field, cfg.task.answer_field, cfg.task.eval_fraction = (
        "problem", "solution", 0.25)
  return cfg


def _truncate_header(folder):
  path = folder / "model.safetensors"
  path.write_bytes(path.read_bytes()[:40])


def _truncate_data(folder):
  path = folder / "model.safetensors"
  data = path.read_bytes()
  path.write_bytes(data[:len(data) - 64])


def _tensor_edit(edit):
  def damage(folder):
    tensors = _tensors(folder)
    edit(tensors)
    _write(folder, tensors)
  return damage


def _reshape(t):
  w = t["model.layers.0.mlp.up_proj.weight"]
  t["model.layers.0.mlp.up_proj.weight"] = w[:-1]


def _extra_layer(t):
  t.update({n.replace("layers.1.", "layers.2."): v for n, v in list(t.items())
            if ".layers.1." in n})


_VOCAB_ROWS = ("model.embed_tokens.weight", "lm_head.weight")


DAMAGE = {
    "truncated header": (_truncate_header, "model.safetensors: header length"),
    "offsets past the data": (_truncate_data, "do not fit its size"),
    "a tensor of the wrong shape": (
        _tensor_edit(_reshape),
        "1 tensor(s) of the wrong shape: model.layers.0.mlp.up_proj.weight is"),
    "a missing tensor": (
        _tensor_edit(lambda t: t.pop("model.layers.1.self_attn.k_proj.weight")),
        "lacks 1 tensor(s) the model needs: model.layers.1.self_attn.k_proj.weight"),
    "an extra layer": (_tensor_edit(_extra_layer), "tensor(s) its config.json has no place for "
                       "(num_hidden_layers=2): model.layers.2."),
    "an integer tensor": (
        _tensor_edit(lambda t: t.update({"model.norm.weight":
                                         t["model.norm.weight"].astype(np.int32)})),
        "non-float dtype: model.norm.weight (int32)"),
    "config.json missing a field": (
        lambda f: _edit_json(f, "config.json", hidden_size=None),
        "config.json (qwen3) lacks the field 'hidden_size'"),
    "config.json of another size": (
        lambda f: _edit_json(f, "config.json", intermediate_size=48),
        "of the wrong shape"),
    "config.json not an object": (
        lambda f: (f / "config.json").write_text("[1, 2]"), "holds a list, not a JSON object"),
    "a vocabulary smaller than the tokenizer's": (
        lambda f: (_edit_json(f, "config.json", vocab_size=256),
                   _tensor_edit(lambda t: t.update({n: t[n][:256] for n in _VOCAB_ROWS if n in t}))(f)),
        "model.vocab_size=256 is smaller than the task's vocabulary"),
    "a stop id past the vocabulary": (
        lambda f: _edit_json(f, "generation_config.json", eos_token_id=[5000]),
        "eos_token_id [5000] is not token ids in [0, 300)"),
    "config.json's pad id past the vocabulary": (
        lambda f: _edit_json(f, "config.json", pad_token_id=VOCAB),
        f"config.json's pad_token_id={VOCAB} is outside the vocabulary"),
    "tokenizer.json not a tokenizer": (
        lambda f: (f / "tokenizer.json").write_text('{"model": 3}'),
        "tokenizer.json: cannot be read by tokenizers"),
    "a chat template that raises": (
        lambda f: _edit_json(f, "tokenizer_config.json",
                             chat_template="{{ raise_exception('no system role') }}"),
        "no system role"),
    "a chat template that is not Jinja": (
        lambda f: _edit_json(f, "tokenizer_config.json", chat_template="{% for %}"),
        "chat template"),
}


@pytest.mark.parametrize("name", DAMAGE)
def test_a_damaged_folder_is_one_error_naming_it(name, good, tmp_path):
  damage, expect = DAMAGE[name]
  folder = tmp_path / "hf"
  shutil.copytree(good, folder)
  damage(folder)
  with pytest.raises(ConfigError) as e:
    validate(_cfg(folder, train=str(good.parent / "train.jsonl")))
  assert expect in str(e.value), str(e.value)
  assert str(folder) in str(e.value) or "vocab_size=256" in expect, str(e.value)


def test_the_good_folder_passes_for_a_policy_and_a_critic(good):
  validate(_cfg(good))
  validate(_cfg(good, "ppo.py"))


def test_a_folder_of_another_model_than_the_run_is_refused(good, tmp_path):
  """init.hf_checkpoint must hold the model the run planned for (model.hf_checkpoint's)."""
  other = tmp_path / "other"
  shutil.copytree(good, other)
  _edit_json(other, "config.json", num_hidden_layers=1)
  t = {n: v for n, v in _tensors(other).items() if ".layers.1." not in n}
  _write(other, t)
  cfg = _cfg(good)
  cfg.init.hf_checkpoint = str(other)
  with pytest.raises(ConfigError, match=r"init.hf_checkpoint=.*its config.json is another model: "
                     r"num_layers=1 \(the run's model: 2\)"):
    validate(cfg)


def test_nan_weights_are_refused_as_they_load_naming_the_tensor(good, tmp_path):
  """Finite values are checked by one reduction per tensor as it loads, not found at step 1."""
  from rlscale.checkpoints import hf
  from rlscale.parallel import sharding
  folder = tmp_path / "nan"
  shutil.copytree(good, folder)
  tensors = _tensors(folder)
  w = tensors["model.layers.1.self_attn.v_proj.weight"]
  w[0, 0] = np.nan
  _write(folder, tensors)
  validate(_cfg(folder, train=str(good.parent / "train.jsonl")))  # the headers are fine
  mesh = sharding.make_mesh((-1, 1, 1))
  rules = sharding.rules_from_config(None)
  with pytest.raises(ConfigError, match="'model.layers.1.self_attn.v_proj.weight' holds NaN"):
    hf.load_policy(str(folder), mesh, rules)
  hf.load_policy(str(good), mesh, rules)


def test_the_command_line_prints_one_line_and_exits_2(good, tmp_path):
  from rlscale.run import main
  folder = tmp_path / "hf"
  shutil.copytree(good, folder)
  _tensor_edit(_reshape)(folder)
  args = [f"--config={REPO}/configs/grpo.py:tiny", f"--workdir={tmp_path}/run",
          f"--config.model.hf_checkpoint={folder}", f"--config.init.hf_checkpoint={folder}",
          "--config.task.name=files", "--config.task.prompt_field=problem",
          "--config.task.answer_field=solution", "--config.task.eval_fraction=0.25",
          f"--config.task.train_files={os.path.dirname(good)}/train.jsonl"]
  out = run_in_process(main.run, args)
  assert out.returncode == 2, out.stderr[-2000:]
  errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "wrong shape" in errors[0], out.stderr[-2000:]
  assert "Traceback" not in out.stderr
  out = run_in_process(main.run, args + ["--verbose"])  # the traceback, for a bug report
  assert out.returncode != 0 and "Traceback" in out.stderr and "wrong shape" in out.stderr
