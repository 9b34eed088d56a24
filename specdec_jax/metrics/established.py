"""What the committed records establish and what they do not: claims counted over every record.

Why a generated list: a results page drifts into stating findings beyond their evidence (a
formula called predictive from 2 of 6 records inside their intervals, one seed called
reproduced). Each line here is a claim, the rule that would establish it, and the count of
records that meet the rule out of the records that can test it, recomputed from `docs/results/`
whenever the tables are regenerated, so a claim's verdict moves with the evidence.

A claim is "established" when every eligible record meets its rule (for the prediction claim:
at least 90 % of them); "not established" when some do not; "untested" when no record can test
it. A between-run claim needs at least 3 processes of one command.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional

Record = Mapping[str, Any]


def _metrics(records: Sequence[Record]) -> list[tuple[str, dict]]:
  return [(r["name"], r["metrics"]) for r in records if isinstance(r.get("metrics"), dict)]


def _lower(m: Mapping[str, Any], key: str) -> Optional[float]:
  pair = m.get(f"{key}_interval95")
  return float(pair[0]) if pair else None


def _greedy_identical(records):
  rows = [m for _, m in _metrics(records) if m.get("temperature") in (0, 0.0)
          and m.get("greedy_match_rate") is not None]
  return sum(float(m["greedy_match_rate"]) == 1.0 for m in rows), len(rows), ""


def _faster(target_pred: Callable[[str], bool]):
  def count(records):
    rows = [(n, m) for n, m in _metrics(records) if m.get("speedup_interval95")
            and target_pred(str(m.get("target", "")))]
    best = max(rows, key=lambda nm: nm[1]["speedup"], default=None)
    note = f"best {best[1]['speedup']:.2f}x ({best[0]})" if best else ""
    return sum(_lower(m, "speedup") > 1.0 for _, m in rows), len(rows), note
  return count


def _predicted(records):
  rows = [m for _, m in _metrics(records) if m.get("speedup_predicted") and
          m.get("speedup_interval95") and (m.get("calibration") or {}).get("held_out")]
  inside = sum(m["speedup_interval95"][0] <= m["speedup_predicted"] <= m["speedup_interval95"][1]
               for m in rows)
  near = sum(abs(m["speedup_predicted"] / m["speedup"] - 1) <= 0.10 for m in rows)
  return near, len(rows), f"inside the measured 95 % interval: {inside} of {len(rows)}"


def _tree_comparisons(records):
  return [(n, m) for n, m in _metrics(records) if m.get("kind") == "comparison"
          and "tree" in n and "vs_chain" in n and m.get("time_per_token_ratio_interval95")]


def _tree_faster(margin: float):
  def count(records):
    rows = _tree_comparisons(records)
    best = max(rows, key=lambda nm: nm[1]["time_per_token_ratio"], default=None)
    note = f"best {best[1]['time_per_token_ratio']:.2f}x ({best[0]})" if best else ""
    return (sum(_lower(m, "time_per_token_ratio") > margin for _, m in rows), len(rows), note)
  return count


def _processes(m: Mapping[str, Any]) -> list[dict]:
  """A median record's processes (`between_runs`, scripts/reproduce.py) as rows of their own."""
  runs = m["between_runs"]
  return [{"gamma": g, "speedup": s, "speedup_interval95": iv, "gamma_auto": m.get("gamma_auto")}
          for g, s, iv in zip(runs["gamma"], runs["speedup"], runs["speedup_interval95"])]


def _repeat_groups(records) -> dict[str, list[dict]]:
  """One command's processes, where >= 3 ran: a median record's `between_runs`, or records
  named `<command>_repeat<k>[_<machine>]` (written one per process before the median existed)."""
  groups: dict[str, list[dict]] = {}
  for name, m in _metrics(records):
    match = re.fullmatch(r"(.+)_repeat\d+(_\w+)?", name)
    if m.get("between_runs"):
      groups[name] = _processes(m)
    elif match:
      groups.setdefault(match.group(1) + (match.group(2) or ""), []).append(m)
  return {k: v for k, v in groups.items() if len(v) >= 3}


def _speedup(m: Mapping[str, Any]) -> float:
  """A process's speedup; 1.0 where 'auto' chose plain decoding (it ran the baseline itself)."""
  return 1.0 if m.get("speedup") is None and m.get("gamma") == 0 else float(m["speedup"])


