"""The run's points made concrete: GAMMA='auto' chosen, every point given its gamma or scheme.

Why one module with an injected `measure`: the tuner decides, something else measures. It reads
the calibration prompts only through `measure` (lone `extend` costs, untimed decodes with a
scheme, the real loops timed), so the decision is testable without a model (a fake measure) and
the run (`runner.measure.Calibration`: the run's loaded models, prompts and mesh) is one
implementation. What it decides with is runner/calibrate.py (the chains' candidates, the
choice, its confidence, the resolved points) and runner/tree_choice.py (trees beside chains);
every calibration decode and choice is remembered in the run's store, so a resumed run decodes
with the same gammas.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from absl import logging

from specdec_jax import timing
from specdec_jax.runner import calibrate, costs as costs_lib, keys, tree_choice
from specdec_jax.runner.run_config import (ADAPTIVE, AUTO, FEATURE_DRAFT, GAMMA_WORDS, MODEL_DRAFT,
                                           TREE, DraftSpec, Point, RunConfig, as_list, points)
from specdec_jax.runner.store import ResultStore


class Measure(Protocol):
  """What the tuner needs measured, all on the run's calibration prompts.

  sharded: the run decodes on a mesh (no loops are timed there and no tree is weighed: the
    sharded programs are predicted from lone `extend` costs). prompts: how many calibration
    prompts the decodes read. held_out: they are disjoint from the measured ones (both recorded
    with each acceptance).
  """
  sharded: bool
  prompts: int
  held_out: bool

  def costs(self, tokens) -> dict[DraftSpec, timing.Costs]:
    """c and v(T) per draft, for the verify block sizes `tokens`."""

  def decode(self, point: Point, scheme, statistic: Callable) -> dict:
    """statistic(decoder, params, inputs_BxP, rows=prompts) of one untimed decode of every
    calibration prompt by `point`'s draft and temperature with `scheme` (the rows past
    `prompts` pad a batch to a data-parallel mesh)."""

  def loops(self, temperature: float, programs: Mapping[DraftSpec, list]
            ) -> dict[DraftSpec, costs_lib.LoopCosts]:
    """The real loops of each draft's programs (gammas, trees) timed beside the autoregressive
    loop at `temperature`."""


def resolve_points(cfg: RunConfig, measure: Measure, store: ResultStore, log: Callable
                   ) -> tuple[list, dict]:
  """(resolved points, {draft spec: costs}): c and v(T) per draft, the calibration decode's
  acceptance per draft and temperature, the loops' per-iteration costs (one device); then every
  point gets a concrete gamma or scheme (runner/calibrate.py says what is timed and why)."""
  if not cfg.runs_speculative:
    return [], {}
  costs = measure.costs(costs_lib.verify_tokens_needed(cfg.gamma, cfg.gamma_max))
  acceptance_of, gamma_acceptance_of = _acceptances(cfg, measure, store)
  trees = cfg.tree_candidate_schemes()
  # Trees are chosen from timed loops only (one device) and drafted by model drafts (token or
  # feature-level: the tree takes either drafter), not by the model-free drafters.
  tree_acceptance_of = (_tree_acceptances(cfg, measure, store, trees)
                        if trees and not measure.sharded else None)
  pts = points(cfg)
  plans = {}
  for p in (p for p in pts if p.gamma == AUTO):
    tree_fn = (None if tree_acceptance_of is None
               or p.draft.kind not in (MODEL_DRAFT, FEATURE_DRAFT)
               else functools.partial(tree_acceptance_of, p))
    plans[p] = calibrate.plan_auto(p, costs[p.draft], store, functools.partial(acceptance_of, p),
                                   gamma_max=gamma_max(cfg, p), min_speedup=cfg.auto.min_speedup,
                                   rule=cfg.rule, trees=trees, tree_acceptance_fn=tree_fn)
    if cfg.auto.each_gamma:
      plans[p] = calibrate.with_own_profiles(plans[p],
                                             functools.partial(gamma_acceptance_of, p))
    if plans[p].memo is None:
      log(f"GAMMA='auto' for {p.draft.name} at temperature {p.temperature:g}: alpha "
          f"{plans[p].alpha:.3f}; lone-extend prediction " + ", ".join(
              f"{g}: {s:.2f}" for g, s in sorted(plans[p].lone_curve.items()) if g)
          + f"; loops to time: {list(plans[p].candidates) or 'none'}"
          + "".join(f", {costs_lib.loop_key(t)}" for t in plans[p].trees))
  loops = timed_loops(measure, {p: calibrate.loop_gammas(p, plans.get(p)) for p in pts})
  return [_resolve(cfg, p, plans.get(p), costs, loops, gamma_acceptance_of, store, log)
          for p in pts], costs


def _resolve(cfg: RunConfig, p: Point, plan, costs, loops, acceptance_of, store, log):
  """One point's ResolvedPoint: fixed, adaptive or tree as configured; 'auto' chosen (and
  logged with its prediction and confidence). acceptance_of(point, gamma or None): the
  calibration acceptance a point is predicted from (a fixed gamma's own decode with
  `auto_each_gamma`; an 'auto' memo holds its candidates')."""
  loop = loops.get((p.draft, p.temperature))
  cal = None
  if p.gamma not in (ADAPTIVE, TREE):
    own = cfg.auto.each_gamma and p.gamma != AUTO and int(p.gamma) > 0
    cal = acceptance_of(p, int(p.gamma) if own else None)
  if plan is None:
    return calibrate.resolved(p, adaptive=cfg.adaptive_config(), tree=cfg.tree_scheme(),
                              loop=loop, calibration=cal)
  memo = calibrate.choose(plan, costs[p.draft], loop, store, min_speedup=cfg.auto.min_speedup,
                          rule=cfg.rule)
  r = calibrate.resolved(p, memo=memo, loop=loop, calibration=cal, tree=cfg.tree_scheme(),
                         trees=cfg.tree_candidate_schemes())
  log(f"GAMMA='auto' for {p.draft.name} at temperature {p.temperature:g}: alpha "
      f"{r.calibration_alpha:.3f}, c {costs[p.draft].c:.3f}, predicted "
      + ", ".join(f"{g}: {s:.2f}" for g, s in r.predicted_curve + r.tree_curve)
      + f" ({memo.get('curve_from', 'lone_extend')}) -> "
      + (costs_lib.loop_key(r.tree) if r.tree is not None else f"gamma {r.gamma}")
      + (" (plain autoregressive decoding)" if r.gamma == 0 else "")
      + calibrate.describe_confidence(memo.get("confidence", {})))
  return r


def _acceptances(cfg: RunConfig, measure: Measure, store: ResultStore
                 ) -> tuple[Callable, Callable]:
  """(acceptance_of, gamma_acceptance_of). acceptance_of(point) -> the calibration decode's
  {'alpha', 'accept_at_least', 'gamma', 'prompts', 'held_out'} for the point's draft and
  temperature: one untimed decode of all the calibration prompts at the calibration gamma.
  gamma_acceptance_of(point, gamma) -> the same of a decode at `gamma` itself
  (`RunConfig.auto_each_gamma`; None or the calibration gamma: the one decode). Each decode is
  made once and remembered in the store (a resumed run recalls it)."""
  fixed = [int(g) for g in as_list(cfg.gamma) if g not in GAMMA_WORDS]

  calibration_gamma = calibrate.calibration_gamma(cfg.auto.calibration_gamma, cfg.gamma_max,
                                                  fixed)

  def gamma_acceptance_of(p: Point, gamma: int | None) -> dict:
    lookup = _lookup_first(cfg, p)
    cg = min(calibration_gamma, cfg.feature.lookup_gamma) if lookup else calibration_gamma
    gamma = cg if gamma is None else int(gamma)
    key = keys.calibration(p.draft.name, p.temperature)
    key += "" if gamma == cg else f"/gamma{gamma}"
    acc = store.recall("calibration", key)
    # decoded again: a resumed run with another gamma_max, or a lookup-first decode stored
    # before decodes recorded their lookup share (its prediction needs it)
    if acc is None or acc.get("gamma", gamma) != gamma or (lookup and "lookup_share" not in acc):
      acc = measure.decode(p, gamma, functools.partial(calibrate.calibration_acceptance,
                                                       seed=cfg.seed))
      acc = dict(acc, gamma=gamma, prompts=measure.prompts, held_out=measure.held_out)
      store.remember("calibration", key, acc)
    return acc
  return (lambda p: gamma_acceptance_of(p, None)), gamma_acceptance_of


def gamma_max(cfg: RunConfig, p: Point) -> int:
  """The largest draft gamma `p` may decode: RunConfig.gamma_max, or a lookup-first draft's
  lookup_gamma where smaller (its chain verifies lookup_gamma tokens every iteration, and the
  draft's tokens must fit in them: `lookup_first.check_draft_gamma`)."""
  return min(cfg.gamma_max, cfg.feature.lookup_gamma) if _lookup_first(cfg, p) else cfg.gamma_max


def _lookup_first(cfg: RunConfig, p: Point) -> bool:
  """`p` drafts with prompt lookup first (RunConfig.feature_lookup_gamma applies to the model and
  feature-level drafts, not to a prompt-lookup token draft)."""
  return bool(cfg.feature.lookup_gamma) and p.draft.kind in (MODEL_DRAFT, FEATURE_DRAFT)


def _tree_acceptances(cfg: RunConfig, measure: Measure, store: ResultStore, trees) -> Callable:
  """tree_acceptance_of(point) -> `tree_choice.calibration_decodes` on all the calibration
  prompts for the point's draft and temperature (a probe tree decode's a[d][r], a dynamic
  candidate's own decode's tokens per call), each decode made once and remembered in the
  store."""
  def tree_acceptance_of(p: Point) -> dict:
    def decode(suffix, scheme, fn):
      key = keys.calibration(p.draft.name, p.temperature) + "/" + suffix
      acc = store.recall("calibration", key)
      if acc is None:
        acc = measure.decode(p, scheme, lambda d, params, x, rows: fn(d, params, x,
                                                                        seed=cfg.seed))
        store.remember("calibration", key, acc)
      return acc
    return tree_choice.calibration_decodes(trees, decode)
  return tree_acceptance_of


def timed_loops(measure: Measure, gammas: Mapping[Point, Any]) -> dict:
  """{(draft spec, temperature): LoopCosts} for the programs each point needs ({point:
  gammas and trees}), one `measure.loops` per temperature; none on a mesh. A draft whose loop
  costs are within the timing noise (a full decode no slower than one with no iteration) is
  left out, with a warning: its points predict from lone `extend` costs instead."""
  need: dict = {}
  for p, gs in gammas.items():
    if gs:
      need.setdefault(p.temperature, {}).setdefault(p.draft, set()).update(gs)
  if measure.sharded or not need:
    return {}
  out = {}
  for t, by_draft in need.items():
    loops = measure.loops(t, {d: sorted(gs, key=costs_lib.loop_order)
                              for d, gs in by_draft.items()})
    for d, lc in loops.items():
      if lc.unresolved():
        logging.warning("loop costs at temperature %g, %s: the iteration cost of %s is within "
                        "the timing noise (a full decode no slower than one with no iteration); "
                        "predicting from lone extend costs instead", t, d.name,
                        ", ".join(lc.unresolved()))
        continue
      out[(d, t)] = lc
  return out

