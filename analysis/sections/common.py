"""Helpers the sections share: a configuration's ratio to its reference, the study's series."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import series as se
from analysis import stats
from analysis import study_table as st


def ratio(study: st.Study, config: str, ref: str, column: str = "responses_to_target",
          target: float | None = None, level: float = stats.LEVEL,
          log_shift: tuple[float, float] | None = None) -> stats.Interval:
  """median(config) / median(ref) of `column` over their verdict seeds, with its interval
  (two-sided at `level`: 0.9 gives one-sided 95% bounds); `log_shift`: stats.ratio_interval."""
  a = st.seed_values(study, config, column, target)
  b = st.seed_values(study, ref, column, target)
  if not (a.size and b.size) or (np.isinf(a).all() and np.isinf(b).all()):
    return stats.Interval(math.nan, n=0)
  return stats.ratio_interval(a, b, level=level, reps=study.opts.reps, seed=study.opts.seed,
                              log_shift=log_shift)


def reference_config(study: st.Study, table: pd.DataFrame, kind: str) -> str | None:
  """The kind's reference: its first series' (best lr when there is one) reference."""
  for s in study_series(study, table):
    if s.kind == kind:
      return s.reference
  same = table[table.kind == kind]
  return same.config.iloc[0] if len(same) else None


def study_series(study: st.Study, table: pd.DataFrame) -> list[se.Series]:
  key = id(table)
  cache = study.__dict__.setdefault("_series", {})
  if key not in cache:
    cache[key] = se.series(study, table)
  return cache[key]
