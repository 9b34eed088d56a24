"""PNG plots of a sweep (matplotlib, Agg backend: no display needed).

- speedup_vs_gamma.png: measured (solid) and predicted (dashed) speedup against gamma, one line
  per draft and temperature: the shape of Leviathan et al.'s Figure 3;
- alpha_vs_gamma.png: alpha against gamma per draft (alpha should barely depend on gamma; a
  trend means the counters or the drafts are off);
- predicted_vs_measured.png: one point per sweep point against the diagonal, the check that
  the theory with the measured c and v(gamma + 1) explains the measured speedup.
Each is titled with what it measures (task, target, temperatures, n prompts) and carries the
bootstrap 95 % intervals (metrics.json's `*_interval95`) as error bars where they exist.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import matplotlib.ticker  # noqa: E402


def _series(metrics: Sequence[Mapping[str, Any]], key: str, interval: str | None = None):
  """{(draft, temperature): [(gamma, value, (below, above)), ...]} over points with a fixed
  integer gamma; (below, above) are the distances to the `interval` key's bounds (0 without)."""
  out: dict[tuple, list] = {}
  for m in metrics:
    if m.get("gamma") is None or m.get("gamma_auto") or m.get(key) is None:
      continue
    lo, hi = (m.get(interval) if interval else None) or (m[key], m[key])
    out.setdefault((m["draft"], m["temperature"]), []).append(
        (m["gamma"], m[key], (max(m[key] - lo, 0.0), max(hi - m[key], 0.0))))
  return {k: sorted(v) for k, v in out.items()}


def _label(draft, temperature) -> str:
  return f"{draft}, T={temperature:g}"


def title(metrics: Sequence[Mapping[str, Any]]) -> str:
  """What the points measure: task, target, temperatures and n prompts (per point)."""
  def joined(key, fmt="{}"):
    return ", ".join(dict.fromkeys(fmt.format(m[key]) for m in metrics if m.get(key) is not None))
  return (f"{joined('task')} (target {joined('target')})\n"
          f"T = {joined('temperature', '{:g}')}, n = {joined('num_examples')} prompts per point")


def _errorbar(ax, pts, fmt: str, color: str, label: str) -> None:
  """One line of points with their 95 % intervals as error bars (none where there are none)."""
  x, y, err = zip(*pts)
  yerr = [[e[0] for e in err], [e[1] for e in err]]
  ax.errorbar(x, y, yerr=yerr if any(map(any, yerr)) else None, fmt=fmt, color=color,
              label=label, capsize=3, lw=1)


def speedup_vs_gamma(metrics, path: str) -> str:
  fig, ax = plt.subplots(figsize=(6.5, 4.5))
  predicted = _series(metrics, "speedup_predicted")
  for i, (k, pts) in enumerate(_series(metrics, "speedup", "speedup_interval95").items()):
    color = f"C{i % 10}"
    _errorbar(ax, pts, "o-", color, _label(*k) + " measured (95% CI)")
    if k in predicted:
      ax.plot([p[0] for p in predicted[k]], [p[1] for p in predicted[k]], "x--", color=color,
              label=_label(*k) + " predicted")
  ax.axhline(1.0, color="gray", lw=0.8)
  ax.set_title("Speedup against gamma: " + title(metrics), fontsize=9)
  ax.set_xlabel("gamma (draft tokens per target call)")
  ax.set_ylabel("speedup over autoregressive")
  return _save(fig, path)


def alpha_vs_gamma(metrics, path: str) -> str:
  fig, ax = plt.subplots(figsize=(6.5, 4.5))
  for i, (k, pts) in enumerate(_series(metrics, "alpha", "alpha_interval95").items()):
    _errorbar(ax, pts, "o-", f"C{i % 10}", _label(*k))
  ax.set_ylim(0, 1.02)
  ax.set_title("alpha against gamma: " + title(metrics), fontsize=9)
  ax.set_xlabel("gamma")
  ax.set_ylabel("alpha (mean sum_x min(p, q), 95% CI)")
  return _save(fig, path)


def predicted_vs_measured(metrics, path: str) -> str:
  """One point per sweep point (colour: draft and temperature; label: its gamma, offset so that
  neighbours do not overlap), the measured speedup's interval as a vertical bar."""
  fig, ax = plt.subplots(figsize=(5.5, 5.5))
  pts = [m for m in metrics
         if m.get("speedup_predicted") is not None and m.get("speedup") is not None]
  groups = list(dict.fromkeys((m["draft"], m["temperature"]) for m in pts))
  for j, m in enumerate(pts):
    i = groups.index((m["draft"], m["temperature"]))
    lo, hi = m.get("speedup_interval95") or (m["speedup"], m["speedup"])
    first = all((o["draft"], o["temperature"]) != groups[i] for o in pts[:j])
    ax.errorbar([m["speedup_predicted"]], [m["speedup"]],
                yerr=[[max(m["speedup"] - lo, 0)], [max(hi - m["speedup"], 0)]], fmt="o",
                color=f"C{i % 10}", capsize=3, label=_label(*groups[i]) if first else None)
    ax.annotate(f"g{m['gamma']}", (m["speedup_predicted"], m["speedup"]), fontsize=7,
                xytext=(4, 4 - 9 * (j % 3)), textcoords="offset points")
  values = [v for m in pts for v in (m["speedup_predicted"], m["speedup"],
                                     *(m.get("speedup_interval95") or ()))]
  top, low = max([1.0] + values) * 1.1, min([1.0] + values) * 0.9  # zoomed: labels apart
  ax.plot([low, top], [low, top], color="gray", lw=0.8)
  ax.set_xlim(low, top)
  ax.set_ylim(low, top)
  ax.set_title("Predicted against measured speedup:\n" + title(metrics), fontsize=9)
  ax.set_xlabel("predicted speedup (calibration data only)")
  ax.set_ylabel("measured speedup (95% CI)")
  return _save(fig, path)


def _save(fig, path: str) -> str:
  for ax in fig.axes:
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
    if ax.get_xlabel().startswith("gamma"):
      ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def plot_sweep(metrics: Sequence[Mapping[str, Any]], output_dir: str) -> list[str]:
  """Writes the three PNGs into output_dir/plots; returns their paths."""
  out = os.path.join(output_dir, "plots")
  os.makedirs(out, exist_ok=True)
  return [speedup_vs_gamma(metrics, os.path.join(out, "speedup_vs_gamma.png")),
          alpha_vs_gamma(metrics, os.path.join(out, "alpha_vs_gamma.png")),
          predicted_vs_measured(metrics, os.path.join(out, "predicted_vs_measured.png"))]
