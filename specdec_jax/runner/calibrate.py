"""Per-run cost measurement and GAMMA='auto' resolution: lone `extend` costs, the real loops'
per-iteration costs, and the calibration decode's acceptance.

Why per run: costs depend on the machine, the batch shape and the models, so they are measured in
the process that decodes, on the run's own prompts, right before the timed decode. The chosen gamma
is remembered in run_state.json so a resumed run keeps decoding with the same gamma.

Two cost measurements:
- lone `extend` calls (`measure`, timing.measure_costs_many): c (draft step / target step) and
  the verify curve v(T) on caches as long as the loop's. They are the record's `c` and `v` (public
  contract) and the lone-extend model theory.predicted_speedup; on a mesh they are all there is.
- the loops themselves (`measure_loops`, one device): for each gamma a run needs, the program the
  run decodes with (the run's `Decoder` with `Chain(gamma)`, or `Autoregressive()`) is compiled
  once with a dynamic iteration cap (`Decoder.generate(..., max_iterations=cap)`) and timed through
  `timing.interleaved` on the calibration prompts, in the run's batch shape, all gammas and the
  autoregressive loop side by side: uncapped (the full decode of those prompts) and with cap 0
  (prefill, layout and finish only). T_iter(G) = (full - capped at 0) / iterations, the same for
  the autoregressive loop, and the cap-0 time is the per-request fixed cost. These are what an
  iteration really costs: the draft steps with their sampling over V, the two-token first draft
  call, verification, acceptance, commit and the loop glue, which lone `extend` calls leave out
  (on the default CPU run they predicted 1.21x from 5.5 ms per iteration where 7.1 ms and 1.00x
  were measured). A run predicts with theory.loop_speedup from these.
Which gammas get a loop compiled (each is one more compile of a whole decode program, seconds on
2 cores): every fixed gamma of the run (its record's prediction needs it) and, for 'auto', at most
`MAX_CANDIDATES` gammas: those the lone-extend model ranks best, without the ones it predicts
below `PRUNE_BELOW` x max(min_speedup, 1). The lone-extend model leaves out per-iteration glue
that grows with gamma, so it is optimistic by a smooth, gamma-dependent amount (1.21 / 1.00
above): its ranking picks the neighbourhood of the optimum, and a gamma it already predicts well
below the bar cannot clear it. It predicts the loop part only; the per-request fixed costs (the
same prefill on both sides, plus the draft's on the speculative one) only pull a speedup towards
1, so they cannot lift a gamma below 1 over the bar either. The margin (0.8) absorbs the lone
timings' own noise (they are taken minutes before the loops on a shared machine). When every
gamma is pruned, 'auto' chooses 0 without compiling a loop.

The acceptance side: a short untimed calibration decode (`calibration_acceptance`) on the first
prompts, at gamma_max, gives alpha and the profile A_i = P(at least i drafts kept), i =
1..gamma_max. Expected tokens per iteration are 1 + sum A_i for either rule (metrics/theory.py):
A_i does not depend on the gamma decoded, so one decode at gamma_max serves every candidate, and
unlike alpha^i it holds when acceptances cluster (prompt lookup copies a span or nothing).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from specdec_jax import distributed, timing
from specdec_jax.decoding.autoregressive import Autoregressive
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.speculative import Chain
from specdec_jax.metrics import acceptance, theory
from specdec_jax.runner import keys
from specdec_jax.runner.config import ADAPTIVE, AUTO, GAMMA_WORDS, DraftSpec, Point, as_list

# 'auto' compiles and times the real loop for at most this many candidate gammas ...
MAX_CANDIDATES = 3
# ... and none the lone-extend model predicts below this fraction of min_speedup.
PRUNE_BELOW = 0.8
# Rounds of the loops' interleaved timing (medians; each round decodes the calibration prompts
# once per program).
LOOP_REPEATS = 5


@dataclasses.dataclass(frozen=True)
class LoopCosts:
  """The real loops' costs on the calibration prompts, ms (medians, `timing.interleaved`).

  ar_ms: one autoregressive iteration (one token per active row). ar_fixed_ms: the autoregressive
    program with no iteration (prefill, buffer layout, finish), per batch.
  iteration_ms: {gamma: one speculative iteration}. fixed_ms: {gamma: its program with no
    iteration (both prefills)}, per batch.
  tokens: autoregressive iterations per calibration batch (N of theory.loop_speedup: tokens per
    request at batch 1).
  tokens_per_iteration: {gamma: tokens written per target call per row on the calibration decode}
    (for comparison with the expected length the prediction uses).
  batches, rows: how many batches of the run's shape, and rows each, were decoded.
  """

  ar_ms: float
  ar_fixed_ms: float
  tokens: float
  iteration_ms: Mapping[int, float]
  fixed_ms: Mapping[int, float]
  tokens_per_iteration: Mapping[int, float]
  batches: int
  rows: int

  def to_json(self) -> dict[str, Any]:
    """The record's `loop_costs` (what report.build reads; gamma keys as strings)."""
    return {"ar_ms": self.ar_ms, "ar_fixed_ms": self.ar_fixed_ms, "tokens": self.tokens,
            "iteration_ms": {str(g): v for g, v in sorted(self.iteration_ms.items())},
            "fixed_ms": {str(g): v for g, v in sorted(self.fixed_ms.items())},
            "tokens_per_iteration": {str(g): v for g, v in sorted(self.tokens_per_iteration.items())},
            "batches": self.batches, "rows": self.rows}

  def speedup(self, gamma: int, tokens_per_iteration: float) -> float:
    """theory.loop_speedup at `gamma` with its fixed costs, N = the calibration's tokens."""
    return theory.loop_speedup(tokens_per_iteration, self.ar_ms, self.iteration_ms[gamma],
                               tokens=self.tokens, ar_fixed=self.ar_fixed_ms,
                               spec_fixed=self.fixed_ms[gamma])


