"""The accelerator table (analysis/throughput/accelerators.json) as data the throughput model reads.

Every figure is a vendor datasheet's, named in the row's `source`; bandwidths are per chip in one
direction. The `cpu` row is the host the tests run on: its compute rate is calibrated from a run
(`peak_flops` null) and its N simulated devices share the host (`shared_host`), so N of them do
not add compute.
"""

from __future__ import annotations

import dataclasses
import json
import os

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "accelerators.json")
NUMBERS = ("peak_flops", "hbm_bytes", "hbm_bw", "intra_bw", "inter_bw")
# Fields a datasheet row must state; the cpu row leaves its compute rate to the calibration.
REQUIRED = ("peak_flops", "hbm_bytes", "hbm_bw", "intra_bw")


@dataclasses.dataclass(frozen=True)
class Accelerator:
  name: str
  peak_flops: float | None  # dense bf16 FLOP/s per chip (None: calibrated from a run)
  hbm_bytes: float | None  # memory per chip
  hbm_bw: float  # memory bandwidth per chip, bytes/s
  intra_bw: float  # link bandwidth per chip inside a node / ICI domain, one direction
  inter_bw: float | None  # per chip between nodes; None: more chips than a node are refused
  chips_per_node: int
  source: str
  shared_host: bool = False  # simulated devices of one host: compute does not grow with N

  def link_bw(self, chips: int) -> float:
    """The slowest link a ring over `chips` crosses: inter-node once past one node."""
    if chips <= self.chips_per_node:
      return self.intra_bw
    if self.inter_bw is None:
      raise ValueError(f"accelerator {self.name!r}: {chips} chips exceed one node/pod of "
                       f"{self.chips_per_node} and its datasheet gives no bandwidth between them")
    return self.inter_bw

  def with_peak(self, peak_flops: float) -> "Accelerator":
    return dataclasses.replace(self, peak_flops=float(peak_flops))


def _check(name: str, row: dict) -> Accelerator:
  known = set(NUMBERS) | {"chips_per_node", "source", "shared_host"}
  unknown = sorted(set(row) - known)
  if unknown:
    raise ValueError(f"accelerator {name!r}: unknown fields {unknown}; allowed: {sorted(known)}")
  shared = bool(row.get("shared_host", False))
  for k in NUMBERS:
    v = row.get(k)
    if v is None and k in REQUIRED and not (shared and k in ("peak_flops", "hbm_bytes")):
      raise ValueError(f"accelerator {name!r}: {k} is required (a datasheet figure)")
    if v is not None and not (isinstance(v, (int, float)) and v > 0):
      raise ValueError(f"accelerator {name!r}: {k}={v!r} must be a positive number")
  if not (isinstance(row.get("chips_per_node"), int) and row["chips_per_node"] >= 1):
    raise ValueError(f"accelerator {name!r}: chips_per_node must be a positive integer")
  if not row.get("source"):
    raise ValueError(f"accelerator {name!r}: every row names its source")
  return Accelerator(name=name, shared_host=shared, **{k: row.get(k) for k in NUMBERS},
                     chips_per_node=row["chips_per_node"], source=row["source"])


def load(path: str = TABLE) -> dict[str, Accelerator]:
  """Every row of the table, checked; keys starting with '_' are comments."""
  with open(path) as f:
    rows = json.load(f)
  return {k: _check(k, v) for k, v in rows.items() if not k.startswith("_")}


def get(name: str, path: str = TABLE) -> Accelerator:
  table = load(path)
  key = name.strip().lower()
  if key not in table:
    raise ValueError(f"unknown accelerator {name!r}; known: {', '.join(sorted(table))}")
  return table[key]
