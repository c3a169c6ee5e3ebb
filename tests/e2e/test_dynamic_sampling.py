"""Dynamic sampling end to end: refilled steps on the tiny GRPO run, the sample axis they log,
no compilation after the first step, a kill in the middle of a refill round resumed
bit-exactly, and the split/overlapped layout."""

import json
import os

import pytest

from tests.support.workers import two_process_rl
from rlscale.checkpoints.checkpointer import Checkpointer
from rlscale.run import train
from rlscale.trainer import refill

TIMING = ("time/", "throughput/", "memory/", "wall_time", "mfu/")


def ds_config(cache_dir, steps=4, **rollout):
  """two_process_rl's tiny GRPO (a base that earns partial credit) with dynamic sampling;
  oversample 1 sends P prompts a round, so that steps take several rounds."""
  cfg = two_process_rl.config("grpo.py+ds", cache_dir)
  with cfg.unlocked():
    cfg.rollout.update(rollout)
    cfg.train.num_steps = steps
  return cfg


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def straight(tiny_sft_base, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("ds") / "straight")
  return workdir, train.main(ds_config(tiny_sft_base), workdir)


@pytest.mark.slow(seconds=40)
def test_refilled_steps_train_on_p_informative_groups_and_count_what_they_generate(straight):
  workdir, summary = straight
  rows = _rows(workdir)
  p, g = 4, 4
  assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
  generated = trained = 0
  for r in rows[1:]:
    assert r["rollout/responses_generated"] == r["rollout/decode_calls"] * p * g  # 4 per call
    assert r["rollout/responses_generated"] >= p * g
    if not r["rollout/capped"]:
      assert r["rollout/responses_trained"] == p * g
      assert r["rollout/effective_batch"] == p * g  # one mini-batch
    generated += r["rollout/responses_generated"]
    trained += r["rollout/responses_trained"]
    assert (r["responses_seen"], r["responses_trained"]) == (generated, trained)
    assert 0 < r["rollout/uninformative_groups"] < 1
    assert r["rollout/uninformative_groups"] == pytest.approx(sum(
        r[f"rollout/uninformative_{k}"] for k in ("solved", "unsolved", "equal", "low_std")))
  assert max(r["rollout/rounds"] for r in rows[1:]) >= 2, "no step refilled: the test is void"
  # Rounds reuse the compiled decode; one compiled scatter places every call's rows.
  assert summary["compilations"] == {"actor": 1, "sampler": 1, "refill": 1}
  assert summary["responses_seen"] == generated


@pytest.mark.slow(seconds=60)
def test_a_kill_in_a_refill_round_resumes_bit_exactly(straight, tiny_sft_base, tmp_path,
                                                      monkeypatch):
  rows = _rows(straight[0])
  assert rows[3]["rollout/rounds"] >= 2, "step 3 has one round: no refill to kill"
  real_run, real_dispatch = refill.Refill.run, refill.Refill.dispatch
  steps = []

  def run(self, *a, **kw):
    steps.append(1)
    return real_run(self, *a, **kw)

  def dispatch(self, params, key, stream_first, first_group, round_):
    if len(steps) == 3 and round_ == 2:  # step 3 (checkpoint at 2), its second round
      raise KeyboardInterrupt("killed in a refill round")
    return real_dispatch(self, params, key, stream_first, first_group, round_)

  monkeypatch.setattr(refill.Refill, "run", run)
  monkeypatch.setattr(refill.Refill, "dispatch", dispatch)
  workdir = str(tmp_path / "resumed")
  with pytest.raises(KeyboardInterrupt, match="refill round"):
    train.main(ds_config(tiny_sft_base), workdir)
  monkeypatch.setattr(refill.Refill, "run", real_run)
  monkeypatch.setattr(refill.Refill, "dispatch", real_dispatch)
  assert Checkpointer(os.path.join(workdir, "checkpoints")).latest_step() == 2
  train.main(ds_config(tiny_sft_base), workdir)
  resumed = _rows(workdir)
  assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]
  for a, b in zip(rows, resumed):
    keys = {k for k in a if not k.startswith(TIMING)}
    assert keys == {k for k in b if not k.startswith(TIMING)}
    for k in sorted(keys):
      assert a[k] == b[k], (a["step"], k, a[k], b[k])  # CPU runs are deterministic: exact


@pytest.mark.slow(seconds=40)
def test_split_roles_with_overlap(tiny_sft_base, tmp_path):
  cfg = ds_config(tiny_sft_base, steps=3, max_staleness=1)
  with cfg.unlocked():
    cfg.mesh.roles, cfg.mesh.sampler_devices = "split", 4
    cfg.mesh.sampler_shape = (-1, 1, 1)
    cfg.train.checkpoint_every = 3
  summary = train.main(cfg, str(tmp_path / "run"))
  rows = _rows(str(tmp_path / "run"))
  assert [r["step"] for r in rows] == [0, 1, 2, 3]
  assert [r["rollout/policy_lag"] for r in rows[1:]] == [0, 1, 1]
  assert all(r["responses_trained"] <= r["responses_seen"] for r in rows)
  assert summary["compilations"] == {"actor": 1, "sampler": 1, "refill": 1}