@dataclasses.dataclass(frozen=True)
class ResolvedPoint:
  """A speculative point with a concrete gamma (0 = autoregressive) and how it was chosen.

  adaptive: the AdaptiveConfig of a GAMMA='adaptive' point (gamma is then its gamma_max).
  predicted_curve: 'auto''s {gamma: predicted speedup} over the gammas whose loop was timed (the
    lone-extend curve where none was, on a mesh). lone_curve: the lone-extend prediction for every
    gamma up to gamma_max (what pruned the candidates).
  loop: the measured loop costs of this point's draft and temperature (None on a mesh, for an
    adaptive point, or for gamma 0).
  """

  draft: DraftSpec
  gamma: int
  temperature: float
  auto: bool = False
  calibration_alpha: float | None = None
  predicted_curve: tuple[tuple[int, float], ...] = ()
  adaptive: Any = None
  lone_curve: tuple[tuple[int, float], ...] = ()
  loop: LoopCosts | None = None

  @property
  def key(self) -> str:
    label = AUTO if self.auto else ADAPTIVE if self.adaptive is not None else self.gamma
    return keys.point(self.draft.name, label, self.temperature)


def verify_tokens_needed(gammas, gamma_max: int) -> list[int]:
  """Block sizes T whose verify cost v(T) a run needs: G + 1 per fixed G, 1..gamma_max+1 for auto."""
  needed = {1} | {g + 1 for g in as_list(gammas) if g not in GAMMA_WORDS}
  if any(g == AUTO for g in as_list(gammas)):
    needed |= set(range(1, gamma_max + 2))
  return sorted(needed)


def measure(target, target_params, drafts: dict, inputs_BxP, tokens, repeats: int = 10, *,
            max_decode_len: int | None = None) -> dict[DraftSpec, timing.Costs]:
  """Costs per draft spec, on caches as long as the decode loop's; the target curve is measured
  once and shared."""
  return timing.measure_costs_many(target, target_params, drafts, inputs_BxP, tokens, repeats,
                                   max_decode_len=max_decode_len)


