"""Two decodes of one run compared on the same prompts: tokens per target call and time per token,
each a ratio with a paired bootstrap interval.

Why: "the tree writes 1.3x the chain's tokens per call" is a claim about two points of one run
(same draft, same prompts, same process); two separate intervals overstate its uncertainty and a
bare ratio states none. The run's `batches.jsonl` holds, per batch and point, the counters and the
seconds, which is all this needs: no decode is repeated.
"""
from __future__ import annotations

import re

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from specdec_jax.metrics import bootstrap


def point_keys(batches: Iterable[Mapping[str, Any]]) -> list[str]:
  """The run keys of the points a run's batch lines hold, in first-seen order."""
  seen: dict[str, None] = {}
  for line in batches:
    for key in line.get("points", {}):
      seen.setdefault(key, None)
  return list(seen)


def _units(batches: Sequence[Mapping[str, Any]], a: str, b: str) -> list[tuple[float, ...]]:
  """(a emitted, a calls, a seconds, b emitted, b calls, b seconds) per batch both points hold."""
  out = []
  for line in batches:
    pa, pb = line.get("points", {}).get(a), line.get("points", {}).get(b)
    if pa is None or pb is None:
      continue
    ca, cb = pa["counters"], pb["counters"]
    out.append((ca["emitted"], ca["target_calls"], pa["seconds"],
                cb["emitted"], cb["target_calls"], pb["seconds"]))
  return out


def paired(batches: Sequence[Mapping[str, Any]], a: str, b: str, *, seed: int = 0
           ) -> dict[str, Any]:
  """a against b on the batches both decoded: `tokens_per_call_ratio` (a's tokens per target
  call over b's) and `time_per_token_ratio` (b's seconds per token over a's: > 1 when a is
  faster), each with its paired bootstrap interval over batches (prompts at batch 1)."""
  units = _units(batches, a, b)
  if len(units) < 2:
    raise ValueError(f"points {a!r} and {b!r} share {len(units)} batches; need 2 or more")
  ea, na, sa, eb, nb, sb = (list(col) for col in zip(*units))
  tpc = (sum(ea) / sum(na)) / (sum(eb) / sum(nb))
  speed = (sum(sb) / sum(eb)) / (sum(sa) / sum(ea))
  return {
      "a": a, "b": b, "batches": len(units), "tokens_emitted": [sum(ea), sum(eb)],
      "tokens_per_call": [sum(ea) / sum(na), sum(eb) / sum(nb)],
      "tokens_per_call_ratio": tpc,
      "tokens_per_call_ratio_interval95": bootstrap.ratio_of_ratios_interval(
          ea, na, eb, nb, seed=seed),
      "ms_per_token": [1e3 * sum(sa) / sum(ea), 1e3 * sum(sb) / sum(eb)],
      "time_per_token_ratio": speed,
      "time_per_token_ratio_interval95": bootstrap.ratio_of_ratios_interval(
          sb, eb, sa, ea, seed=seed),
  }


def machine_label(record: Mapping[str, Any]) -> str:
  """A record's machine in a table cell ("AMD EPYC, 2 cores"). Why a column: two machines of one
  CPU family differed 1.6-1.8x against 2.6x on the same command, so a table whose rows come from
  different machines says so on every row (issue 46)."""
  machine = record.get("machine") or {}
  cpu = re.sub(r"\(R\)|\(TM\)|\bProcessor\b|\bCPU\b.*", "", str(machine.get("cpu", "?")))
  cpu = " ".join(cpu.split()) or "?"
  return f"{cpu}, {machine['cores']} cores" if machine.get("cores") else cpu


def _iv(pair) -> str:
  return "-" if not pair else f"[{pair[0]:.2f}, {pair[1]:.2f}]"


def comparison_table(records: Sequence[Mapping[str, Any]]) -> str:
  """One line per comparison record: both points' tokens per call and ms per token, the ratios
  with their paired intervals, and where it was measured."""
  head = ("record", "a", "b", "batches", "tokens/call a / b", "ratio [95% CI]",
          "ms/token a / b", "a faster by [95% CI]", "machine", "load", "commit")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in records:
    m = r["metrics"]
    lines.append("| " + " | ".join((
        r["name"], m["a"], m["b"], str(m["batches"]),
        f"{m['tokens_per_call'][0]:.2f} / {m['tokens_per_call'][1]:.2f}",
        f"{m['tokens_per_call_ratio']:.2f}x {_iv(m['tokens_per_call_ratio_interval95'])}",
        f"{m['ms_per_token'][0]:.2f} / {m['ms_per_token'][1]:.2f}",
        f"{m['time_per_token_ratio']:.2f}x {_iv(m['time_per_token_ratio_interval95'])}",
        machine_label(r), f"{r['load_average'][0]:.1f}", r["commit"][:7])) + " |")
  return "\n".join(lines)
