"""From the result files to metrics.json, TensorBoard summaries, plots and the printed table.

Why from the files: the store's batch records and prediction lines are the single source of truth
(they survive a kill), so the metrics of a resumed run cover each example exactly once.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from specdec_jax.metrics import acceptance_stats, code_exec, quality, report, theory
from specdec_jax.metrics.tensorboard import RunWriter, run_dir
from specdec_jax.runner.run_config import FEATURE_DRAFT, MODEL_DRAFT, RunConfig, temperatures
from specdec_jax.runner import keys, lookup_mix
from specdec_jax.runner.costs import loop_key
from specdec_jax.runner.pipeline import Loaded
from specdec_jax.runner.store import ResultStore

METRICS_FILE = "metrics.json"


def _quality(metric: str, preds: list[dict], with_ar: bool, with_spec: bool,
             examples=()) -> dict[str, Any]:
  """The quality block; with `pass_at_k` (code run against its tests) where every predicted
  example is a problem with unit tests (`problems`)."""
  refs = [p.get("reference") for p in preds]
  spec_texts = [p.get("text") for p in preds] if with_spec else None
  if with_ar:
    ar_texts = [p.get("autoregressive_text", p.get("text") if not with_spec else None)
                for p in preds]
  else:
    ar_texts = None
  out = report.quality_block(metric, refs, ar_texts, spec_texts)
  tests = problems(examples, preds)
  if tests is not None:
    out["pass_at_k"] = code_exec.block(tests, ar_texts, spec_texts)
  return out


def problems(examples, preds: list[dict]) -> list[dict] | None:
  """Per prediction, its example as a problem to execute ({prompt, test, entry_point, task_id,
  completion_form}: HumanEval's fields), or None unless every predicted example has them. The
  prompt is the problem's own text (a chat-templated example keeps it as `source_text`: the
  model read the template, the program runs the problem)."""
  by_index = {ex.index: ex for ex in examples}
  out = []
  for p in preds:
    ex = by_index.get(p.get("index"))
    meta = ex.metadata if ex is not None else {}
    if ex is None or ex.inputs is None or not {"test", "entry_point"} <= set(meta):
      return None
    out.append({"prompt": meta.get("source_text", ex.inputs), "test": meta["test"],
                "entry_point": meta["entry_point"], "task_id": str(meta.get("task_id", ex.index)),
                "completion_form": meta.get("completion_form", "body")})
  return out or None


def point_metrics(cfg: RunConfig, loaded: Loaded, store: ResultStore, point, costs) -> dict:
  group = keys.group(point.temperature)
  batches = store.group_batches(group)
  spec_records = [b.points[point.key] for b in batches if point.key in b.points]
  ar_records = ([b.autoregressive for b in batches if b.autoregressive is not None]
                if cfg.runs_autoregressive else [])
  preds = store.run_predictions(point.key)
  metric = quality.metric_for(cfg.task, loaded.prompts.input_field)
  has_ar = cfg.runs_autoregressive and all("autoregressive_output_ids" in p for p in preds)
  match = (report.greedy_match_rate([p["output_ids"] for p in preds],
                                    [p["autoregressive_output_ids"] for p in preds])
           if has_ar else None)
  extra = {"mode": cfg.mode, "run": point.key, "gamma_auto": point.auto}
  if point.draft.kind == FEATURE_DRAFT:  # a FeatureDrafter: alpha over drafted positions
    extra["draft_kind"] = FEATURE_DRAFT
    if cfg.feature.parallel:  # FeatureDrafter(parallel=True): one call per block
      extra["feature_scheme"] = "parallel"
  if cfg.feature.lookup_gamma and point.draft.kind in (FEATURE_DRAFT, MODEL_DRAFT):
    # LookupFeatureDrafter / LookupTokenDrafter: prompt lookup where it matches
    calls = sum(r.counters.get("target_calls", 0) for r in spec_records)
    if point.draft.kind == FEATURE_DRAFT:
      extra["feature_scheme"] = "lookup"
    extra["lookup"] = {
        "gamma": cfg.feature.lookup_gamma, "ngram": cfg.feature.lookup_ngram,
        "share_of_target_calls": (sum(r.counters.get("lookup_iterations", 0)
                                      for r in spec_records) / calls) if calls else None}
    extra.update(lookup_prediction(point, costs.get(point.draft), spec_records,
                                   extra["lookup"]["share_of_target_calls"]))
  if point.auto:
    extra["auto_calibration_alpha"] = point.calibration_alpha
    curve = point.predicted_curve + point.tree_curve  # gammas, then trees by label
    extra["auto_predicted_speedup"] = {str(g): s for g, s in curve}
    extra["auto_lone_extend_speedup"] = {str(g): s for g, s in point.lone_curve}
    best = max(((g, sp) for g, sp in curve if g != 0), key=lambda x: x[1], default=(None, None))
    if point.tree is not None:  # chosen from the timed tree loop and the calibration tree decode
      extra["speedup_predicted"] = dict(point.tree_curve)[loop_key(point.tree)]
      extra["speedup_predicted_from"] = "loop"
    extra["auto_gate"] = {"min_speedup": cfg.auto.min_speedup, "best_gamma": best[0],
                          "best_predicted": best[1], "passed": point.gamma > 0}
    if point.lead_se:  # the choice: the smallest gamma within one standard error of the best
      extra["auto_gate"]["lead_se"] = {str(g): x for g, x in point.lead_se}
    if point.confidence:  # how far the choice cleared the gate and the runner-up (SE units)
      extra["auto_gate"]["confidence"] = dict(point.confidence)
  if point.adaptive is not None:
    extra["adaptive"] = dataclasses.asdict(point.adaptive)
  if point.tree is not None:  # accepts_per_position: the first `gamma` (= depth) entries count
    extra["tree"] = tree_block(point.tree, spec_records)
  # gamma 0 chosen by 'auto': nothing was drafted (alpha is the calibration decode's) and the
  # decode IS the baseline program, so there is no speedup to measure (None, not a 1.00 that
  # would read as measured).
  fallback_alpha = point.calibration_alpha if (point.auto and point.gamma == 0) else None
  if fallback_alpha is not None:
    extra["speedup_not_measured"] = "GAMMA='auto' chose 0: the baseline program itself"
  setting = report.Setting(cfg.task, loaded.target_name, point.draft.name, point.temperature,
                           point.gamma, len(preds), rule=cfg.rule)
  measured = report.Measured(ar_records, spec_records,
                             _quality(metric, preds, has_ar, True, loaded.prompts.examples),
                             match, alpha_if_nothing_drafted=fallback_alpha,
                             speedup_measured=fallback_alpha is None)
  return report.build(setting, measured, costs.get(point.draft),
                      point.loop.to_json() if point.loop is not None else None,
                      predictable=(point.adaptive is None and point.tree is None
                                   and "lookup" not in extra),  # one chain's formula only
                      calibration=point.calibration,
                      extra=extra)


def lookup_prediction(point, draft_costs, spec_records, measured_share) -> dict:
  """A lookup-first row's predictions (the record's keys; empty where a piece is missing): the
  formula's E and the loop's iteration (`theory.loop_speedup`), the iteration moved from the
  timed decode's lookup share to the calibration decode's (`lookup_mix.at_shares`, as 'auto'
  chose: the draft's calls at draft_gamma lone steps), E from the calibration decode's profile,
  both decoded in the run's batch shape (`runner.measure.Calibration.decode`). The in-sample
  twin uses the measured share and profile. Why not the chain's formula: its iteration is one
  program's, while a lookup-first iteration is one of two whose mix differs from prompt to
  prompt."""
  loop, cal, g = point.loop, point.calibration or {}, point.gamma
  if (loop is None or draft_costs is None or g not in loop.lookup_share or cal.get("gamma") != g
      or "lookup_share" not in cal or measured_share is None or not spec_records):
    return {}
  def predict(share, accept_at_least):
    profile = [a or 0.0 for a in accept_at_least]  # E = 1 + sum A_i, for either rule
    tokens = theory.expected_tokens_per_iteration(0.0, len(profile), "tokenwise", profile)
    moved = lookup_mix.at_shares(loop, {g: share}, draft_costs.draft_ms)  # what 'auto' reads
    return tokens, moved.iteration_ms[g], moved.speedup(g, tokens)
  tokens, _, speedup = predict(cal["lookup_share"], cal["accept_at_least"])
  stats = acceptance_stats.summarize(acceptance_stats.merge(r.counters for r in spec_records))
  tokens_in, ms_in, speedup_in = predict(measured_share, stats["accepts_per_position"])
  return {"speedup_predicted": speedup, "speedup_predicted_from": "loop, lookup share",
          "expected_tokens_per_iteration": tokens, "speedup_predicted_in_sample": speedup_in,
          "expected_tokens_per_iteration_in_sample": tokens_in, "iteration_ms": ms_in}


def tree_block(scheme, spec_records) -> dict:
  """A tree row's `tree`: its shape and verifier, and node_acceptance_rate = accepted / (target
  calls x drafted nodes) beside the per-path `acceptance_rate` (metrics/acceptance_stats.py)."""
  tree = scheme.tree
  totals = acceptance_stats.merge(r.counters for r in spec_records)
  nodes = totals["target_calls"] * (tree.num_nodes - 1)
  shape = ({"parents": list(tree.parents)} if hasattr(tree, "parents")
           else {"dynamic": dataclasses.asdict(tree)})  # a dynamic tree: its budget
  return {**shape, "nodes": tree.num_nodes, "depth": tree.max_depth,
          "verifier": str(scheme.verifier),
          "node_acceptance_rate": totals["accepted"] / nodes if nodes else None}


def ar_metrics(cfg: RunConfig, loaded: Loaded, store: ResultStore, temperature: float) -> dict:
  group = keys.group(temperature)
  ar_records = [b.autoregressive for b in store.group_batches(group)
                if b.autoregressive is not None]
  preds = store.run_predictions(keys.autoregressive(temperature))
  metric = quality.metric_for(cfg.task, loaded.prompts.input_field)
  setting = report.Setting(cfg.task, loaded.target_name, None, temperature, None, len(preds))
  measured = report.Measured(ar_records, [],
                             _quality(metric, preds, True, False, loaded.prompts.examples))
  return report.build(setting, measured, extra={
      "mode": cfg.mode, "run": keys.autoregressive(temperature), "gamma_auto": False})


def collect(cfg: RunConfig, loaded: Loaded, store: ResultStore, resolved, costs) -> list[dict]:
  if resolved:
    return [point_metrics(cfg, loaded, store, p, costs) for p in resolved]
  return [ar_metrics(cfg, loaded, store, t) for t in temperatures(cfg)]


def write_outputs(cfg: RunConfig, output_dir: str, metrics: list[dict]) -> None:
  """metrics.json (an object, or a list for a sweep), TensorBoard finals, sweep plots."""
  payload = metrics if (cfg.is_sweep or len(metrics) != 1) else metrics[0]
  tmp = os.path.join(output_dir, METRICS_FILE + ".tmp")
  with open(tmp, "w") as f:
    json.dump(finite_json(payload), f, indent=2, sort_keys=True, allow_nan=False)
  os.replace(tmp, os.path.join(output_dir, METRICS_FILE))
  for m in metrics:
    w = RunWriter(run_dir(output_dir, m["run"]))
    w.final(m, step=m["num_examples"])
    w.hparams(hparams(cfg, m))
    w.close()
  if cfg.is_sweep and cfg.plots:
    from specdec_jax.metrics import plots
    plots.plot_sweep(metrics, output_dir)


def hparams(cfg: RunConfig, m: dict) -> dict[str, Any]:
  """One row's configuration for TensorBoard's HParams view: the same names and types on every
  row (the view compares rows across sweeps and output directories), no None."""
  if m.get("adaptive") is not None:
    setting = "adaptive"
  elif m.get("gamma") is None:
    setting = "-"  # autoregressive only
  else:
    setting = "auto" if m.get("gamma_auto") else str(m["gamma"])
  return {"task": str(m["task"]), "target": str(m["target"]),
          "draft": str(m["draft"] or "(autoregressive)"), "temperature": float(m["temperature"]),
          "gamma": int(m["gamma"] or 0), "gamma_setting": setting, "rule": str(cfg.rule),
          "top_k": int(cfg.top_k), "top_p": float(cfg.top_p), "batch_size": int(cfg.batch_size),
          "num_examples": int(m["num_examples"]), "max_decode_length": int(cfg.max_decode_length),
          "draft_head_vocab": int(cfg.draft_head_vocab), "calibration": str(cfg.calibration),
          "mode": str(cfg.mode)}


def finished_metrics(store: ResultStore, output_dir: str) -> list[dict] | None:
  """The metrics objects a finished run wrote (its store says it finished and metrics.json is
  there), else None. Why: re-running a finished run re-calibrated for 40 s and rewrote c, v and
  the prediction beside the first run's measured speedup, two runs mixed in one file; a store
  with the same fingerprint has nothing left to measure."""
  path = os.path.join(output_dir, METRICS_FILE)
  if not store.recall("finished", "metrics") or not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    stored = json.load(f)
  return stored if isinstance(stored, list) else [stored]


def finite_json(obj: Any) -> Any:
  """`obj` with every non-finite float as None: metrics.json stays standard JSON (NaN and
  Infinity are not JSON, and a reader in another language rejects them)."""
  if isinstance(obj, float) and not math.isfinite(obj):
    return None
  if isinstance(obj, dict):
    return {k: finite_json(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [finite_json(v) for v in obj]
  return obj


def sweep_notes(metrics: list[dict]) -> list[str]:
  """Per draft and temperature: the gamma 'auto' chose beside the best measured gamma."""
  notes = []
  keys = sorted({(m["draft"], m["temperature"]) for m in metrics}, key=str)
  for draft, temp in keys:
    rows = [m for m in metrics if m["draft"] == draft and m["temperature"] == temp]
    measured = [m for m in rows if m["speedup"] is not None and not m.get("gamma_auto")]
    auto = [m for m in rows if m.get("gamma_auto")]
    if len(measured) > 1 or auto:
      best = max(measured, key=lambda m: m["speedup"], default=None)
      text = f"{draft} @ temperature {temp:g}: "
      if best is not None:
        text += f"swept optimum gamma {best['gamma']} ({best['speedup']:.2f}x measured)"
      if auto:
        a = auto[0]
        measured_text = ("plain autoregressive decoding, no speedup to measure"
                         if a["speedup"] is None else f"{a['speedup']:.2f}x measured")
        text += (f"{'; ' if best else ''}GAMMA='auto' chose {a['gamma']} "
                 f"(calibration alpha {a.get('auto_calibration_alpha') or 0:.3f}, "
                 f"{measured_text})")
        if (a.get("auto_gate") or {}).get("confidence", {}).get("within_noise"):
          text += (" -- within noise of the gate or the runner-up (auto_gate.confidence): "
                   "another run may choose otherwise")
      notes.append(text)
  return notes
