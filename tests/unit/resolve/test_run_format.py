"""A run directory records its format; a newer one than this code reads is refused in one line.

Older formats resume: format 0 (no run_format.json) is tests/integration/test_old_runs.py's
fixture, written by ba4a25a.
"""

import json
import os
import shutil

import pytest

from rlscale.config import files as config_files
from rlscale.config.errors import ConfigError
from rlscale.resolve import experiment
from tests.support import REPO
from tests.unit.resolve.test_bad_configs import _cli, _one_line_error

OLD = os.path.join(REPO, "tests", "support", "fixtures", "old_runs", "grpo_tiny_ba4a25a")


def _tiny():
  return config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny"))


def test_a_run_directory_records_the_format_and_version_that_wrote_it(tmp_path):
  experiment.prepare_workdir(str(tmp_path), _tiny())
  with open(tmp_path / experiment.FORMAT_FILE) as f:
    record = json.load(f)
  assert record["format"] == experiment.RUN_FORMAT and record["rlscale"]
  assert experiment.run_format(str(tmp_path)) == experiment.RUN_FORMAT


def test_a_run_before_the_record_is_format_0_and_passes_the_check():
  assert not os.path.exists(os.path.join(OLD, experiment.FORMAT_FILE))
  assert experiment.run_format(OLD) == 0
  experiment.check_format(OLD)


def _old_run_in(tmp_path, record):
  run = tmp_path / "run"
  shutil.copytree(OLD, run)
  (run / experiment.FORMAT_FILE).write_text(record)
  return run


def test_a_newer_format_is_refused_naming_both_formats_and_the_version(tmp_path):
  run = _old_run_in(tmp_path, json.dumps({"format": experiment.RUN_FORMAT + 1,
                                          "rlscale": "9.9.9"}))
  with pytest.raises(ConfigError, match=f"run format {experiment.RUN_FORMAT + 1} "
                     r"\(rlscale 9.9.9\).*reads formats 0-1"):
    experiment.check_format(str(run))


@pytest.mark.parametrize("record, expect", [
    ("{not json", "is not a run format record (JSONDecodeError"),
    ("{}", "is not a run format record (KeyError"),
    ('{"format": "1"}', "format '1' is not a run format"),
    ('{"format": -1}', "format -1 is not a run format"),
])
def test_a_damaged_format_record_is_named(tmp_path, record, expect):
  run = _old_run_in(tmp_path, record)
  with pytest.raises(ConfigError, match=expect.replace("(", r"\(")):
    experiment.run_format(str(run))


def test_resuming_a_newer_run_is_one_line_before_any_compute(tmp_path):
  run = _old_run_in(tmp_path, json.dumps({"format": experiment.RUN_FORMAT + 1,
                                          "rlscale": "9.9.9"}))
  before = sorted(os.listdir(run))
  out = _cli("--config=configs/grpo.py:tiny", f"--workdir={run}")
  _one_line_error(out, f"written in run format {experiment.RUN_FORMAT + 1} (rlscale 9.9.9)",
                  "resume it with rlscale 9.9.9 or newer")
  assert sorted(os.listdir(run)) == before
