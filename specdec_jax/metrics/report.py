"""metrics.json objects (DESIGN's public contract) and the printed Table-2-style summary.

Why pure functions over stored batch records: the numbers a run publishes are recomputed from
`batches.jsonl` and `predictions.jsonl` (see runner/store.py), so a resumed run reports every
example once, and tests can check the arithmetic without decoding anything.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from specdec_jax.metrics import acceptance, bootstrap, quality, theory
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
  stats = acceptance.summarize(acceptance.merge(r.counters for r in spec_records)) \
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
      "c": pred_in.c, "v": pred_in.v, "speedup": speedup, "speedup_predicted": pred.speedup,
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


def _fmt(x, spec=".3f") -> str:
  return "-" if x is None else format(x, spec) if isinstance(x, (int, float)) else str(x)


def table(rows: Sequence[Mapping[str, Any]]) -> str:
  """A Table-2-style text table: one line per metrics object."""
  head = ("task", "draft", "temp", "gamma", "alpha", "c", "v", "speedup", "predicted",
          "AR ms/tok", "spec ms/tok", "match", "quality AR", "quality spec", "in AR 95% CI")
  lines = [head]
  for m in rows:
    q = m.get("quality") or {}
    metric = q.get("metric")
    lines.append((
        str(m["task"]), str(m["draft"]), _fmt(m["temperature"], "g"), _fmt(m["gamma"], "d"),
        _fmt(m["alpha"]), _fmt(m["c"]), _fmt(m["v"], ".2f"), _fmt(m["speedup"], ".2f"),
        _fmt(m["speedup_predicted"], ".2f"), _fmt(m["ar_ms_per_token"], ".2f"),
        _fmt(m["spec_ms_per_token"], ".2f"), _fmt(m["greedy_match_rate"], ".2f"),
        _fmt(quality.headline(metric, q.get("autoregressive")), ".2f"),
        _fmt(quality.headline(metric, q.get("speculative")), ".2f"),
        {True: "yes", False: "NO"}.get(q.get("speculative_within_interval"), "-")))
  widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
  return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in lines)
