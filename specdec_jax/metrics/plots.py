"""PNG plots of a sweep (matplotlib, Agg backend: no display needed).

- speedup_vs_gamma.png: measured (solid) and predicted (dashed) speedup against gamma, one line
  per draft and temperature: the shape of Leviathan et al.'s Figure 3;
- alpha_vs_gamma.png: alpha against gamma per draft (alpha should barely depend on gamma; a
  trend means the counters or the drafts are off);
- predicted_vs_measured.png: one point per sweep point against the diagonal, the check that
  the theory with the measured c and v(gamma + 1) explains the measured speedup.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import matplotlib.ticker  # noqa: E402


def _series(metrics: Sequence[Mapping[str, Any]], key: str):
  """{(draft, temperature): [(gamma, value), ...]} over points with a fixed integer gamma."""
  out: dict[tuple, list] = {}
  for m in metrics:
    if m.get("gamma") is None or m.get("gamma_auto") or m.get(key) is None:
      continue
    out.setdefault((m["draft"], m["temperature"]), []).append((m["gamma"], m[key]))
  return {k: sorted(v) for k, v in out.items()}


def _label(draft, temperature) -> str:
  return f"{draft}, T={temperature:g}"


def speedup_vs_gamma(metrics, path: str) -> str:
  fig, ax = plt.subplots(figsize=(6, 4))
  predicted = _series(metrics, "speedup_predicted")
  for i, (k, pts) in enumerate(_series(metrics, "speedup").items()):
    color = f"C{i % 10}"
    ax.plot(*zip(*pts), "o-", color=color, label=_label(*k) + " measured")
    if k in predicted:
      ax.plot(*zip(*predicted[k]), "x--", color=color, label=_label(*k) + " predicted")
  ax.axhline(1.0, color="gray", lw=0.8)
  ax.set_xlabel("gamma (draft tokens per target call)")
  ax.set_ylabel("speedup over autoregressive")
  return _save(fig, path)


def alpha_vs_gamma(metrics, path: str) -> str:
  fig, ax = plt.subplots(figsize=(6, 4))
  for k, pts in _series(metrics, "alpha").items():
    ax.plot(*zip(*pts), "o-", label=_label(*k))
  ax.set_ylim(0, 1.02)
  ax.set_xlabel("gamma")
  ax.set_ylabel("alpha (mean sum_x min(p, q))")
  return _save(fig, path)


def predicted_vs_measured(metrics, path: str) -> str:
  fig, ax = plt.subplots(figsize=(4.5, 4.5))
  pts = [(m["speedup_predicted"], m["speedup"], m) for m in metrics
         if m.get("speedup_predicted") is not None and m.get("speedup") is not None]
  for p, s, m in pts:
    ax.plot(p, s, "o", color="C0")
    ax.annotate(f"{m['draft']} g{m['gamma']}", (p, s), fontsize=6)
  top = max([1.0] + [max(p, s) for p, s, _ in pts]) * 1.1
  ax.plot([0, top], [0, top], color="gray", lw=0.8)
  ax.set_xlim(0, top)
  ax.set_ylim(0, top)
  ax.set_xlabel("predicted speedup")
  ax.set_ylabel("measured speedup")
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
