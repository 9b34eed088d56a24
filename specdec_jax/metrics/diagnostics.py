"""Docs tables of the diagnostic experiments' records (experiments/loop_anatomy.py --goal,
experiments/tree_bound.py): what a draft or a tree would need, or could at best give, on one
machine. Why apart from `results`: those tables are of measured runs; these are of derived
estimates, and their columns say so.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def anatomy_goal_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Per loop_anatomy --goal record and gamma: tokens per call and speed as timed, with a free
  draft, and the tokens per call (and alpha) a free draft and this draft would need."""
  head = ["record", "goal", "gamma", "tokens/call", "end to end", "with a free draft",
          "free draft needs", "this draft needs (alpha)"]
  out = []
  for rec in records:
    rows = rec["metrics"]["rows"]
    for i, key in enumerate(sorted(rows, key=lambda k: rows[k]["gamma"])):
      r = rows[key]
      alpha = r["alpha_for_goal"]
      out.append([rec["name"] if i == 0 else "", f"{r['goal']:g}x" if i == 0 else "",
                  str(r["gamma"]), f"{r['tokens_per_target_call']:.2f}",
                  f"{r['speedup_end_to_end']:.2f}x",
                  f"{r['speedup_end_to_end_with_free_draft']:.2f}x",
                  f"{r['free_draft_tokens_per_call_for_goal']:.2f} of {r['gamma'] + 1}",
                  f"{r['tokens_per_call_for_goal']:.2f} "
                  + ("(none)" if alpha is None else f"({alpha:.2f})")])
  return _table(head, out)


def tree_bound_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Per tree_bound record: the best tree's bound over the best chain, with the verify as
  timed and with a flat one, and where (depth, drafted nodes) each is reached."""
  head = ["record", "draft", "timings from", "T", "best bound over the best chain",
          "at (depth, drafted nodes)", "with a flat verify (v = 1)", "at"]
  out = []
  for rec in records:
    m = rec["metrics"]
    best, flat = m["best"], m["best_flat_verify"]
    out.append([rec["name"], m["draft"], m["chain_record"], f"{m['temperature']:g}",
                f"{best['speed_over_best_chain']:.2f}x",
                f"({best['depth']}, {best['drafted_nodes']})", f"{flat['flat_verify']:.2f}x",
                f"({flat['depth']}, {flat['drafted_nodes']})"])
  return _table(head, out)
