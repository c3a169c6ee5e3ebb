"""Memory for real sizes: log-probs over vocabulary chunks, block rematerialization, float32
optimizer moments, the memory bound of the automatic micro-batch and the per-phase report."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from tests.support import filled_optim as fill_optim
from rlscale import models
from rlscale.plan import batch
from rlscale.metrics import memory_report
from rlscale.rl import optim
from rlscale.parallel import sharding
from rlscale.models import memory
from rlscale.rl.update import SequenceBatch, policy_forward

# float32 throughout: the chunked sums differ from the whole-vocabulary ones in order only.
ATOL, RTOL = 1e-5, 1e-5


def _inputs(v=50, e=16, b=2, n=5, seed=0, dtype=jnp.float32):
  k = jax.random.split(jax.random.key(seed), 3)
  hidden = jax.random.normal(k[0], (b, n, e)).astype(dtype)
  head = (0.5 * jax.random.normal(k[1], (e, v))).astype(dtype)
  targets = jax.random.randint(k[2], (b, n), 0, v)
  return hidden, head, targets


def _value_and_grads(hidden, head, targets, chunk, vocab_first=False):
  def loss(h, w):
    logp, ent = memory.logprobs_and_entropy(h, w, targets, chunk, vocab_first)
    return jnp.sum(0.3 * logp) + jnp.sum(0.7 * ent), (logp, ent)
  (_, (logp, ent)), grads = jax.value_and_grad(loss, (0, 1), has_aux=True)(hidden, head)
  return logp, ent, grads[0], grads[1]


@pytest.mark.parametrize("vocab_first", [False, True])
@pytest.mark.parametrize("v,chunk", [(53, 1), (53, 7), (53, 16), (53, 52), (50, 16), (50, 25)])
def test_chunked_logprobs_match_the_whole_vocabulary(v, chunk, vocab_first):
  """Values and gradients w.r.t. hidden and head; V=53 (prime) is padded for every chunk but
  1, V=50 is cut into 5 chunks of 10 and 2 of 25 (memory.chunk_columns)."""
  assert (memory.chunk_columns(53, 16), memory.chunk_columns(50, 16)) == (16, 10)
  hidden, head, targets = _inputs(v=v)
  if vocab_first:
    head = head.T
  want = _value_and_grads(hidden, head, targets, 0, vocab_first)
  got = _value_and_grads(hidden, head, targets, chunk, vocab_first)
  for name, g, w in zip(("logp", "entropy", "d_hidden", "d_head"), got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=ATOL, rtol=RTOL, err_msg=name)
  assert float(jnp.max(want[1])) <= np.log(v) + 1e-5  # an entropy, in nats


def test_bf16_activations_give_float32_logprobs():
  hidden, head, targets = _inputs(v=300, e=32, dtype=jnp.bfloat16)
  whole = memory.logprobs_and_entropy(hidden, head, targets, 0)
  chunked = memory.logprobs_and_entropy(hidden, head, targets, 64)
  assert all(x.dtype == jnp.float32 for x in whole + chunked)
  # the same bf16 products summed in float32 in another order
  for g, w in zip(chunked, whole):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-4)


def _small_model(**kw):
  shape = dict(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2,
               head_dim=8, mlp_dim=64)
  shape.update(kw)
  return models.named("tiny", **shape)


def _batch(cfg, b=8, t=12, n=6, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, cfg.vocab_size, (b, t)).astype(np.int32)
  mask = np.ones((b, t), bool)
  mask[1, :3] = False  # a left-padded prompt
  resp = np.ones((b, n), bool)
  resp[2, 4:] = False
  return SequenceBatch(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(resp), {})


def _forward_grads(graphdef, params, mb, chunk, remat, mesh=None, rules=None):
  fwd = policy_forward(graphdef, chunk=chunk, remat=remat)

  def loss(p, mb):
    with sharding.activation_sharding(mesh, rules):
      inp = fwd(p, mb)
    return jnp.sum(inp.logp * mb.resp_mask) + 0.1 * jnp.sum(inp.entropy), (inp.logp, inp.entropy)

  (_, (logp, ent)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, mb)
  return logp, ent, grads


def _assert_close(got, want, atol=ATOL, rtol=RTOL):
  logp, ent, grads = got
  np.testing.assert_allclose(np.asarray(logp), np.asarray(want[0]), atol=atol, rtol=rtol)
  np.testing.assert_allclose(np.asarray(ent), np.asarray(want[1]), atol=atol, rtol=rtol)
  for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want[2])):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=atol, rtol=rtol)


@pytest.mark.slow  # over 10 s on 2 cores; .ci/run runs it
@pytest.mark.parametrize("tied", [True, False])
def test_sharded_chunked_forward_matches_unsharded(tied, rules):
  """Mesh (data, fsdp, tensor) = (2, 2, 2): the head's vocabulary over `tensor`, its embed
  axis over `fsdp`, the rows over data x fsdp; chunks of 16 columns, blocks rematerialized."""
  cfg = _small_model(tie_embeddings=tied)
  graphdef, params = nnx.split(models.CausalLM(cfg, rngs=nnx.Rngs(params=3)))
  mb = _batch(cfg)
  want = _forward_grads(graphdef, params, mb, 0, "none")
  mesh = sharding.make_mesh((2, 2, 2))
  shardings = sharding.state_shardings(nnx.state(models.abstract_model(models.CausalLM, cfg)[1]),
                                       mesh, rules)
  sharded = jax.device_put(params, shardings)
  head = sharded["model"]["embed"] if tied else sharded["lm_head"]
  assert "tensor" in str(head.get_value().sharding.spec)  # the vocabulary axis is split
  mb_sh = jax.device_put(mb, jax.tree.map(lambda x: sharding.batch_sharding(mesh, x.ndim, rules),
                                          mb))
  _assert_close(_forward_grads(graphdef, sharded, mb_sh, 16, "full", mesh, rules), want)


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_gives_the_same_gradients(remat):
  cfg = _small_model(tie_embeddings=False)
  graphdef, params = nnx.split(models.CausalLM(cfg, rngs=nnx.Rngs(params=4)))
  mb = _batch(cfg, seed=1)
  want = _forward_grads(graphdef, params, mb, 0, "none")
  _assert_close(_forward_grads(graphdef, params, mb, 0, remat), want)


def _step_temp(cfg, chunk, remat, b=4, t=64, n=32) -> int:
  """Temporary bytes of a compiled training step's gradient (XLA's memory analysis)."""
  graphdef, params = nnx.split(models.CausalLM(cfg, rngs=nnx.Rngs(params=0)))
  fwd = policy_forward(graphdef, chunk=chunk, remat=remat)
  mb = SequenceBatch(jnp.ones((b, t), jnp.int32), jnp.ones((b, t), bool),
                     jnp.ones((b, n), bool), {})

  def loss(p):
    inp = fwd(p, mb)
    return jnp.sum(inp.logp) + jnp.sum(inp.entropy)

  return memory_report.lowered_memory(jax.jit(jax.grad(loss)), params)["temp"]


def test_chunking_cuts_the_training_step_temporaries():
  """V=32768: the whole-vocabulary step holds [4, 32, V] float32 logits (16.8 MB) several
  times; chunks of 4096 columns must need under half its temporaries (measured: ~0.22x)."""
  cfg = _small_model(vocab_size=32768, d_model=64, num_heads=2, num_kv_heads=1, head_dim=32,
                     mlp_dim=128)
  whole, chunked = _step_temp(cfg, 0, "none"), _step_temp(cfg, 4096, "none")
  print(f"temp bytes: whole vocabulary {whole}, chunks of 4096 {chunked} "
        f"({chunked / whole:.2f}x)")
  assert chunked < 0.5 * whole


@pytest.mark.slow  # over 10 s on 2 cores; .ci/run runs it
def test_remat_cuts_the_training_step_temporaries():
  """4 blocks at 8 x 128 tokens: remat=full keeps one block's input each and must need under
  60% of remat=none's temporaries (measured: ~0.3x); dots no more than none."""
  cfg = _small_model(vocab_size=64, d_model=128, num_layers=4, head_dim=32, mlp_dim=512)
  temps = {r: _step_temp(cfg, 0, r, b=8, t=128, n=64) for r in ("none", "dots", "full")}
  print("temp bytes by train.remat:", temps)
  assert temps["full"] < 0.6 * temps["none"]
  assert temps["dots"] <= temps["none"]


