"""PPO-ptx: the demonstrations' NLL gradient is added to the policy's, scaled by ptx_coef."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlscale import models
from rlscale.rl import ptx
from rlscale.rl.policy_loss import make_policy_loss
from rlscale.rl.update import SequenceBatch, TrainState, UpdateOptions, make_update, policy_forward

RL = dict(clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=0.0, kl_estimator="k3", entropy_coef=0.0,
          dual_clip=0.0)
CFG = models.ModelConfig(family="llama", vocab_size=32, d_model=32, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=16, mlp_dim=64)


def _rows(rows, seed, prompt=5, resp=6):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(3, CFG.vocab_size, (rows, prompt + resp)).astype(np.int32)
  resp_mask = np.arange(resp)[None] < rng.integers(1, resp + 1, (rows, 1))
  mask = np.ones_like(tokens, bool)
  mask[:, prompt:] = resp_mask
  extras = {"advantages": rng.normal(size=rows).astype(np.float32),
            "old_logp": (-2 + 0.1 * rng.normal(size=(rows, resp))).astype(np.float32)}
  return SequenceBatch(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(resp_mask),
                       {k: jnp.asarray(v) for k, v in extras.items()})


def _step(mesh, rules, loss, batch, coef=None, demos=None, minibatches=1):
  """Parameters after one SGD(1) update (they move by minus the gradient), and its metrics."""
  graphdef, params = nnx.split(models.CausalLM(CFG, rngs=nnx.Rngs(params=0)))
  opt = optax.sgd(1.0)
  update = make_update(policy_forward(graphdef), opt, loss,
                       UpdateOptions(num_minibatches=minibatches, num_epochs=1,
                       microbatch=batch.tokens.shape[0] // minibatches, aggregation="token-mean",
                       max_len=6, shuffle=False, ptx=None if coef is None else (coef, ptx.nll)),
                       mesh=mesh, rules=rules)
  state = update.place(TrainState(params, opt.init(params), jnp.zeros((), jnp.int32)))
  before = jax.device_get(params)  # the update donates the state
  state, metrics = update(state, batch, jax.random.key(0), False, demos)
  return before, jax.device_get(state.params), jax.device_get(metrics)


@pytest.mark.slow  # heavy for the default run (README); .ci/run runs it
def test_the_update_adds_coef_times_the_demonstrations_nll_gradient(mesh1, rules):
  batch, demos = _rows(8, 0), _rows(4, 1)
  p0, rl_only, m_rl = _step(mesh1, rules, make_policy_loss(RL), batch)
  _, nll_only, m_nll = _step(mesh1, rules, ptx.nll, demos)  # token-mean NLL of the demos alone
  _, mixed, m = _step(mesh1, rules, make_policy_loss(RL), batch, coef=0.3, demos=demos)
  expected = jax.tree.map(lambda a, b, c: b + 0.3 * (c - a), p0, rl_only, nll_only)
  for got, want in zip(jax.tree.leaves(mixed), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
  # Logged apart: the NLL, the norm of its gradient, and the RL gradient's own norm.
  np.testing.assert_allclose(m["ptx_nll"], m_nll["loss"], rtol=1e-6)
  np.testing.assert_allclose(m["ptx_grad_norm"], m_nll["grad_norm"], rtol=1e-5)
  np.testing.assert_allclose(m["grad_norm_rl"], m_rl["grad_norm"], rtol=1e-5)
  np.testing.assert_allclose(m["loss"], m_rl["loss"], rtol=1e-6)  # the policy loss alone
  assert m["grad_norm"] != pytest.approx(m_rl["grad_norm"])  # the clipped norm is of the sum


@pytest.mark.slow  # over 10 s on 2 cores; .ci/run runs it
def test_each_optimizer_step_takes_its_own_block_of_demonstrations(mesh1, rules):
  # Two mini-batches: step 1 trains on demo rows 0-1, step 2 on rows 2-3. Swapping the blocks
  # changes the result; a coef of 0 gives the RL update exactly.
  batch, demos = _rows(8, 0), _rows(4, 1)
  swap = jax.tree.map(lambda x: jnp.concatenate([x[2:], x[:2]]), demos)
  _, a, _ = _step(mesh1, rules, make_policy_loss(RL), batch, 0.5, demos, minibatches=2)
  _, b, _ = _step(mesh1, rules, make_policy_loss(RL), batch, 0.5, swap, minibatches=2)
  assert any(not np.allclose(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  _, zero, _ = _step(mesh1, rules, make_policy_loss(RL), batch, 0.0, demos, minibatches=2)
  _, rl, _ = _step(mesh1, rules, make_policy_loss(RL), batch, minibatches=2)
  for x, y in zip(jax.tree.leaves(zero), jax.tree.leaves(rl)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("coef,rows,unit,match", [
    (-0.1, 8, 1, "rl.ptx_coef=-0.1 must be a number >= 0"),
    (0.5, 6, 4, "rl.ptx_rows=6 must be a positive multiple of 4"),
    (0.5, 0, 1, "rl.ptx_rows=0"),
])
def test_bad_ptx_fields_are_named(coef, rows, unit, match):
  errors = ptx.check({"ptx_coef": coef, "ptx_rows": rows}, unit)
  assert len(errors) == 1 and match in errors[0]
  assert ptx.check({"ptx_coef": 0.0, "ptx_rows": 6}, 4) == []  # off: rows are not used


def test_demo_files_give_prompt_and_response_rows_and_skip_long_prompts(tmp_path, mesh1, rules):
  import json
  from rlscale.checkpoints.tokenizer import HFTokenizer
  from rlscale.config.sections import task as task_config
  from rlscale.tasks.files import FileTask, demonstration_pairs
  from tests.support.tiny_tokenizer import make_tokenizer_folder
  tok = HFTokenizer(make_tokenizer_folder(str(tmp_path / "tok")))
  train = tmp_path / "train.jsonl"
  train.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"})
                           + "\n" for i in range(8)))
  demos = tmp_path / "demos.jsonl"
  rows = [{"question": f"Add {i} and 2.", "response": f"{i} + 2 = {i + 2}"} for i in range(6)]
  rows.append({"question": "long " * 400, "response": "never used"})
  demos.write_text("".join(json.dumps(r) + "\n" for r in rows))
  cfg = task_config("files")
  cfg.train_files, cfg.eval_fraction, cfg.demo_files, cfg.max_prompt_len = (
      str(train), 0.25, str(demos), 64)
  task = FileTask(cfg, tok)
  pairs = demonstration_pairs(cfg, task)
  assert sorted(text for _, text in pairs) == sorted(r["response"] for r in rows[:6])
  assert all(p.question == f"Add {t.split()[0]} and 2." for p, t in pairs)  # rows stay whole
  d = ptx.Demonstrations(task, rows=4, max_new_tokens=12, mesh=mesh1, rules=rules, source=pairs)
  batch = d.batch(first_opt_step=1, opt_steps=2)  # stream rows 4..11: wrap around the 6
  assert batch.tokens.shape == (8, 64 + 12) and batch.resp_mask.shape == (8, 12)
  first = [tok.decode(np.asarray(batch.tokens)[i, 64:][np.asarray(batch.resp_mask)[i]])
           for i in range(8)]
  want = [pairs[i % 6][1] for i in range(4, 12)]
  assert [f.replace("<|im_end|>", "") for f in first] == want  # demo + EOS, in stream order
