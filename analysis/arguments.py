"""Command-line value types the analysis commands share: argparse names the flag on an error."""

from __future__ import annotations

import argparse


def at_least(low: float, kind=float):
  """A `kind` (int or float) that is >= `low` (NaN refused)."""
  def parse(text: str):
    try:
      v = kind(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
    if not v >= low:  # NaN too
      raise argparse.ArgumentTypeError(f"{text!r} must be >= {low}")
    return v
  return parse
