"""Acceptance statistics from the loops' on-device counters.

Why host-side dicts: counters come back once per batch; a run stores each batch's totals as plain
JSON (so a resumed run sums the batches of both processes) and only these pure functions turn the
sums into the published numbers:
- alpha = sum beta / number of positions, beta = sum_x min(p, q) (Leviathan's Table 3 definition);
- acceptance_rate = accepted / drafted, drafted = the drafts one target call offers along one
  path: a chain's gamma (an adaptive block's length), a tree's depth D. A tree's other nodes are
  alternatives at the same positions, not further drafts (at most D of its N - 1 nodes can be
  accepted per call), so its rate is per path and reads like a chain's at gamma = D; dividing by
  every node (as before) made a wider tree look worse the more alternatives it tried. A tree
  row's `tree.node_acceptance_rate` in metrics.json is accepted / (target calls x (N - 1));
- tokens_per_target_call = emitted / target calls;
- accepts_per_position[i] = fraction of target calls whose draft position i was accepted;
- accepted_length_hist[n] = target calls that accepted exactly n draft tokens.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

SUMMED = ("drafted", "accepted", "emitted", "target_calls", "beta_sum", "beta_count", "iterations")
VECTORS = ("accepts_per_position", "accepted_length_hist")


def counters_to_dict(counters, rows: int | None = None, stats=None,
                     draft_stats=None) -> dict[str, Any]:
  """Batch totals of a `state.Counters` as JSON-able numbers, over the first `rows` examples
  (the rest are padding: a short last batch on a data-parallel mesh). `stats` / `draft_stats`:
  the scheme's and the drafter's statistics (`DecodeResult`); where the drafter counts per
  example the target calls the prompt lookup drafted (`lookups_B`, the lookup-or-feature
  drafter), their total is `lookup_iterations`."""
  del stats  # no scheme statistic is a counter total today
  def rows_of(x):
    x = np.asarray(x)
    return x if rows is None else x[:rows]
  extra = ({"lookup_iterations": int(rows_of(draft_stats["lookups_B"]).sum())}
           if isinstance(draft_stats, dict) and "lookups_B" in draft_stats else {})
  return {**extra,
      "drafted": int(rows_of(counters.drafted_B).sum()),
      "accepted": int(rows_of(counters.accepted_B).sum()),
      "emitted": int(rows_of(counters.emitted_B).sum()),
      "target_calls": int(rows_of(counters.target_calls_B).sum()),
      "beta_sum": float(rows_of(counters.beta_sum_B).sum()),
      "beta_count": int(rows_of(counters.beta_count_B).sum()),
      "iterations": int(np.asarray(counters.iterations)),
      "accepts_per_position": rows_of(counters.accepts_per_position_BxG).sum(0).astype(int).tolist(),
      "accepted_length_hist": rows_of(counters.accepted_length_hist_BxG1).sum(0).astype(int).tolist(),
  }


def alpha_of(counters, rows: int | None = None) -> float:
  """alpha (sum beta / positions) of one decode's counters over its first `rows` examples; 0.0
  when nothing was counted."""
  d = counters_to_dict(counters, rows)
  return d["beta_sum"] / d["beta_count"] if d["beta_count"] else 0.0


def merge(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
  """Sums batch totals; vectors are summed elementwise (padded if gammas differ)."""
  out: dict[str, Any] = {k: 0 for k in SUMMED}
  out.update({k: [] for k in VECTORS})
  for r in records:
    for k in SUMMED:
      out[k] += r.get(k, 0)
    for k in VECTORS:
      a, b = out[k], list(r.get(k, []))
      n = max(len(a), len(b))
      out[k] = [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]
  return out


def _ratio(num: float, den: float) -> float | None:
  return float(num) / float(den) if den else None


def summarize(totals: Mapping[str, Any]) -> dict[str, Any]:
  """The published acceptance numbers of merged totals (None where undefined)."""
  calls = sum(totals.get("accepted_length_hist", [])) or totals.get("target_calls", 0)
  return {
      "alpha": _ratio(totals["beta_sum"], totals["beta_count"]),
      "acceptance_rate": _ratio(totals["accepted"], totals["drafted"]),
      "tokens_per_target_call": _ratio(totals["emitted"], totals["target_calls"]),
      "accepts_per_position": [_ratio(a, calls) for a in totals.get("accepts_per_position", [])],
      "accepted_length_hist": list(totals.get("accepted_length_hist", [])),
      "drafted": totals["drafted"],
      "accepted": totals["accepted"],
      "target_calls": totals["target_calls"],
      "emitted": totals["emitted"],
  }
