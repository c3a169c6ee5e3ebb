"""The critical-batch probe's branches (rlscale/study/probe.py): what it refuses and what each
branch is told."""

import json
import math
import os

import pytest

from rlscale.config.errors import ConfigError
from rlscale.study import probe
from tests.support import REPO


def _run_dir(tmp_path, kept=(4, 8), kind="grpo", p=32, g=8, lr=1e-4, scaling="none"):
  run = tmp_path / "run"
  for s in kept:
    (run / "checkpoints" / str(s)).mkdir(parents=True)
  cfg = {"kind": kind, "optim": {"lr": lr, "lr_scaling": scaling, "reference_batch": 256,
                                 "b1": 0.9, "b2": 0.99, "eps": 1e-8, "adam_scaling": False}}
  if kind != "sft":
    cfg["rl"] = {"num_prompts": p, "group_size": g, "num_minibatches": 1}
  (run / "config.json").write_text(json.dumps(cfg))
  return str(run)


def _probe(run, **kw):
  kw = {"steps": (4,), "batches": (8, 16, 32, 64), **kw}
  return probe.Probe(run_dir=run, **kw)


@pytest.mark.parametrize("kw, expect", [
    (dict(steps=(5,)), "--at=5: "),
    (dict(steps=()), "--at: give at least one step"),
    (dict(batches=(8, 16)), "give 3 or more batches"),
    (dict(batches=(8, 12, 16)), "--batches: 12 not a positive multiple of the run's G = 8"),
    (dict(seeds=(0, 1)), "--seeds=2: 3 or more"),
    (dict(responses=600), "--responses=600: at least 10 steps of the largest batch (640): "
     "1 / (1 - beta1) with the fresh optimizer state, beta1 = 0.9"),
    (dict(responses=1000, optimizer="parent"), "--responses=1000: at least 30 steps of the "
     "largest batch (1920): 3 / (1 - beta1) with the parent optimizer state"),
    (dict(optimizer="warm"), "--optimizer='warm': one of fresh, parent"),
    (dict(rates=2), "--rates=2: an odd number >= 1"),
    (dict(evals=1), "--evals=1"),
    (dict(lr=1e-4), "give both"),
    (dict(lr_scaling="cubic"), "--lr_scaling='cubic'"),
    (dict(metric="eval/accuracy"), "--metric='eval/accuracy': one of eval/reference_prob, "),
])
def test_refuses_what_cannot_be_probed(tmp_path, kw, expect):
  with pytest.raises(ConfigError, match=None) as e:
    probe.check(_probe(_run_dir(tmp_path), **kw))
  assert expect in str(e.value)


def test_names_the_steps_the_run_kept(tmp_path):
  with pytest.raises(ConfigError) as e:
    probe.check(_probe(_run_dir(tmp_path, kept=(4, 8)), steps=(4, 6)))
  assert "kept the checkpoints of steps [4, 8]" in str(e.value) and "keep_period" in str(e.value)


def test_refuses_an_sft_run_and_a_folder_without_a_config(tmp_path):
  with pytest.raises(ConfigError, match="SFT run"):
    probe.check(_probe(_run_dir(tmp_path, kind="sft")))
  with pytest.raises(ConfigError, match="no config.json"):
    probe.check(_probe(str(tmp_path / "nothing")))


