"""Device roles (colocated or split) and overlapped generation (rlscale/parallel/roles.py, trainer/rl_trainer.py)."""

import json
import os

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from tests.support import REPO
from rlscale import models
from rlscale.parallel import roles
from rlscale.parallel import sharding
from rlscale.config.errors import ConfigError



def _mesh_cfg(**kw):
  c = ml_collections.ConfigDict({"shape": (-1, 1, 1), "rules": (), "roles": "colocated",
                                 "sampler_devices": 0, "sampler_shape": (-1, 1, 1)})
  c.update(kw)
  return c


@pytest.mark.parametrize("kw,message", [
    ({"roles": "apart"}, r"mesh.roles='apart'; known: colocated, split"),
    ({"roles": "split"}, r"mesh.sampler_devices=0: mesh.roles='split' needs 1 to 7"),
    ({"roles": "split", "sampler_devices": 8}, r"needs 1 to 7 of the 8 devices"),
    ({"roles": "split", "sampler_devices": 4, "shape": (2, 1, 1)}, r"mesh.shape=\(2, 1, 1\) "
     r"does not fit 4 devices"),
    ({"roles": "split", "sampler_devices": 2, "sampler_shape": (1, 1, 4)},
     r"mesh.sampler_shape=\(1, 1, 4\) does not fit 2 devices"),
])
def test_bad_roles_are_refused_naming_the_field(kw, message):
  errors = []  # the resolve step's list; on the tests' 8 simulated devices, one process
  assert roles.make_meshes(_mesh_cfg(**kw), errors) is None
  assert errors and any(__import__("re").search(message, e) for e in errors), errors
  with pytest.raises(ValueError, match=message):  # without a list: raised
    roles.make_meshes(_mesh_cfg(**kw))


def test_split_meshes_are_disjoint_and_cover_the_devices():
  m = roles.make_meshes(_mesh_cfg(roles="split", sampler_devices=2, shape=(3, 1, 2),
                                  sampler_shape=(1, 1, 2)))
  assert m.split and dict(m.trainer.shape) == {"data": 3, "fsdp": 1, "tensor": 2}
  t, s = set(m.trainer.devices.flat), set(m.sampler.devices.flat)
  assert not t & s and t | s == set(jax.devices()) and len(s) == 2
  c = roles.make_meshes(_mesh_cfg())
  assert not c.split and c.trainer is c.sampler


def test_weight_sync_moves_the_weights_to_the_samplers_mesh_unchanged():
  rules = sharding.rules_from_config(None)
  meshes = roles.make_meshes(_mesh_cfg(roles="split", sampler_devices=4, shape=(2, 1, 2),
                                       sampler_shape=(1, 1, 4)))
  policy = models.create_sharded(models.CausalLM, models.named("tiny", vocab_size=128),
                                 meshes.trainer, rules, jax.random.key(0))
  _, params = nnx.split(policy)
  sync = roles.WeightSync(meshes, rules, keep_copy=False)
  out = sync(params)
  assert sync.seconds is not None and sync.seconds >= 0
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(out)):
    assert set(b.sharding.device_set) <= set(meshes.sampler.devices.flat)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The sampler's mesh shards by its own shape: the embedding's vocabulary over its tensor axis.
  embed = out["model"]["embed"] if "model" in out else None
  if embed is not None:
    assert "tensor" in str(embed.get_value().sharding.spec)


def test_a_stale_sampler_with_recomputed_old_logprobs_is_refused():
  from rlscale.config import files as config_files
  from rlscale.resolve import resolved
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny"))
  with cfg.unlocked():
    cfg.rollout.max_staleness, cfg.rl.old_logprobs = 1, "recompute"
  with pytest.raises(ConfigError,
                     match=r"rollout.max_staleness=1 with rl.old_logprobs='recompute'"):
    resolved.validate(cfg)


def _rows(run_dir):
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _variant(cache_dir, **changes):
  from tests.support.workers import two_process_rl
  cfg = two_process_rl.config("grpo.py", cache_dir)
  with cfg.unlocked():
    for k, v in changes.items():
      section, field = k.split(".")
      cfg[section][field] = v
  return cfg


# The sampler's rows are computed row by row whatever the mesh: the same tokens, bit for bit.
# The trainer's gradient is a sum over 4 shards instead of 8: float32 sums in another order,
# so metrics agree to the tolerance below (observed differences: see the assertion message).
RTOL, ATOL = 1e-4, 1e-6


@pytest.mark.slow
def test_split_four_plus_four_matches_colocated_eight(tmp_path, grpo_single_process_run):
  from rlscale.run import train
  cfg = _variant(grpo_single_process_run.cache_dir, **{
      "mesh.roles": "split", "mesh.sampler_devices": 4, "mesh.shape": (-1, 1, 1),
      "mesh.sampler_shape": (-1, 1, 1)})
  split_dir = str(tmp_path / "split")
  train.main(cfg, split_dir)
  one, split = _rows(grpo_single_process_run.run_dir), _rows(split_dir)
  assert [r["step"] for r in split] == [0, 1, 2]
  worst = 0.0
  for r1, r2 in zip(one, split):
    for k in ("responses_seen", "tokens_seen", "response_tokens", "response/length_max"):
      assert r1.get(k) == r2.get(k), (r1["step"], k)
    for k, v in r1.items():
      if (k.startswith(("time/", "throughput/", "mfu/", "memory/", "wall_time"))
          or not isinstance(v, float)):
        continue
      assert np.isclose(r2[k], v, rtol=RTOL, atol=ATOL), (r1["step"], k, v, r2[k])
      worst = max(worst, abs(r2[k] - v))
  assert all(r["time/weight_sync"] >= 0 for r in split[1:])
  assert all("time/weight_sync" not in r for r in one)
  print(f"split vs colocated: largest metric difference {worst:.3g}")


