"""analysis/study_table.py: what counts as a finished run."""

from analysis import study_table
from analysis.runs import Run


def _run(stop, responses_to_target):
  summary = {"responses_to_target": responses_to_target}
  return Run("r", {"target": {"stop": stop, "value": 0.4}}, [], summary)


def test_a_run_stopped_at_its_target_is_finished_and_one_cut_short_is_not():
  assert study_table.stopped_at_target(_run(True, 1200))
  assert not study_table.stopped_at_target(_run(False, 1200))  # ran on: its end is the budget
  assert not study_table.stopped_at_target(_run(True, None))  # stopped before: cut short
  assert not study_table.stopped_at_target(Run("r", {"target": {"stop": True}}, [], None))