def agree(costs: dict[DraftSpec, timing.Costs]) -> dict[DraftSpec, timing.Costs]:
  """Process 0's costs on every process (one process: unchanged): GAMMA='auto' must choose the
  same gamma everywhere, and each process's own timings differ."""
  keys_ = list(costs)
  rows = distributed.agree([[c.target_ms, c.draft_ms, c.c, sorted(c.v.items())]
                            for c in costs.values()])
  return {k: timing.Costs(t, d, c, {int(n): float(x) for n, x in v})
          for k, (t, d, c, v) in zip(keys_, rows)}


# ---- acceptance on the calibration prompts -------------------------------------------------------
def effective_rule(rule: str, temperature: float) -> str:
  """The rule whose expected length applies: at temperature 0 (one-hot p and q) block
  verification keeps exactly what token-wise verification keeps."""
  return "tokenwise" if float(temperature) == 0.0 else rule


def calibration_gamma(gamma: int, gamma_max: int) -> int:
  """The calibration decode's gamma: at least gamma_max, so that its profile A_i covers every
  candidate (`gamma` is RunConfig.auto_calibration_gamma)."""
  return max(gamma, gamma_max)


def calibration_acceptance(decoder: Decoder, params: Params, inputs_BxP, *, rows: int,
                           seed: int) -> dict[str, Any]:
  """{'alpha', 'accept_at_least'} of a short speculative decode (`decoder`, at the calibration
  gamma) of `inputs_BxP` over its first `rows` rows (the rest pads the batch to a data-parallel
  mesh and is not a prompt): alpha = sum beta / positions; accept_at_least[i - 1] = fraction of
  target calls that kept at least i drafts (A_i of metrics/theory.py), i = 1..gamma."""
  res = decoder.generate(params, inputs_BxP, jax.random.key(seed + 7919))
  counters = distributed.gather(res.counters)  # rows of every process
  stats = acceptance.summarize(acceptance.counters_to_dict(counters, rows))
  return {"alpha": acceptance.alpha_of(counters, rows),
          "accept_at_least": [a or 0.0 for a in stats["accepts_per_position"]]}


# ---- the loops' own costs ------------------------------------------------------------------------
def measure_loops(template: Decoder, target_params,
                  drafts: Mapping[Any, tuple[Any, Any, Sequence[int]]],
                  batches: Sequence[jax.Array], *, seed: int, repeats: int = LOOP_REPEATS
                  ) -> dict[Any, LoopCosts]:
  """{key: LoopCosts} for drafts {key: (draft, params, gammas >= 1)}, all on `batches` (inputs of
  the run's batch shape; each program decodes all of them per call), timed side by side with the
  autoregressive loop in one `timing.interleaved` call (see the module docstring). `template`:
  the run's autoregressive Decoder (target, sampling, rule, lengths); each draft's programs are
  the same Decoder with the draft and `Chain(gamma)`."""
  full_cap = jnp.int32(template.max_decode_len + 1)  # every iteration writes >= 1 token per row
  zero_cap = jnp.int32(0)
  rng = jax.random.key(seed + 7919)

  def program(decoder, params, cap):
    return lambda: [jax.block_until_ready(decoder.generate(params, x, rng, max_iterations=cap))
                    for x in batches]

  ar = dataclasses.replace(template, draft=None, scheme=Autoregressive())
  programs = {("ar", 0, "full"): program(ar, Params(target_params), full_cap),
              ("ar", 0, "zero"): program(ar, Params(target_params), zero_cap)}
  for key, (draft, params, gammas) in drafts.items():
    for g in gammas:
      spec = dataclasses.replace(template, draft=draft, scheme=Chain(g))
      programs[(key, g, "full")] = program(spec, Params(target_params, params), full_cap)
      programs[(key, g, "zero")] = program(spec, Params(target_params, params), zero_cap)
  results, seconds = timing.interleaved(programs, repeats)
  return {key: _loop_costs(results, seconds, key, gammas, len(batches))
          for key, (_, _, gammas) in drafts.items()}