@pytest.mark.slow  # heavy for the default run (README); .ci/run runs it
def test_the_samplers_mesh_samples_the_same_tokens_as_the_whole_mesh():
  from rlscale.sampling import Sampler, SamplingParams, generate
  rules = sharding.rules_from_config(None)
  whole = roles.make_meshes(_mesh_cfg())
  split = roles.make_meshes(_mesh_cfg(roles="split", sampler_devices=4))
  policy = models.create_sharded(models.CausalLM, models.named("tiny", vocab_size=128),
                                 whole.trainer, rules, jax.random.key(1))
  graphdef, params = nnx.split(policy)
  rng = np.random.default_rng(0)
  tokens = np.repeat(rng.integers(3, 128, (8, 5)).astype(np.int32), 2, axis=0)
  mask = np.ones_like(tokens, bool)
  sp = SamplingParams(max_new_tokens=12, eos_ids=(2,), pad_id=0, decode_chunk=4)
  outs = []
  for meshes in (whole, split):
    synced = roles.WeightSync(meshes, rules, keep_copy=False)(params)
    out = generate(Sampler(graphdef, sp, meshes.sampler, rules), synced, tokens, mask,
                   jax.random.key(3), 8, group_size=2)
    outs.append(out)
    assert set(out.tokens.sharding.device_set) == set(meshes.sampler.devices.flat)
  np.testing.assert_array_equal(np.asarray(outs[0].tokens), np.asarray(outs[1].tokens))
  # Log-probs: float32 rounding of matmuls over 4 rows per device instead of 2 (~1e-6 seen).
  np.testing.assert_allclose(np.asarray(outs[0].logprobs), np.asarray(outs[1].logprobs),
                             rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["colocated", "split"])
def test_overlapped_generation_trains_one_step_off_policy(tmp_path, grpo_single_process_run,
                                                           layout):
  """Step 1 samples with the base either way (the same numbers as on-policy); step 2's
  responses were sampled before step 1's update: lag 1, and other responses."""
  from rlscale.run import train
  changes = {"rollout.max_staleness": 1}
  if layout == "split":
    changes.update({"mesh.roles": "split", "mesh.sampler_devices": 4})
  run_dir = str(tmp_path / layout)
  train.main(_variant(grpo_single_process_run.cache_dir, **changes), run_dir)
  one, lagged = _rows(grpo_single_process_run.run_dir), _rows(run_dir)
  assert [r.get("rollout/policy_lag") for r in lagged] == [None, 0, 1]
  for k in ("reward/mean", "response_tokens", "actor/grad_norm"):
    assert np.isclose(lagged[1][k], one[1][k], rtol=RTOL, atol=ATOL), k
  assert lagged[2]["response_tokens"] != one[2]["response_tokens"] or not np.isclose(
      lagged[2]["actor/grad_norm"], one[2]["actor/grad_norm"], rtol=1e-3)
  assert "throughput/gen_tokens_per_s" not in lagged[2]  # its generate phase is a wait
  assert all(np.isfinite(v) for r in lagged for v in r.values() if isinstance(v, float))


@pytest.mark.slow(seconds=35)
def test_split_over_two_processes_matches_one_colocated_process(tmp_path,
                                                                grpo_single_process_run):
  """Each process samples on 2 of its 4 devices and trains on the other 2: the weights and
  the responses cross meshes device to device, each process's rows staying its own."""
  from tests.integration.test_distributed import _run_two_processes, check_like_one
  one = grpo_single_process_run
  two_dir = str(tmp_path / "two")
  _run_two_processes(["grpo.py", one.cache_dir, two_dir, "split"], tmp_path)
  check_like_one("grpo split", one.run_dir, two_dir, one.summary)
  assert all(r["time/weight_sync"] >= 0 for r in _rows(two_dir)[1:])


@pytest.mark.parametrize("src_shape,src_spec,dst_shape,dst_spec", [
    ((4, 1, 1), ("data", None), (1, 1, 4), (None, "tensor")),  # no source shard holds one whole
    ((2, 1, 2), (None, "tensor"), (4, 1, 1), (None, None)),
    ((1, 1, 4), ("tensor", None), (2, 1, 2), ("tensor", None)),  # each held whole: no gather
])
def test_put_by_process_reshards_across_device_sets(src_shape, src_spec, dst_shape, dst_spec):
  """The path several processes take, run here in one: every target shard right."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  devs = jax.devices()
  src = NamedSharding(sharding.make_mesh(src_shape, devs[:4]), P(*src_spec))
  dst = NamedSharding(sharding.make_mesh(dst_shape, devs[4:]), P(*dst_spec))
  x = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)
  out = roles.put_by_process(jax.device_put(x, src), dst)
  assert out.sharding == dst
  for shard in out.addressable_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), x[shard.index])


@pytest.mark.slow
def test_auto_generation_batch_is_fitted_on_the_samplers_devices_and_recorded(
    tmp_path, grpo_single_process_run):
  from rlscale.run import train
  cfg = _variant(grpo_single_process_run.cache_dir, **{
      "rollout.generation_batch": "auto", "mesh.roles": "split", "mesh.sampler_devices": 4})
  summary = train.main(cfg, str(tmp_path / "auto"))
  fit = summary["generation_batch_fit"]
  assert fit["generation_batch"] == summary["batch"]["generation_batch"]
  assert fit["generation_batch"] % 4 == 0 and fit["bound"] in ("memory", "row cap", "whole step")
  assert fit["bytes_per_device"] <= fit["budget_bytes"]
