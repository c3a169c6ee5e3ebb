"""Drawing the report's figures (matplotlib, Agg) from the tables written beside them.

Every figure is drawn from one long table, the CSV saved with it, so a reader can redraw it:
columns panel, series, x, y, optional lo/hi, and style, one of
  line (markers and line), dashed (an unfinished run), points (markers only), fit (a fitted
  curve, dotted), ref (the reference: thick, black), band (lo..hi shaded, no line).
"""

from __future__ import annotations

import math
import os

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

_STYLE = {"line": dict(marker="o", ms=3, lw=1.3), "dashed": dict(ls="--", lw=1, alpha=0.8),
          "points": dict(marker="o", ls="none", ms=4), "fit": dict(ls=":", lw=1.5),
          "ref": dict(color="black", lw=2.2, marker="o", ms=3)}


def save(fig, data: pd.DataFrame, out: str, stem: str) -> list[str]:
  """stem.png, stem.pdf and stem.csv under `out`."""
  paths = [os.path.join(out, f"{stem}.{ext}") for ext in ("png", "pdf", "csv")]
  fig.savefig(paths[0], dpi=110)
  fig.savefig(paths[1], metadata={"CreationDate": None})  # the same data, the same bytes
  plt.close(fig)
  data.to_csv(paths[2], index=False)
  return paths


def _panels(n: int, width: float = 5.0, height: float = 3.6):
  cols = min(n, 3)
  rows = math.ceil(n / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
  for ax in axes.flat[n:]:
    ax.set_visible(False)
  return fig, list(axes.flat[:n])


def lines(data: pd.DataFrame, xlabel, ylabel, logx: bool = False, logy: bool = False,
          hband: tuple[float, float] | None = None, hline: float | None = None):
  """One panel per `panel`, one line per (series, style); `hband` shades a horizontal band.

  An interval (lo..hi) is shaded in its line's colour, drawn after the line so the two match.
  `xlabel`/`ylabel` may be a dict {panel: label} when panels measure different things.
  """
  panels = list(dict.fromkeys(data["panel"])) if len(data) else [""]
  fig, axes = _panels(len(panels))
  for ax, panel in zip(axes, panels):
    d = data[data["panel"] == panel]
    color = _colors(d)
    for (series, style), g in d.groupby(["series", "style"], sort=False):
      kw = dict({"color": color[series]}, **_STYLE.get(style, {}))
      g = g.sort_values("x")
      shaded = "lo" in g and g["lo"].notna().any()
      if style == "band":
        ax.fill_between(g.x, g.lo, g.hi, alpha=0.2, color="gray", label=f"{series} band")
        continue
      if style == "points" and shaded:
        err = np.abs(np.vstack([g.y - g.lo, g.hi - g.y]))
        ax.errorbar(g.x, g.y, yerr=np.where(np.isfinite(err), err, 0), fmt="o", ms=4,
                    capsize=2, label=series, color=color[series])
        continue
      (line,) = ax.plot(g.x, g.y, label=series, **kw)
      if shaded:
        ax.fill_between(g.x, g.lo, g.hi, alpha=0.2, color=line.get_color())
    if hband is not None:
      ax.axhspan(*hband, color="green", alpha=0.12, label="tolerance")
    if hline is not None:
      ax.axhline(hline, color="gray", lw=0.8, ls="--")
    # A log axis with nothing finite and positive on it (all-zero grad norms, a B_simple that
    # is unbounded everywhere) stays linear.
    positive = lambda v: (np.isfinite(v) & (v > 0)).any()  # noqa: E731
    ax.set_xscale("log" if logx and positive(d.x) else "linear")
    ax.set_yscale("log" if logy and positive(d.y) else "linear")
    if logx:
      _batch_ticks(ax, d.x[~d["style"].isin(["fit", "dashed"])])
    if logy:
      _log_labels(ax.yaxis, d.y)
    label = lambda v: v.get(panel, "") if isinstance(v, dict) else v  # noqa: E731
    ax.set(xlabel=label(xlabel), ylabel=label(ylabel), title=str(panel))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  fig.tight_layout()
  return fig


def _colors(d: pd.DataFrame) -> dict:
  """A colour per series; a fitted or reference line ("B=8 fit", "grpo actor 1/√B") takes the
  colour of the data series whose name begins it, so a fit and its points match."""
  data = dict.fromkeys(s for s, st in zip(d["series"], d["style"]) if st not in ("fit", "dashed"))
  cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  keys = {}
  for s in dict.fromkeys(d["series"]):
    owners = [n for n in data if s != n and s.startswith(n + " ")]
    keys[s] = max(owners, key=len) if owners else s
  order = list(dict.fromkeys(keys.values()))
  return {s: cycle[order.index(k) % len(cycle)] for s, k in keys.items()}


def _batch_ticks(ax, x):
  """Plain numbers on a log x axis; the data's own values when there are few (batch sizes)."""
  values = sorted(v for v in set(x) if v > 0 and math.isfinite(v))
  if 2 <= len(values) <= 6:
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_plain))
    ax.set_xticks(values)
  else:
    _log_labels(ax.xaxis, x)


def _plain(v, _=None) -> str:
  """1.5k, 300, 0.0002: a tick label without exponents."""
  if v >= 1000:
    return f"{v / 1000:.3g}k"
  return f"{v:.3g}"


def _log_labels(axis, values):
  """Plain numbers on a log axis; minor ticks at 2, 3 and 5 x a power of ten labelled too when
  the data span less than a decade (else a log axis may show no label at all; every minor tick
  labelled would overlap)."""
  fmt = matplotlib.ticker.FuncFormatter(_plain)
  axis.set_major_formatter(fmt)
  v = np.asarray([u for u in values if np.isfinite(u) and u > 0], float)
  small = v.size and v.max() / v.min() < 10

  def minor(u, _=None):
    mantissa = u / 10 ** math.floor(math.log10(u)) if u > 0 else 0
    return _plain(u) if any(abs(mantissa - m) < 1e-6 for m in (2, 3, 5)) else ""
  axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(minor) if small
                           else matplotlib.ticker.NullFormatter())


def heatmap(data: pd.DataFrame, value: str, title: str):
  """P (rows) x G (columns) of `value`, each cell annotated with its `text`."""
  ps, gs = sorted(data.P.unique()), sorted(data.G.unique())
  grid = np.full((len(ps), len(gs)), np.nan)
  fig, ax = plt.subplots(figsize=(1.4 * len(gs) + 2.5, 0.9 * len(ps) + 1.8))
  for _, r in data.iterrows():
    i, j = ps.index(r.P), gs.index(r.G)
    v = float(r[value])
    grid[i, j] = v if math.isfinite(v) else np.nan
  im = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis_r", aspect="auto")
  for _, r in data.iterrows():  # white on the dark (high) half of viridis_r, black elsewhere
    v = float(r[value])
    dark = math.isfinite(v) and im.norm(v) > 0.5
    ax.text(gs.index(r.G), ps.index(r.P), r.text, ha="center", va="center", fontsize=8,
            color="white" if dark else "black")
  fig.colorbar(im, ax=ax, label=value)
  ax.set_xticks(range(len(gs)), [str(g) for g in gs])
  ax.set_yticks(range(len(ps)), [str(p) for p in ps])
  ax.set(xlabel="G (responses per prompt)", ylabel="P (prompts per step)", title=title)
  fig.tight_layout()
  return fig
