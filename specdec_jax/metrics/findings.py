"""Leviathan et al.'s qualitative findings, checked against committed records and rendered as a
table of verdicts (reproduced, contradicted, not resolved, untested), and the Table-3-style alpha
table beside it.

Why: the papers' findings are what a local reproduction can test even where its absolute numbers
cannot match a T5-XXL on a TPU: a larger draft agrees more often, greedy agreement exceeds
sampled agreement, a trained draft beats n-gram ones, the speedup falls as the draft grows at a
fixed gamma, and the formula predicts the measured speedup. A verdict is only as strong as the
intervals: an ordering is "reproduced" when the two 95 % intervals do not overlap in the paper's
direction, "contradicted" when they do not overlap in the other, and "not resolved" otherwise; a
finding with no records to test it says "untested". (Non-overlap of two marginal intervals is a
conservative test of a difference.)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

SIZES = ("small", "base", "large")


def draft_size(draft: str) -> str | None:
  """'small' / 'base' / 'large' for the zoo's data-only drafts (t5_draft_<size>), else None."""
  name = str(draft).rsplit("/", 1)[-1]
  return next((s for s in SIZES if name == f"t5_draft_{s}"), None)


def _rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  return [r["metrics"] for r in records]


def _find(rows, task: str, draft_pred, temperature: float, key: str, gamma=None):
  return next((m for m in rows if m["task"] == task and draft_pred(m["draft"])
               and float(m["temperature"]) == temperature and m.get(key) is not None
               and (gamma is None or m.get("gamma") == gamma)), None)


def _span(m: Mapping[str, Any], key: str) -> tuple[float, float]:
  pair = m.get(f"{key}_interval95")
  return (pair[0], pair[1]) if pair else (m[key], m[key])


def order_verdict(lower: Mapping[str, Any], higher: Mapping[str, Any], key: str) -> str:
  """Whether `lower[key] < higher[key]`, judged by their 95 % intervals."""
  lo_a, hi_a = _span(lower, key)
  lo_b, hi_b = _span(higher, key)
  if hi_a < lo_b:
    return "reproduced"
  if hi_b < lo_a:
    return "contradicted"
  return "not resolved"


def chain_verdict(verdicts: Sequence[str]) -> str:
  """An ordered chain (a < b < c) from its consecutive pairs."""
  if not verdicts:
    return "untested"
  if "contradicted" in verdicts:
    return "contradicted"
  return "reproduced" if all(v == "reproduced" for v in verdicts) else "not resolved"


def _value(m: Mapping[str, Any], key: str, spec: str = ".3f") -> str:
  pair = m.get(f"{key}_interval95")
  text = format(m[key], spec)
  return f"{text} [{format(pair[0], spec)}, {format(pair[1], spec)}]" if pair else text


def _by_size(rows, task: str, temperature: float, key: str, gamma=None):
  found = {s: _find(rows, task, lambda d, s=s: draft_size(d) == s, temperature, key, gamma)
           for s in SIZES}
  return [(s, m) for s, m in found.items() if m is not None]


def _size_finding(rows, task: str, temperature: float, key: str, falling: bool,
                  gamma=None) -> tuple[str, str]:
  """(verdict, evidence) of "key rises (or falls) with draft size"."""
  ordered = _by_size(rows, task, temperature, key, gamma)
  if len(ordered) < 2:
    return "untested", "no records"
  judge = lambda a, b: order_verdict(b, a, key) if falling else order_verdict(a, b, key)  # noqa
  verdicts = [judge(a, b) for (_, a), (_, b) in zip(ordered, ordered[1:])]
  evidence = "; ".join(f"{s} {_value(m, key)}" for s, m in ordered)
  if len(ordered) > 2:  # the ends, which a chain of overlapping neighbours can still resolve
    evidence += f" ({ordered[0][0]} vs {ordered[-1][0]}: {judge(ordered[0][1], ordered[-1][1])})"
  return chain_verdict(verdicts), evidence