def _loop_costs(results, seconds, key, gammas, n_batches: int) -> LoopCosts:
  """One draft's LoopCosts from `measure_loops`'s timings (the autoregressive ones shared)."""
  def per_iteration(key, g):
    counts = [acceptance.counters_to_dict(r.counters) for r in results[(key, g, "full")]]
    iterations = sum(c["iterations"] for c in counts)
    ms = 1e3 * max(seconds[(key, g, "full")] - seconds[(key, g, "zero")], 0.0) / max(iterations, 1)
    return ms, 1e3 * seconds[(key, g, "zero")] / n_batches, iterations, counts

  ar_ms, ar_fixed, ar_iterations, _ = per_iteration("ar", 0)
  it, fixed, tpi = {}, {}, {}
  for g in sorted(gammas):
    it[g], fixed[g], _, counts = per_iteration(key, g)
    merged = acceptance.merge(counts)
    tpi[g] = merged["emitted"] / max(merged["target_calls"], 1)
  # A longer block never makes an iteration cheaper: a dip is the noise of a shared machine
  # (taken at face value, 'auto' would favour that gamma). Running maximum, as for v(T).
  for prev, g in zip(sorted(it), sorted(it)[1:]):
    it[g] = max(it[g], it[prev])
  first = results[("ar", 0, "full")]
  return LoopCosts(ar_ms=ar_ms, ar_fixed_ms=ar_fixed, tokens=ar_iterations / n_batches,
                   iteration_ms=it, fixed_ms=fixed, tokens_per_iteration=tpi,
                   batches=n_batches, rows=int(first[0].tokens_BxN.shape[0]))


# ---- resolving points ----------------------------------------------------------------------------
@dataclasses.dataclass
class AutoPlan:
  """An 'auto' point between its calibration decode and its loop timing.

  memo: the stored choice ({'gamma', 'alpha', 'curve', ...}) once made (or recalled on resume).
  candidates: gammas whose loop must be timed before choosing (empty once chosen).
  """

  point: Point
  memo: dict | None
  candidates: tuple[int, ...] = ()
  alpha: float | None = None
  accept_at_least: tuple[float, ...] | None = None
  lone_curve: dict[int, float] = dataclasses.field(default_factory=dict)


def lone_curve(alpha: float, costs: timing.Costs, gamma_max: int, rule: str = "tokenwise",
               accept_at_least: Sequence[float] | None = None) -> dict[int, float]:
  """The lone-extend prediction for gamma = 0..gamma_max where v(gamma + 1) was measured, with
  the expected length of the measured profile (alpha's formula without one)."""
  curve = theory.speedup_curve(alpha, costs.c, costs.v, gamma_max)
  if rule == "tokenwise" and accept_at_least is None:
    return curve
  return {g: 1.0 if g == 0 else theory.loop_speedup(
      theory.expected_tokens_per_iteration(alpha, g, rule, accept_at_least), 1.0,
      g * costs.c + costs.v[g + 1]) for g in curve}


def candidates(curve: Mapping[int, float], min_speedup: float,
               max_candidates: int = MAX_CANDIDATES, prune_below: float = PRUNE_BELOW
               ) -> tuple[int, ...]:
  """The gammas >= 1 whose real loop 'auto' times: the best `max_candidates` of the lone-extend
  curve, none predicted below prune_below x max(min_speedup, 1) (see the module docstring)."""
  floor = prune_below * max(min_speedup, 1.0)
  kept = sorted((g for g in curve if g > 0 and curve[g] >= floor), key=lambda g: -curve[g])
  return tuple(sorted(kept[:max_candidates]))


def plan_auto(point: Point, costs: timing.Costs, store, acceptance_fn, *, gamma_max: int,
              min_speedup: float, rule: str) -> AutoPlan:
  """The candidates an 'auto' point needs timed (acceptance_fn() -> calibration_acceptance's
  dict, called once), or its remembered choice."""
  memo = store.recall("gammas", keys.auto_choice(point.draft.name, point.temperature))
  if memo is not None:
    return AutoPlan(point, memo)
  acc = acceptance_fn()
  alpha = float(acc["alpha"])
  rule = effective_rule(rule, point.temperature)
  a_i = tuple(acc["accept_at_least"]) if acc.get("accept_at_least") else None
  curve = lone_curve(alpha, costs, gamma_max, rule, a_i)
  return AutoPlan(point, None, candidates(curve, min_speedup), alpha, a_i, curve)