def test_each_branch_gets_its_batch_the_rules_rate_and_the_same_budget(tmp_path):
  run = _run_dir(tmp_path)  # B = 256 at lr 1e-4 (no scaling in the run)
  p = _probe(run, seeds=(0, 1, 2), rates=1)
  cfg = probe.check(p)
  pts = probe.overrides(p, cfg, 4)
  assert len(pts) == 4 * 3
  assert {(o["rl.num_prompts"], o["seed"]) for o in pts} == {
      (b // 8, s) for b in (8, 16, 32, 64) for s in (0, 1, 2)}
  for o in pts:  # sqrt rule anchored at the run: B = 256 would keep 1e-4
    assert o["optim.lr"] == 1e-4 and o["optim.reference_batch"] == 256
    assert o["optim.lr_scaling"] == "sqrt"
    assert o["train.total_responses"] == 1280  # 2 x 1 / (1 - 0.9) steps of the largest batch
    assert o["train.eval_every_responses"] == 80  # 16 evaluations
    assert o["init.branch_step"] == 4 and o["init.branch_from"] == os.path.abspath(run)
    assert o["init.branch_optimizer"] == "fresh"
    assert o["eval.reference"] is True and o["rl.microbatch"] == "auto"
  # One saving interval: about four saves in a branch of the batches' geometric middle (22.6).
  assert {o["train.checkpoint_every"] for o in pts} == {round(1280 / math.sqrt(8 * 64) / 4)}
  other = probe.overrides(_probe(run, lr=2e-4, reference_batch=16, rates=1), cfg, 4)
  assert {(o["optim.lr"], o["optim.reference_batch"]) for o in other} == {(2e-4, 16)}


def test_each_batch_scans_rates_a_factor_sqrt2_apart_centred_on_the_rule(tmp_path):
  run = _run_dir(tmp_path)
  p = _probe(run, seeds=(0, 1, 2), rates=5, lr=1e-4, reference_batch=16, optimizer="parent")
  pts = probe.overrides(p, probe.check(p), 4)
  assert len(pts) == 4 * 5 * 3
  for b in (8, 16, 32, 64):
    anchors = sorted({o["optim.lr"] for o in pts if o["rl.num_prompts"] == b // 8})
    assert anchors == pytest.approx([1e-4 * 2 ** (k / 2) for k in (-2, -1, 0, 1, 2)], rel=5e-6)  # 6 figures
  assert {o["init.branch_optimizer"] for o in pts} == {"parent"}
  assert {o["train.total_responses"] for o in pts} == {2 * 30 * 64}  # 2 x 3 / (1 - beta1)
  assert probe.rate_factors(1) == [1.0] and probe.rate_factors(3)[1] == 1.0


def test_a_branch_is_scored_on_the_metric_asked_for(tmp_path):
  """The study's metric (eval/accuracy_sampled) turns the reference scoring off and the sampled
  accuracy on, and is the branch's target metric (what analysis/probe.py reads)."""
  run = _run_dir(tmp_path)
  for metric, on in [("eval/reference_prob", "eval.reference"),
                     ("eval/accuracy_sampled", "eval.sampled"),
                     ("eval/accuracy_greedy", "eval.greedy")]:
    p = _probe(run, seeds=(0, 1, 2), rates=1, metric=metric)
    for o in probe.overrides(p, probe.check(p), 4):
      assert o["target.metric"] == metric and o["target.stop"] is False
      assert [k for k in ("eval.reference", "eval.sampled", "eval.greedy") if o[k]] == [on]


def test_the_branches_are_points_of_the_runs_own_config(tmp_path, tiny_sft_base):
  """configs/branch.py reads a real run's config.json back (a tiny chain-sum GRPO config)."""
  from rlscale.config import files as config_files
  from rlscale.resolve import experiment
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo_chain_sum.py") + ":tiny")
  run = tmp_path / "run"
  (run / "checkpoints" / "2").mkdir(parents=True)
  experiment.prepare_workdir(str(run), cfg)
  p = probe.Probe(run_dir=str(run), steps=(2,), batches=(4, 8, 16), seeds=(0, 1, 2), rates=1)
  pts = probe.points(p, probe.check(p), 2)
  assert [pt.name for pt in pts[:3]] == ["num_prompts=1,seed=0", "num_prompts=1,seed=1",
                                        "num_prompts=1,seed=2"]
  assert all(pt.run_dir.startswith(str(run / "probe" / "step_2")) for pt in pts)
  loaded = config_files.load(p.config)
  assert loaded.rl.group_size == cfg.rl.group_size and loaded.model.d_model == 64
  loaded.rl.microbatch = "auto"  # an 'auto'-or-integer field written as an integer takes 'auto'


def test_the_budget_is_whole_steps_of_every_batch(tmp_path):
  run = _run_dir(tmp_path)
  cfg = probe.parent_config(run)
  assert probe.budget(_probe(run, responses=660), cfg) == 704  # 11 steps of 64
  assert probe.budget(_probe(run), cfg) == 1280  # default: 2 x 10 steps of the largest
  assert probe.budget(_probe(run, optimizer="parent"), cfg) == 3840  # 2 x 30
  assert probe.budget(_probe(run, batches=(8, 24, 40), responses=500), cfg) == 600  # lcm 120
  cfg["optim"]["b1"] = 0.5  # a short memory: 2 steps at least, 4 by default
  assert probe.budget(_probe(run), cfg) == 4 * 64


def _study_dir(tmp_path, kind="grpo", values=None):
  study = tmp_path / "study"
  study.mkdir()
  values = values or {"p=1": 1e-4, "p=2": 1.41e-4, "p=4": 2e-4, "p=8": 2e-4}
  chosen = {"lr": {"stage": f"{kind}_lr", "per": ["p"], "values": values},
            "other": {"stage": "ppo_lr", "per": ["p"], "values": {"p=1": 9.0}}}
  (study / "study.json").write_text(json.dumps({"chosen": chosen}))
  return str(study)


def test_rates_from_a_study_centre_each_batch_on_the_rate_the_study_chose_for_its_p(tmp_path):
  """The study's rate policy: B = 8 ... 64 (P = 1 ... 8 of G = 8) at the study's choice for
  each P (not a rule's), a scan around it with --rates; a study target stops branches as the
  study's runs stop."""
  run, study = _run_dir(tmp_path), _study_dir(tmp_path)
  p = _probe(run, seeds=(0, 1, 2), rates=1, rates_from=study, target=0.51,
             metric="eval/accuracy_sampled")
  pts = probe.overrides(p, probe.check(p), 4)
  assert {(o["rl.num_prompts"], o["optim.lr"]) for o in pts} == {
      (1, 1e-4), (2, 1.41e-4), (4, 2e-4), (8, 2e-4)}
  for o in pts:
    assert o["optim.lr_scaling"] == "none"
    assert o["optim.reference_batch"] == o["rl.num_prompts"] * 8
    assert (o["target.value"], o["target.stop"], o["target.stop_margin"]) == (0.51, True, 0.25)
  cfg = probe.check(_probe(run, rates_from=study))
  scan = probe.overrides(_probe(run, seeds=(0, 1, 2), rates=3, rates_from=study), cfg, 4)
  assert sorted({o["optim.lr"] for o in scan if o["rl.num_prompts"] == 2}) == pytest.approx(
      [1.41e-4 / math.sqrt(2), 1.41e-4, 1.41e-4 * math.sqrt(2)], rel=1e-5)
  assert cfg["kind"] == "grpo"
  assert {o["target.stop"] for o in scan} == {False}  # no target: the gain, read over the budget


@pytest.mark.parametrize("kw, expect", [
    (dict(batches=(8, 16, 128)), "the study chose no rate at P = 16 (B = B / G with the run's "
     "G = 8); it chose at P = 1, 2, 4, 8"),
    (dict(lr=1e-4, reference_batch=16), "the rates come from one of them"),
    (dict(target=-0.1), "--target=-0.1"),
])
def test_refuses_rates_a_study_cannot_give(tmp_path, kw, expect):
  with pytest.raises(ConfigError) as e:
    probe.check(_probe(_run_dir(tmp_path), rates_from=_study_dir(tmp_path), **kw))
  assert expect in str(e.value)


def test_refuses_a_folder_that_is_not_a_study_and_a_study_without_the_runs_algorithm(tmp_path):
  run = _run_dir(tmp_path)
  with pytest.raises(ConfigError, match="no study.json there"):
    probe.check(_probe(run, rates_from=str(tmp_path)))
  study = _study_dir(tmp_path, kind="sft")
  with pytest.raises(ConfigError, match="no rate chosen per P by a 'grpo_lr' stage"):
    probe.check(_probe(run, rates_from=study))
