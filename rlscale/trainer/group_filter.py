"""Which groups carry signal, and which of them fill a step's P group slots (host side).

A group-relative advantage (GRPO, Dr. GRPO, RLOO) is exactly zero for a group whose G
rewards are all equal: it costs a decode and an update pass and teaches nothing. Dynamic
sampling (rollout.dynamic_sampling, as verl's filter_groups and OpenRLHF's
dynamic_filtering) keeps the first P informative groups of the step's stream of generated
groups and trains on those. Without it the same test says how many responses of a step were
informative: the effective batch.

Pure functions of host arrays; rlscale/trainer/refill.py runs the rounds on the mesh.
"""

from __future__ import annotations

import collections
import math

import numpy as np

# Why a group carries no signal. Equal rewards: every response correct ("solved"), none
# ("unsolved"), or equal partial credit ("equal"); "low_std": rewards differ, but their std is
# at most rollout.filter_min_std.
INFORMATIVE, SOLVED, UNSOLVED, EQUAL, LOW_STD = range(5)
REASONS = {SOLVED: "solved", UNSOLVED: "unsolved", EQUAL: "equal", LOW_STD: "low_std"}
# A round sends at most this many times the prompts it still needs (rollout.oversample='auto').
MAX_OVERSAMPLE = 4.0
# The filtered fraction that sizes a step's first round: an EMA over steps with this decay.
FILTERED_DECAY = 0.5


def group_signal(rewards_PxG, correct_PxG, min_std: float = 0.0) -> np.ndarray:
  """Each group's reason code: INFORMATIVE (0) or why it carries no signal (REASONS).

  The std is GRPO's (ddof=1); `min_std` 0 drops only the groups of equal rewards.
  """
  r = np.asarray(rewards_PxG, np.float64)
  correct = np.asarray(correct_PxG, bool)
  equal = r.max(axis=1) == r.min(axis=1)
  std = r.std(axis=1, ddof=1) if r.shape[1] > 1 else np.zeros(r.shape[0])
  code = np.full(r.shape[0], INFORMATIVE, np.int8)
  code[~equal & (std <= min_std)] = LOW_STD
  code[equal] = EQUAL
  code[equal & correct.all(axis=1)] = SOLVED
  code[equal & ~correct.any(axis=1)] = UNSOLVED
  return code


def reason_fractions(codes: np.ndarray, prefix: str = "rollout/uninformative") -> dict[str, float]:
  """The fraction of groups without signal, and of each reason, among `codes`."""
  n = max(len(codes), 1)
  out = {prefix + "_groups": float(np.sum(codes != INFORMATIVE)) / n}
  for code, name in REASONS.items():
    out[f"{prefix}_{name}"] = float(np.sum(codes == code)) / n
  return out


class Slots:
  """The step's P group slots and the generated group in each.

  Groups are offered in the order of the step's stream (step-level indices 0, 1, ...). The
  first P take slots 0..P-1 whatever they carry; an informative group after them takes the
  first slot whose group carries no signal (a hole). So the step trains on the first P
  informative groups of its stream, in any number of calls, rounds and processes; the holes
  left when the rounds run out keep their group, which the update does not train on.
  """

  def __init__(self, num_prompts: int):
    self.num_prompts = num_prompts
    self.owner = np.full(num_prompts, -1, np.int64)  # step-level group index per slot
    self.informative = np.zeros(num_prompts, bool)
    self.holes: collections.deque[int] = collections.deque()
    self.offered = 0
    self.dropped_informative = 0  # informative groups that found every slot taken

  @property
  def missing(self) -> int:
    """Informative groups still wanted."""
    return self.num_prompts - int(self.informative.sum())

  def offer(self, codes: np.ndarray) -> dict[int, int]:
    """Offer the next len(codes) groups of the stream; {slot: group} written by them (the
    last writer of a slot wins, so a slot appears once)."""
    writes: dict[int, int] = {}
    for code in codes:
      g, self.offered = self.offered, self.offered + 1
      good = code == INFORMATIVE
      if g < self.num_prompts:
        slot = g
        if not good:
          self.holes.append(slot)
      elif good and self.holes:
        slot = self.holes.popleft()
      else:
        self.dropped_informative += int(good)
        continue
      self.owner[slot], self.informative[slot] = g, good
      writes[slot] = g
    return writes


def prompts_to_send(missing: int, filtered: float, oversample) -> int:
  """Prompts a round sends to find `missing` informative groups when a fraction `filtered`
  of groups carries none: missing / (1 - filtered) for oversample='auto' (at most
  MAX_OVERSAMPLE x missing), missing x oversample for a number."""
  if oversample == "auto":
    factor = 1.0 / max(1.0 - filtered, 1.0 / MAX_OVERSAMPLE)
  else:
    factor = float(oversample)
  return max(1, math.ceil(missing * factor - 1e-9))


def effective_rows(codes: np.ndarray, trained: np.ndarray, group_size: int) -> int:
  """Informative responses among the trained groups."""
  return int(np.sum((codes == INFORMATIVE) & trained)) * group_size