def _auto_stable(records):
  groups = {k: v for k, v in _repeat_groups(records).items()
            if all(m.get("gamma_auto") for m in v)}
  same = sum(len({m["gamma"] for m in v}) == 1 for v in groups.values())
  note = "; ".join(f"{k}: gamma {', '.join(str(m['gamma']) for m in v)}"
                   for k, v in groups.items())
  return same, len(groups), note


def _within_interval(records):
  """Each process's speedup inside every other process's interval of the same command (a
  process that chose plain decoding counts as 1.0 and has no interval of its own). A group in
  which no process measured an interval cannot test the claim and is not counted."""
  groups = {k: v for k, v in _repeat_groups(records).items()
            if any(m.get("speedup_interval95") for m in v)}
  ok = sum(all(lo <= _speedup(m) <= hi for m in v for lo, hi in
               (o["speedup_interval95"] for o in v if o is not m and o.get("speedup_interval95")))
           for v in groups.values())
  note = "; ".join(f"{k}: {min(map(_speedup, v)):.2f}-{max(map(_speedup, v)):.2f}x"
                   for k, v in groups.items())
  return ok, len(groups), note


def _smollm2_goal(task: str, goal: float, temperature: float = 0.0):
  def count(records):
    rows = [(n, m) for n, m in _metrics(records) if "smollm2" in str(m.get("target", ""))
            and m.get("task") == task and float(m.get("temperature", -1)) == temperature
            and m.get("speedup_interval95")]
    best = max(rows, key=lambda nm: nm[1]["speedup"], default=None)
    note = f"best {best[1]['speedup']:.2f}x ({best[0]})" if best else ""
    return sum(_lower(m, "speedup") >= goal for _, m in rows), len(rows), note
  return count


# (claim, rule, counter, share of eligible records needed)
CLAIMS: tuple[tuple[str, str, Callable, float], ...] = (
    ("greedy speculative decoding emits the autoregressive tokens",
     "greedy match 1.00 in a T = 0 record", _greedy_identical, 1.0),
    ("speculation beats the autoregressive loop on the zoo targets",
     "speedup interval above 1", _faster(lambda t: "smollm2" not in t), 1.0),
    ("speculation beats the autoregressive loop on SmolLM2-135M",
     "speedup interval above 1", _faster(lambda t: "smollm2" in t), 1.0),
    ("SmolLM2 HumanEval reaches 3.0x at T = 0 (issue 47's goal)",
     "speedup interval at or above 3.0", _smollm2_goal("humaneval", 3.0), 1.0),
    ("SmolLM2 summaries reach 2.0x at T = 0 (issue 47's goal)",
     "speedup interval at or above 2.0", _smollm2_goal("summarize", 2.0), 1.0),
    ("SmolLM2 summaries reach 1.7x at T = 1 (issue 47's goal)",
     "speedup interval at or above 1.7", _smollm2_goal("summarize", 1.7, 1.0), 1.0),
    ("the cost formula predicts the measured speedup",
     "held-out prediction within 10 % of the measured speedup", _predicted, 0.9),
    ("a tree is faster than its chain end to end",
     "tree / chain speed ratio interval above 1", _tree_faster(1.0), 1.0),
    ("a tree is 1.15x its chain end to end (issue 47's goal)",
     "tree / chain speed ratio interval above 1.15", _tree_faster(1.15), 1.0),
    ("'auto' makes the same choice in every process",
     "one gamma across >= 3 processes of one command", _auto_stable, 1.0),
    ("a run's speedup interval covers another process of the same command",
     "each process's speedup inside every other's interval", _within_interval, 1.0),
)


def verdict(met: int, eligible: int, share: float) -> str:
  if eligible == 0:
    return "untested"
  return "established" if met >= share * eligible else "not established"


def established_table(records: Sequence[Record]) -> str:
  """The claims' verdicts over `records` (every committed record: the table takes no names)."""
  lines = ["| claim | verdict | records meeting the rule | rule | note |",
           "|---|---|---|---|---|"]
  for claim, rule, counter, share in CLAIMS:
    met, eligible, note = counter(records)
    lines.append(f"| {claim} | {verdict(met, eligible, share)} | {met} of {eligible} | {rule} | "
                 f"{note} |")
  return "\n".join(lines)