def test_unknown_settings_are_refused_naming_the_field():
  from rlscale.config import schema, typed
  assert schema.Train.memory_errors({"remat": "none", "logprob_chunk": 8192}) == []
  errors = schema.Train.memory_errors({"remat": "some", "logprob_chunk": -1})
  assert "train.remat='some'" in errors[0] and "train.logprob_chunk=-1" in errors[1]
  with pytest.raises(ValueError, match="train.remat='everything'"):
    policy_forward(None, remat="everything")
  with pytest.raises(ValueError, match="train.logprob_chunk=1.5"):
    policy_forward(None, chunk=1.5)
  from rlscale.config import files as config_files
  cfg = config_files.load("configs/grpo.py")
  cfg.train.remat = "sometimes"
  assert "train.remat='sometimes'; known: none, full, dots" in typed.check(cfg.to_dict()).errors


def test_float32_moments_for_bf16_parameters():
  params = {"w": jnp.ones((4, 3), jnp.bfloat16), "b": jnp.zeros((3,), jnp.bfloat16)}
  grads = jax.tree.map(lambda x: jnp.full_like(x, 1e-3), params)
  for state_dtype, moments in (("", jnp.bfloat16), ("float32", jnp.float32)):
    section = fill_optim({"lr": 1e-2, "state_dtype": state_dtype, "grad_clip": 1.0})
    opt, _ = optim.make(section, batch=8,
                        total_responses=80, responses_per_step=8)
    state = opt.init(params)
    adam = next(s for s in state if hasattr(s, "hyperparams"))
    mu, nu = adam.inner_state[0].mu, adam.inner_state[0].nu
    assert all(x.dtype == moments for x in jax.tree.leaves((mu, nu))), state_dtype
    dtypes = jax.tree.map(lambda x: x.dtype, state)
    for g in (grads, jax.tree.map(lambda x: x.astype(jnp.float32), grads)):  # bf16, accumulated
      # Each leaf of the state keeps its dtype: the update's loop over optimizer steps carries
      # it (it failed on bf16 parameters with '' before the moments were stored back).
      _, after = opt.update(g, state, params)
      assert jax.tree.map(lambda x: x.dtype, after) == dtypes, state_dtype
    updates, state = opt.update(grads, state, params)
    if state_dtype:  # computed in float32, cast back to the gradients' dtype
      assert all(u.dtype == jnp.bfloat16 for u in jax.tree.leaves(updates))
    # float32 hyperparameters (in bf16, b2=0.999 rounds to 1 and every update was NaN)
    assert float(optim.hyperparams(state)["b2"]) == pytest.approx(0.999)
    new = optax.apply_updates(params, updates)
    assert 0.98 < float(new["w"][0, 0]) < 1.0  # a step of about lr was taken
  from rlscale.config import schema
  section = schema.with_defaults(schema.Optim, {"lr": 1.0, "state_dtype": "bfloat16"})
  assert schema.Optim.check(section, {}, "critic.optim") == [
      "critic.optim.state_dtype='bfloat16'; known: '' (the parameters' dtype), 'float32'"]


