"""What a report section returns: its text, verdict, tables and figures (drawn elsewhere)."""

from __future__ import annotations

import dataclasses
from typing import Callable

import pandas as pd


@dataclasses.dataclass
class Figure:
  stem: str  # file name of the PNG, PDF and CSV
  caption: str  # two lines: what it shows, how to read it
  data: pd.DataFrame  # the CSV, and all the figure is drawn from
  draw: Callable[[pd.DataFrame], object]


@dataclasses.dataclass
class Section:
  title: str
  text: list[str] = dataclasses.field(default_factory=list)
  verdict: list[str] = dataclasses.field(default_factory=list)
  figures: list[Figure] = dataclasses.field(default_factory=list)
  tables: list[tuple[str, pd.DataFrame]] = dataclasses.field(default_factory=list)
  skipped: str = ""
  facts: dict = dataclasses.field(default_factory=dict)  # what later sections read
  lead: bool = False  # written right after the verdict, not as a numbered section
