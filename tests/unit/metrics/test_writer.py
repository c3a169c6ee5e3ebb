"""metrics.jsonl: one line per step, NaN/Inf visible, resume without duplicates; atomic JSON files."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from rlscale.metrics.writer import MetricsWriter, write_json


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _write(workdir, steps, resume_step=None):
  w = MetricsWriter(str(workdir), resume_step=resume_step, tensorboard=False)
  for step in steps:
    w.write(step, {"loss": 1.0 / step})
  w.close()


def test_one_line_per_step_with_plain_numbers(tmp_path):
  w = MetricsWriter(str(tmp_path), tensorboard=False)
  w.write(1, {"loss": np.float32(0.5), "count": np.int64(3), "acc": jnp.float32(0.25), "tag": "a"})
  w.write(np.int32(2), {"loss": jnp.array(0.125)})
  w.close()
  assert _rows(tmp_path) == [{"step": 1, "loss": 0.5, "count": 3, "acc": 0.25, "tag": "a"},
                             {"step": 2, "loss": 0.125}]


def test_nan_and_inf_stay_visible_as_strings(tmp_path):
  w = MetricsWriter(str(tmp_path), tensorboard=False)
  w.write(1, {"a": float("nan"), "b": np.float32("inf"), "c": jnp.float32(-np.inf), "d": 1.5})
  w.close()
  with open(tmp_path / "metrics.jsonl") as f:
    text = f.read()
  assert "NaN" not in text and "Infinity" not in text  # not JSON: other readers would choke
  assert _rows(tmp_path) == [{"step": 1, "a": "nan", "b": "inf", "c": "-inf", "d": 1.5}]


def test_resume_drops_the_lines_after_the_resume_step(tmp_path):
  _write(tmp_path, [1, 2, 3, 4])  # the run got to step 4, its last checkpoint is step 2
  _write(tmp_path, [3, 4, 5], resume_step=2)
  assert [r["step"] for r in _rows(tmp_path)] == [1, 2, 3, 4, 5]
  assert _rows(tmp_path)[3]["loss"] == pytest.approx(0.25)


def test_resume_tolerates_a_line_cut_by_a_crash(tmp_path):
  _write(tmp_path, [1, 2])
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 3, "loss": 0.3')  # the crash hit mid-line
  _write(tmp_path, [3], resume_step=2)
  assert [r["step"] for r in _rows(tmp_path)] == [1, 2, 3]


def test_a_complete_last_line_without_newline_is_kept(tmp_path):
  with open(tmp_path / "metrics.jsonl", "w") as f:
    f.write('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.5}')  # cut just before the newline
  _write(tmp_path, [3], resume_step=2)
  assert [r["step"] for r in _rows(tmp_path)] == [1, 2, 3]


def test_a_fresh_start_empties_an_old_file(tmp_path):
  _write(tmp_path, [1, 2, 3])
  _write(tmp_path, [1])  # no checkpoint to resume from: step 1 again
  assert [r["step"] for r in _rows(tmp_path)] == [1]


def test_tensorboard_gets_the_numbers_only(tmp_path):
  w = MetricsWriter(str(tmp_path), tensorboard=True)
  w.write(1, {"loss": 0.5, "bad": float("nan"), "tag": "a", "flag": True})
  w.close()
  events = os.listdir(tmp_path / "tensorboard")
  assert len(events) == 1 and events[0].startswith("events.out.tfevents")
  assert _rows(tmp_path) == [{"step": 1, "loss": 0.5, "bad": "nan", "tag": "a", "flag": True}]


def test_write_json_replaces_the_file_whole(tmp_path):
  path = str(tmp_path / "summary.json")
  write_json(path, {"steps": 4, "acc": np.float32(0.5), "loss": float("nan")})
  with open(path) as f:
    assert json.load(f) == {"steps": 4, "acc": 0.5, "loss": "nan"}
  with pytest.raises(TypeError):
    write_json(path, {"steps": 5, "bad": object()})  # fails while writing
  with open(path) as f:
    assert json.load(f)["steps"] == 4  # the old file is intact, never half-written
  write_json(path, {"steps": 6})
  with open(path) as f:
    assert json.load(f) == {"steps": 6}
  assert sorted(os.listdir(tmp_path)) == ["summary.json"]  # the temporary file became it