def test_activation_estimate_and_the_memory_bound():
  m = models.named("qwen2.5-0.5b")
  est = {(c, r): memory.activation_bytes_per_token(m, 384, r, c)
         for c in (0, 8192) for r in ("none", "dots", "full")}
  print({k: f"{v / 2**10:.0f} KiB" for k, v in est.items()})
  assert est[8192, "full"] < est[8192, "dots"] < est[8192, "none"] < est[0, "none"]
  assert est[0, "none"] - est[8192, "none"] == 16 * (m.vocab_size - 8192)
  assert batch.micro_rows_cap(1000, memory_tokens=5000) == (5, "memory")
  assert batch.micro_rows_cap(1000, memory_tokens=10**9) == (16, "token cap")
  assert batch.micro_rows_cap(10) == (64, "row cap")
  mem = batch.TrainMemory({"actor": 1 << 20}, budget=4 << 30, resident=1 << 30, source="test")
  assert mem.max_tokens("actor") == 4096
  from rlscale.config import files as config_files
  cfg = config_files.load("configs/grpo.py")
  p = batch.plan(cfg, shards=1, seq_len=1024, memory=mem)
  a = p.models["actor"]
  assert a.microbatch == 4 and a.microbatch_bound == "memory"  # 4096 tokens of 1024
  assert "micro-batch 4 (auto: memory)" in p.summary_line()
  assert p.describe()["train_memory"]["budget"] == 4 << 30


def test_memory_report_of_a_compiled_call_and_phases():
  x = jnp.ones((512, 64))
  f = jax.jit(jax.grad(lambda w: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w.T))))
  rec = memory_report.Recorder(f)
  assert rec.memory() == {}
  rec(jnp.ones((64, 256)))
  m = rec.memory()
  assert m["arguments"] == 64 * 256 * 4 and m["outputs"] == 64 * 256 * 4
  assert m["temp"] >= 512 * 256 * 4  # the [512, 256] activations the backward pass reads
  assert m["total"] == m["arguments"] + m["outputs"] + m["temp"] - m["alias"] + m["code"]
  phases = memory_report.PhaseMemory()

  class Work:
    def run(self, n):
      return jnp.ones((n, n)).sum()

  w = Work()
  phases.wrap(w, "run", "work")
  assert float(w.run(512)) == 512 * 512
  fig = phases.figures()["work"]
  assert fig["host_peak_rss_gb"] > 0
  assert memory_report.host_peak_rss() >= fig["host_peak_rss_gb"] * memory_report.GIB
