"""Golden numbers of one GRPO and one PPO update: numeric drift caught in seconds.

The shipped tiny configs (configs/grpo.py:tiny, configs/ppo.py:tiny) on the 8 simulated CPU
devices, a randomly initialised policy (seed 0), and a fixed synthetic step: prompts and
responses drawn from a seeded generator, ragged response lengths, rewards that differ within
every group (so advantages are not zero), sampler log-probs near the policy's. One step of the
algorithm's own prepare + update runs; its metrics and a checksum of the updated weights are
compared with the values below, which were recorded with this code and checked identical on
the code before the package was restructured (benchmarks/same_numbers.py for whole runs).

Tolerance: rtol 2e-5 (float32; the reductions' order may differ between CPU instruction sets
and XLA versions, which moves the last few bits). A change of the loss, the advantages, the
aggregation, the clipping, the optimizer or the model moves these numbers by far more. To
record new values after an intended change:
XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
    python -m tests.unit.rl.test_golden_step
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlscale import models
from rlscale.checkpoints import hf
from rlscale.config import files as config_files
from rlscale.resolve import resolved
from rlscale.rl import algorithm
from rlscale.rl.update import SequenceBatch

RTOL = 2e-5

# Recorded at 8 simulated CPU devices (jax 0.10.2); identical at the code before the restructure.
GOLDEN = {
    "grpo": {
        'actor/approx_kl': 0.9931375980377197,
        'actor/clip_frac': 0.44186049699783325,
        'actor/entropy': 3.439286708831787,
        'actor/grad_norm': 0.29514744877815247,
        'actor/grad_norm_max': 0.29514744877815247,
        'actor/loss': 0.19452393054962158,
        'actor/noise/grad_sq_big': 0.08711200952529907,
        'actor/noise/grad_sq_small': 0.15464234352111816,
        'actor/pg_loss': 0.19452393054962158,
        'actor/ratio': 0.27168774604797363,
        'actor/param_abs_sum': 1531.58154296875,
    },
    "ppo": {
        'actor/approx_kl': 0.9931375980377197,
        'actor/clip_frac': 0.3488371968269348,
        'actor/entropy': 3.439286708831787,
        'actor/grad_norm': 0.4306020140647888,
        'actor/grad_norm_max': 0.4306020140647888,
        'actor/loss': 0.25037267804145813,
        'actor/noise/grad_sq_big': 0.18541809916496277,
        'actor/noise/grad_sq_small': 0.338049054145813,
        'actor/pg_loss': 0.25037267804145813,
        'actor/ratio': 0.27168774604797363,
        'critic/grad_norm': 5.267715930938721,
        'critic/grad_norm_max': 5.267715930938721,
        'critic/loss': 0.28884512186050415,
        'critic/noise/grad_sq_big': 27.74883270263672,
        'critic/noise/grad_sq_small': 30.8441219329834,
        'critic/value_abs_error': 0.6508866548538208,
        'critic/value_clip_frac': 0.0,
        'critic/value_loss': 0.28884512186050415,
        'critic/value_mean': 0.0742691308259964,
        'actor/param_abs_sum': 1531.625732421875,
        'critic/param_abs_sum': 1532.798583984375,
    },
}


def _run(spec: str, folder: str) -> resolved.Resolved:
  cfg = config_files.load(spec)
  cfg.rollout.generation_batch = cfg.rl.num_prompts * cfg.rl.group_size  # no memory fit
  return resolved.resolve(cfg, None).with_base(folder)  # the base is written below


def one_step(spec: str, folder: str) -> dict[str, float]:
  """The metrics of one update of `spec`'s algorithm on the fixed synthetic step."""
  run = _run(spec, folder)
  env, plan = run.setup, run.plan
  policy = models.create_sharded(models.CausalLM, env.model_cfg, env.mesh, env.rules,
                                 jax.random.key(0))
  if not os.path.exists(os.path.join(folder, "config.json")):
    hf.save_policy(policy, folder, pad_id=env.task.tokenizer.pad_id)  # PPO's critic starts here
  graphdef, params = nnx.split(policy)
  algo = algorithm.build(algorithm.Context(run.cfg, plan, env, graphdef, params, folder))
  rows, prompt, resp = plan.responses, env.task.max_prompt_len, run.cfg.rollout.max_new_tokens
  rng = np.random.default_rng(0)
  vocab = env.task.tokenizer.vocab_size
  tokens = rng.integers(3, vocab, (rows, prompt + resp)).astype(np.int32)
  mask = np.ones_like(tokens, bool)
  mask[:, :prompt // 2] = rng.random((rows, prompt // 2)) < 0.3  # some left padding
  resp_mask = np.arange(resp)[None] < rng.integers(1, resp + 1, (rows, 1))  # ragged lengths
  mask[:, prompt:] = resp_mask
  g = plan.group_size
  scores = (np.arange(rows) % g < (np.arange(rows) // g) % g + 1).astype(np.float32)  # varied
  sample_logp = (-2.0 + 0.1 * rng.normal(size=(rows, resp))).astype(np.float32)
  from rlscale.parallel import sharding
  put = lambda x: sharding.put_batch(x, env.mesh, env.rules)  # noqa: E731
  batch = SequenceBatch(put(tokens), put(mask), put(resp_mask), {})
  algo.prepare(batch, put(sample_logp), put(scores))
  step = run.cfg.critic.warmup_steps + 1 if "critic" in run.cfg else 1  # PPO: the actor too
  _, metrics = algo.update(batch, jax.random.key(1), step, False)
  out = {}
  for name, m in jax.device_get(metrics).items():
    out.update({f"{name}/{k}": float(v) for k, v in m.items()})
  for name, model in algo.models.items():
    leaves = jax.tree.leaves(model.state.params)
    out[f"{name}/param_abs_sum"] = float(sum(jnp.abs(x.astype(jnp.float32)).sum() for x in leaves))
  return out


def _check(got: dict[str, float], want: dict[str, float]) -> None:
  missing = sorted(set(want) - set(got))
  assert not missing, f"metrics no longer reported: {missing}"
  bad = {k: (got[k], v) for k, v in want.items()
         if not np.isclose(got[k], v, rtol=RTOL, atol=1e-9)}
  assert not bad, "numbers moved (got, golden): " + "; ".join(f"{k}: {g!r} vs {w!r}"
                                                              for k, (g, w) in bad.items())


def test_one_grpo_update_gives_the_golden_numbers(tmp_path):
  _check(one_step("configs/grpo.py:tiny", str(tmp_path / "base")), GOLDEN["grpo"])


def test_one_ppo_update_gives_the_golden_numbers(tmp_path):
  _check(one_step("configs/ppo.py:tiny", str(tmp_path / "base")), GOLDEN["ppo"])


if __name__ == "__main__":  # print the current values, to paste into GOLDEN after a change
  import tempfile
  for kind in ("grpo", "ppo"):
    with tempfile.TemporaryDirectory() as d:
      print(kind, one_step(f"configs/{kind}.py:tiny", os.path.join(d, "base")))