def choose(plan: AutoPlan, costs: timing.Costs, loop: LoopCosts | None, store, *,
           min_speedup: float, rule: str) -> dict:
  """Makes (and remembers) the choice of a planned 'auto' point: the best of its timed
  candidates by theory.loop_speedup, 0 if none beats min_speedup; without loop costs (a mesh) the
  lone-extend curve decides."""
  if plan.memo is not None:
    return plan.memo
  rule = effective_rule(rule, plan.point.temperature)
  if loop is not None and plan.candidates:
    curve = {0: 1.0}
    for g in plan.candidates:
      e = theory.expected_tokens_per_iteration(plan.alpha, g, rule, plan.accept_at_least)
      curve[g] = loop.speedup(g, e)
    source = "loop"
  elif loop is None and plan.candidates:
    curve, source = dict(plan.lone_curve), "lone_extend"
  else:  # every gamma pruned: nothing compiled, nothing predicted to help
    curve, source = {0: 1.0}, "pruned"
  memo = {"gamma": theory.best_gamma(curve, min_speedup), "alpha": plan.alpha, "c": costs.c,
          "curve": [[g, s] for g, s in sorted(curve.items())], "curve_from": source,
          "lone_curve": [[g, s] for g, s in sorted(plan.lone_curve.items())],
          "candidates": list(plan.candidates)}
  if plan.accept_at_least is not None:
    memo["accept_at_least"] = list(plan.accept_at_least)
  store.remember("gammas", keys.auto_choice(plan.point.draft.name, plan.point.temperature), memo)
  return memo


def loop_gammas(point: Point, plan: AutoPlan | None) -> tuple[int, ...]:
  """The gammas whose loop this point needs timed: its fixed gamma, or an 'auto' point's
  candidates (or its remembered choice); none for 'adaptive' or gamma 0."""
  if point.gamma == ADAPTIVE:
    return ()
  if plan is None:
    return (int(point.gamma),) if int(point.gamma) > 0 else ()
  if plan.memo is not None:
    return (int(plan.memo["gamma"]),) if int(plan.memo["gamma"]) > 0 else ()
  return plan.candidates


def resolved(point: Point, *, adaptive=None, memo: dict | None = None,
             loop: LoopCosts | None = None) -> ResolvedPoint:
  """The ResolvedPoint of a fixed, adaptive or (with its memo) 'auto' point."""
  if point.gamma == ADAPTIVE:
    return ResolvedPoint(point.draft, adaptive.gamma_max, point.temperature, adaptive=adaptive)
  if point.gamma != AUTO:
    return ResolvedPoint(point.draft, int(point.gamma), point.temperature,
                         loop=loop if int(point.gamma) > 0 else None)
  gamma = int(memo["gamma"])
  return ResolvedPoint(point.draft, gamma, point.temperature, auto=True,
                       calibration_alpha=memo["alpha"],
                       predicted_curve=tuple((int(g), float(s)) for g, s in memo["curve"]),
                       lone_curve=tuple((int(g), float(s)) for g, s in memo.get("lone_curve", [])),
                       loop=loop if gamma > 0 else None)


def resolve(point: Point, costs: timing.Costs, store, alpha_fn, *, gamma_max: int,
            min_speedup: float, adaptive=None, rule: str = "tokenwise") -> ResolvedPoint:
  """A concrete point from lone-extend costs only (no loop timing): what a mesh run does.
  alpha_fn() -> alpha, or calibration_acceptance's dict."""
  if point.gamma != AUTO:
    return resolved(point, adaptive=adaptive)

  def acceptance_fn():
    a = alpha_fn()
    return a if isinstance(a, Mapping) else {"alpha": float(a)}
  plan = plan_auto(point, costs, store, acceptance_fn, gamma_max=gamma_max,
                   min_speedup=min_speedup, rule=rule)
  return resolved(point, memo=choose(plan, costs, None, store, min_speedup=min_speedup,
                                     rule=rule))