def _temperature_finding(rows, task: str) -> tuple[str, str]:
  verdicts, evidence = [], []
  for draft in sorted({m["draft"] for m in rows if m["task"] == task and "gram" not in
                       str(m["draft"])}):
    same = lambda d, draft=draft: d == draft  # noqa: E731
    cold, hot = (_find(rows, task, same, t, "alpha") for t in (0.0, 1.0))
    if cold and hot:
      verdicts.append(order_verdict(hot, cold, "alpha"))
      evidence.append(f"{draft.rsplit('/', 1)[-1]} {cold['alpha']:.3f} / {hot['alpha']:.3f} "
                      f"({verdicts[-1]})")
  return chain_verdict(verdicts), "; ".join(evidence) or "no records"


def _ngram_finding(rows, task: str) -> tuple[str, str]:
  best_gram = [m for m in (_find(rows, task, lambda d, g=g: d == g, 0.0, "alpha")
                           for g in ("unigram", "bigram")) if m]
  model = _find(rows, task, lambda d: draft_size(d) == "small", 0.0, "alpha")
  if not best_gram or model is None:
    return "untested", "no records"
  verdicts = [order_verdict(g, model, "alpha") for g in best_gram]
  evidence = "; ".join(f"{g['draft']} {_value(g, 'alpha')}" for g in best_gram)
  return chain_verdict(verdicts), f"{evidence}; small {_value(model, 'alpha')}"


def _prediction_finding(rows) -> tuple[str, str]:
  checked = [m for m in rows if m.get("speedup") is not None and m.get("speedup_predicted")
             is not None and m.get("speedup_interval95") and (m.get("calibration") or {}).get(
                 "held_out")]
  if not checked:
    return "untested", "no benchmark records calibrated out of sample"
  inside = [m for m in checked
            if m["speedup_interval95"][0] <= m["speedup_predicted"] <= m["speedup_interval95"][1]]
  within10 = [m for m in checked if abs(m["speedup_predicted"] / m["speedup"] - 1) <= 0.10]
  verdict = ("reproduced" if len(within10) == len(checked) else
             "contradicted" if not within10 else "not resolved")
  return verdict, (f"{len(inside)} of {len(checked)} predictions inside the measured interval, "
                   f"{len(within10)} of {len(checked)} within 10 %")


def findings_table(records: Sequence[Mapping[str, Any]]) -> str:
  """One line per finding: what the paper says, the local evidence, the verdict."""
  rows = _rows(records)
  task = next((m["task"] for m in rows), "translate_en_de")
  gamma = next((m["gamma"] for m in rows if m.get("speedup") is not None and
                draft_size(m["draft"])), None)
  checks = [
      ("alpha rises with draft size (small < base < large), T = 0",
       _size_finding(rows, task, 0.0, "alpha", falling=False)),
      ("alpha rises with draft size, T = 1", _size_finding(rows, task, 1.0, "alpha",
                                                           falling=False)),
      ("alpha at T = 0 above alpha at T = 1 for the same pair", _temperature_finding(rows, task)),
      ("a trained draft's alpha far above unigram and bigram drafts (T = 0)",
       _ngram_finding(rows, task)),
      ("speedup falls as the draft grows at a fixed gamma"
       + (f" ({gamma})" if gamma is not None else "") + ", T = 0",
       _size_finding(rows, task, 0.0, "speedup", falling=True, gamma=gamma)),
      ("the formula predicts the measured speedup (held-out calibration)",
       _prediction_finding(rows)),
  ]
  lines = ["| finding (Leviathan et al.) | local evidence (95 % CI) | verdict |", "|---|---|---|"]
  lines += [f"| {what} | {evidence} | {verdict} |" for what, (verdict, evidence) in checks]
  return "\n".join(lines)


def alpha_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Table-3 style: alpha per draft at T = 0 and T = 1 with intervals, tokens per target call."""
  by: dict[tuple[str, str], dict[float, Mapping[str, Any]]] = {}
  for m in _rows(records):
    by.setdefault((m["task"], m["draft"]), {})[float(m["temperature"])] = m
  lines = ["| task | draft | gamma | prompts | alpha T=0 [95% CI] | alpha T=1 [95% CI] |",
           "|---|---|---|---|---|---|"]
  for (task, draft), per_t in by.items():
    any_m = next(iter(per_t.values()))
    cells = [_value(per_t[t], "alpha") if t in per_t else "-" for t in (0.0, 1.0)]
    lines.append(f"| {task} | {str(draft).rsplit('/', 1)[-1]} | {any_m['gamma']} | "
                 f"{any_m['num_examples']} | {cells[0]} | {cells[1]} |")
  return "\n".join(lines)
