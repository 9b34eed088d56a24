"""metrics.json objects (DESIGN's public contract) and the printed Table-2-style summary.

Why pure functions over stored batch records: the numbers a run publishes are recomputed from
`batches.jsonl` and `predictions.jsonl` (see runner/store.py), so a resumed run reports every
example once, and tests can check the arithmetic without decoding anything.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from specdec_jax.metrics import acceptance_stats, bootstrap, quality, theory
from specdec_jax.metrics.records import ProgramRecord

CONTRACT_KEYS = ("task", "target", "draft", "temperature", "gamma", "num_examples", "alpha",
                 "acceptance_rate", "tokens_per_target_call", "c", "v", "speedup",
                 "speedup_predicted", "ar_ms_per_token", "spec_ms_per_token",
                 "greedy_match_rate", "quality")


def wall(records: Sequence[ProgramRecord]) -> tuple[float, int]:
  """(seconds, emitted tokens) summed over batch records of one program."""
  return (sum(r.seconds for r in records), sum(r.emitted for r in records))


def ms_per_token(records) -> float | None:
  seconds, tokens = wall(records)
  return 1e3 * seconds / tokens if records and tokens else None


def greedy_match_rate(spec_outputs: Sequence[Sequence[int]], ar_outputs: Sequence[Sequence[int]]
                      ) -> float | None:
  """Fraction of examples whose speculative output equals the autoregressive one."""
  if not spec_outputs or len(spec_outputs) != len(ar_outputs):
    return None
  return sum(list(a) == list(b) for a, b in zip(spec_outputs, ar_outputs)) / len(spec_outputs)


def quality_block(metric: str, references: Sequence[str | None], ar_texts, spec_texts,
                  bootstrap_samples: int = 200) -> dict[str, Any]:
  """{'metric', 'autoregressive', 'speculative'}; sides are None without references or text."""
  def side(texts):
    if texts is None or not references or any(r is None for r in references) \
        or any(t is None for t in texts):
      return None
    return quality.score(metric, list(texts), list(references))
  out = {"metric": metric, "autoregressive": side(ar_texts), "speculative": side(spec_texts),
         "num_references": sum(r is not None for r in references)}
  if out["autoregressive"] is not None and out["speculative"] is not None and len(references) > 1:
    # Lossless decoding: the speculative score should sit inside the autoregressive score's
    # bootstrap interval (temperature > 0, where the two outputs differ by sampling alone).
    def headline(preds, refs):
      return quality.headline(metric, quality.score(metric, preds, refs))
    lo, hi = quality.bootstrap_interval(headline, list(ar_texts), list(references),
                                        samples=bootstrap_samples)
    spec = quality.headline(metric, out["speculative"])
    out["autoregressive_interval95"] = [lo, hi]
    out["speculative_within_interval"] = bool(lo <= spec <= hi)
  return out


@dataclasses.dataclass(frozen=True)
class Setting:
  """What one metrics object describes: the task, the models and the decode's settings.

  draft: None for an autoregressive-only object; gamma: None there, 0 for GAMMA='auto' choosing
  the baseline. rule: the acceptance rule decoded with.
  """
  task: str
  target: str
  draft: str | None
  temperature: float
  gamma: int | None
  num_examples: int
  rule: str = "tokenwise"


@dataclasses.dataclass(frozen=True)
class Measured:
  """What the decodes of one object measured.

  alpha_if_nothing_drafted: alpha measured elsewhere (GAMMA='auto''s calibration decode) for a
  point whose decode drafted nothing (gamma 0). speedup_measured: False where the "speculative"
  program is the baseline itself (gamma 0 chosen by 'auto'): speedup is then None rather than a
  1.00 that would read as measured.
  """
  ar_records: Sequence[ProgramRecord] = ()
  spec_records: Sequence[ProgramRecord] = ()
  quality_info: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  match_rate: float | None = None
  alpha_if_nothing_drafted: float | None = None
  speedup_measured: bool = True


def build(setting: Setting, measured: Measured, costs=None,
          loop: Mapping[str, Any] | None = None, *, predictable: bool = True,
          calibration: Mapping[str, Any] | None = None,
          extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """One metrics.json object. Keys that a mode does not measure are present with value None.

  costs: the lone-extend costs (`timing.Costs`) of this draft, or None. loop: its measured loop
  costs at this temperature (`runner.costs.LoopCosts.to_json()`, timed on the calibration
  prompts), or None. calibration: the calibration decode's {'alpha', 'accept_at_least', ...}.
  `speedup_predicted` is made from calibration data only (its acceptance profile, the loop costs
  and the calibration prompts' N): out of sample when the calibration prompts were held out;
  `speedup_predicted_in_sample` uses this row's own profile and N (`theory.predict` says how).
  predictable: False for an adaptive draft length, which the fixed-gamma formula does not predict
  (both predictions are then None). extra: keys added last.
  """
  spec_records, ar_records = measured.spec_records, measured.ar_records
  stats = acceptance_stats.summarize(acceptance_stats.merge(r.counters for r in spec_records)) \
      if spec_records else {}
  alpha = stats.get("alpha")
  if setting.gamma == 0 and measured.alpha_if_nothing_drafted is not None:
    alpha = measured.alpha_if_nothing_drafted
  pred, pred_in = theory.Prediction(), theory.Prediction()
  if predictable:
    pred, pred_in = _predictions(setting, measured, stats, alpha, costs, loop, calibration)
  speedup, interval = _speedup(measured)
  out = {
      "task": setting.task, "target": setting.target, "draft": setting.draft,
      "temperature": setting.temperature, "gamma": setting.gamma,
      "num_examples": setting.num_examples,
      "alpha": alpha, "acceptance_rate": stats.get("acceptance_rate"),
      "tokens_per_target_call": stats.get("tokens_per_target_call"),
      "mean_gamma": _ratio(stats.get("drafted"), stats.get("target_calls")),
      # c is the draft's, whatever the scheme (an adaptive row has no prediction but its costs)
      "c": pred_in.c if pred_in.c is not None else getattr(costs, "c", None), "v": pred_in.v, "speedup": speedup, "speedup_predicted": pred.speedup,
      "ar_ms_per_token": ms_per_token(ar_records), "spec_ms_per_token": ms_per_token(spec_records),
      "greedy_match_rate": measured.match_rate if setting.temperature == 0 else None,
      "quality": dict(measured.quality_info),
      "accepts_per_position": stats.get("accepts_per_position"),
      "accepted_length_hist": stats.get("accepted_length_hist"),
      **_call_costs(costs),
      "speedup_interval95": interval,
      "alpha_interval95": _alpha_interval(spec_records),
      "num_batches": len(spec_records or ar_records),
      "speedup_predicted_from": pred.source,
      "speedup_predicted_lone_extend": pred.lone_extend,
      "expected_tokens_per_iteration": pred.expected_tokens,
      "speedup_predicted_in_sample": pred_in.speedup,
      "expected_tokens_per_iteration_in_sample": pred_in.expected_tokens,
      "calibration": dict(calibration) if calibration is not None else None,
      "iteration_ms": pred_in.iteration_ms,
      "ar_iteration_ms": loop["ar_ms"] if loop else None,
      "loop_costs": dict(loop) if loop else None,
  }
  out.update(extra or {})
  return out


def _predictions(setting: Setting, measured: Measured, stats, alpha, costs, loop, calibration
                 ) -> tuple[theory.Prediction, theory.Prediction]:
  """(out of sample: from the calibration decode's profile, the loop costs and the calibration
  prompts' N; in sample: from this row's own profile and N)."""
  tokens = _tokens_per_request(measured.ar_records, measured.spec_records, loop) if loop else None
  in_sample = theory.predict(setting.gamma, alpha, costs, temperature=setting.temperature,
                             rule=setting.rule,
                             accepts_per_position=stats.get("accepts_per_position"),
                             loop=loop, tokens=tokens)
  if calibration is None:
    return theory.Prediction(), in_sample
  out = theory.predict(setting.gamma, calibration["alpha"], costs, temperature=setting.temperature,
                       rule=setting.rule, accepts_per_position=calibration.get("accept_at_least"),
                       loop=loop, tokens=(float(loop["tokens"]),) * 2 if loop else None)
  return out, in_sample


def _ratio(num, den) -> float | None:
  return num / den if num is not None and den else None


def _speedup(measured: Measured) -> tuple[float | None, list[float] | None]:
  """(autoregressive wall / speculative wall over the same batches, its bootstrap 95 % interval
  over batches: prompts at batch size 1), or None where nothing was measured."""
  ar, spec = measured.ar_records, measured.spec_records
  if not (ar and spec and measured.speedup_measured):
    return None, None
  ar_s, spec_s = wall(ar)[0], wall(spec)[0]
  if spec_s <= 0:
    return None, None
  interval = None
  if len(ar) == len(spec) and all(r.seconds > 0 for r in spec):  # paired batch by batch
    interval = bootstrap.ratio_interval([r.seconds for r in ar], [r.seconds for r in spec])
  return ar_s / spec_s, list(interval) if interval is not None else None


def _alpha_interval(spec_records) -> list[float] | None:
  """alpha's bootstrap 95 % interval over batches (sum beta / positions, resampled by batch)."""
  rows = [r.counters for r in spec_records or [] if r.counters.get("beta_count")]
  if len(rows) < 2:
    return None
  interval = bootstrap.ratio_interval([c["beta_sum"] for c in rows],
                                      [c["beta_count"] for c in rows])
  return list(interval)


def _call_costs(costs) -> dict[str, Any]:
  """The measured per-call costs a row carries (None where none were measured)."""
  if costs is None:
    return {"target_ms_per_call": None, "draft_ms_per_call": None, "v_curve": None}
  return {"target_ms_per_call": costs.target_ms, "draft_ms_per_call": costs.draft_ms,
          "v_curve": {str(k): val for k, val in costs.v.items()}}


def _tokens_per_request(ar_records, spec_records, loop: Mapping[str, Any]
                        ) -> tuple[float, float]:
  """(N, N') of theory.loop_speedup: this run's autoregressive iterations per batch, and that
  scaled by the speculative decode's emitted tokens over the autoregressive decode's (equal at
  temperature 0; at temperature > 0 the two sample outputs of different lengths). Without
  autoregressive records (MODE='speculative'): the calibration's N for both."""
  its = [r.counters.get("iterations") for r in ar_records or []]
  if not its or any(i is None for i in its):
    return float(loop["tokens"]), float(loop["tokens"])
  n = sum(its) / len(its)
  ar_emitted = sum(r.emitted for r in ar_records)
  spec_emitted = sum(r.emitted for r in spec_records or [])
  return n, (n * spec_emitted / ar_emitted if ar_emitted and spec_emitted else n)


WIDTH = 100  # the printed summary fits a 100-column terminal
QUALITY_NAMES = {"bleu": "BLEU", "rouge": "ROUGE-2", "rougeL": "ROUGE-L",
                 "exact_match": "exact match"}
HEAD = ("draft", "T", "gamma", "n", "alpha [95% CI]", "tokens/call", "speedup [95% CI]",
        "predicted")


def _fmt(x, spec=".3f", suffix="") -> str:
  return "-" if x is None else (format(x, spec) + suffix if isinstance(x, (int, float))
                                else str(x))


def _with_interval(x, interval, spec: str, suffix: str = "") -> str:
  """'0.623 [0.60,0.65]': a value and its bootstrap interval (two decimals), or the value."""
  if x is None:
    return "-"
  text = format(x, spec) + suffix
  return text + (f" [{interval[0]:.2f},{interval[1]:.2f}]" if interval else "")


def _gamma(m: Mapping[str, Any]) -> str:
  """The gamma cell: 3, 'auto 3' (GAMMA='auto' chose 3), 'adapt 2.4' (adaptive: mean draft
  length per target call), '-' (autoregressive only)."""
  if m.get("adaptive") is not None:
    return "adapt " + _fmt(m.get("mean_gamma"), ".1f")
  if m.get("gamma") is None:
    return "-"
  return f"auto {m['gamma']}" if m.get("gamma_auto") else str(m["gamma"])


def _short(name: str, width: int) -> str:
  """`name` within `width` columns, its middle elided (a draft's tail, '/export', says which)."""
  if len(name) <= width:
    return name
  tail = min(8, max(width - 6, 0))
  return name[:width - 3 - tail] + "..." + name[len(name) - tail:]


def wrap(text: str, width: int = WIDTH, indent: str = "  ") -> list[str]:
  """`text` in lines of at most `width` columns, broken between '; '-separated parts (within a
  part too long for a line, between words), later lines indented."""
  lines, line = [], ""
  for part in text.split("; "):
    joined = f"{line}; {part}" if line else part
    if len(joined) <= width or not line:
      line = joined
    else:
      lines.append(line + ";")
      line = indent + part
    while len(line) > width and " " in line[len(indent):width]:
      cut = line.rindex(" ", len(indent) + 1, width + 1)
      lines.append(line[:cut])
      line = indent + line[cut + 1:]
  return lines + [line]


def table(rows: Sequence[Mapping[str, Any]]) -> str:
  """The metrics objects as a table of named metrics, one line per object, within 100 columns:
  alpha and the speedup with their bootstrap 95 % intervals, tokens per target call, the
  out-of-sample prediction, n prompts; 'auto 3' where GAMMA='auto' chose 3, 'adapt 2.4' for the
  adaptive scheme's mean draft length."""
  lines = [HEAD[1:]]
  for m in rows:
    lines.append((
        _fmt(m["temperature"], "g"), _gamma(m), _fmt(m["num_examples"], "d"),
        _with_interval(m["alpha"], m.get("alpha_interval95"), ".3f"),
        _fmt(m["tokens_per_target_call"], ".2f"),
        _with_interval(m["speedup"], m.get("speedup_interval95"), ".2f", "x"),
        _fmt(m["speedup_predicted"], ".2f", "x")))
  widths = [max(len(r[i]) for r in lines) for i in range(len(HEAD) - 1)]
  room = max(WIDTH - sum(widths) - 2 * len(widths), len(HEAD[0]))  # what the draft names get
  names = [HEAD[0]] + [_short(str(m["draft"] or "(autoregressive)"), room) for m in rows]
  widths = [max(len(n) for n in names)] + widths
  return "\n".join("  ".join(cell.ljust(w) for cell, w in zip((n, *r), widths)).rstrip()
                   for n, r in zip(names, lines))


def _quality_note(m: Mapping[str, Any]) -> str | None:
  """'BLEU 12.95 (AR 12.95, inside its 95% CI)', or None without scores."""
  q = m.get("quality") or {}
  metric = q.get("metric")
  spec, ar = (quality.headline(metric, q.get(side)) for side in ("speculative", "autoregressive"))
  name = QUALITY_NAMES.get(metric, metric)
  if spec is None and ar is None:
    return None
  if spec is None:
    return f"{name} {ar:.2f}"
  within = {True: ", inside its 95% CI", False: ", OUTSIDE its 95% CI"}.get(
      q.get("speculative_within_interval"), "")
  return f"{name} {spec:.2f}" + (f" (AR {ar:.2f}{within})" if ar is not None else "")


def _pass_note(m: Mapping[str, Any]) -> str | None:
  """'pass@1 0.312 (AR 0.305, inside its 95% CI)', or None where no code was executed."""
  block = (m.get("quality") or {}).get("pass_at_k") or {}
  ar, spec = ((block.get(s) or {}).get("pass_at_1") for s in ("autoregressive", "speculative"))
  if spec is None and ar is None:
    return None
  if spec is None or ar is None:
    return f"pass@1 {spec if ar is None else ar:.3f}"
  within = {True: ", inside its 95% CI", False: ", OUTSIDE its 95% CI"}.get(
      block.get("speculative_within_interval"), "")
  return f"pass@1 {spec:.3f} (AR {ar:.3f}{within})"


def row_note(m: Mapping[str, Any], label: bool) -> str:
  """One row's quality, greedy match, costs and ms/token (what the table leaves out)."""
  parts = [_quality_note(m), _pass_note(m)]
  if m.get("greedy_match_rate") is not None:
    parts.append(f"greedy match {m['greedy_match_rate']:.2f}")
  if m.get("c") is not None:
    parts.append(f"c {m['c']:.3f}" + (f", v {m['v']:.2f}" if m.get("v") is not None else ""))
  spec_ms, ar_ms = m.get("spec_ms_per_token"), m.get("ar_ms_per_token")
  if spec_ms is not None:
    parts.append(f"{spec_ms:.2f} ms/token" + (f" (AR {ar_ms:.2f})" if ar_ms is not None else ""))
  elif ar_ms is not None:
    parts.append(f"AR {ar_ms:.2f} ms/token")
  parts = [p for p in parts if p]
  head = f"{m['draft'] or '(autoregressive)'} T={m['temperature']:g} gamma {_gamma(m)}: "
  return (head if label else "") + "; ".join(parts)


def summary(rows: Sequence[Mapping[str, Any]], max_notes: int = 4) -> list[str]:
  """What a run prints: what was measured (task, target, prompts, calibration), the table, and
  per row (up to `max_notes` rows; metrics.json has them all) quality, costs and ms/token."""
  tasks = ", ".join(dict.fromkeys(str(m["task"]) for m in rows))
  targets = ", ".join(dict.fromkeys(str(m["target"]) for m in rows))
  cal = next((m["calibration"] for m in rows if m.get("calibration")), None)
  head = f"{tasks}: target {targets}"
  if cal:
    head += (f"; calibrated on {cal['prompts']} " +
             ("held-out prompts" if cal.get("held_out") else "measured prompts (in sample)"))
  out = wrap(head) + table(rows).splitlines()
  if len(rows) <= max_notes:
    for m in rows:
      out += wrap(row_note(m, label=len(rows) > 1))
  else:
    out.append("quality, costs and ms/token of every row: metrics.json")
  return out
