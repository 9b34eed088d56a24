"""Per-run cost measurement (c and the verify curve v(T)) and GAMMA='auto' resolution.

Why per run: c and v depend on the machine, the batch shape and the models, so they are measured
in the process that decodes, on the run's own first batch, right before the timed decode. alpha
comes from a short untimed calibration decode on the first few prompts. The chosen gamma is
remembered in run_state.json so a resumed run keeps decoding with the same gamma.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax

from specdec_jax import distributed, timing
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import generate_speculative
from specdec_jax.metrics import acceptance, theory
from specdec_jax.runner import keys
from specdec_jax.runner.config import ADAPTIVE, AUTO, GAMMA_WORDS, DraftSpec, Point, as_list


@dataclasses.dataclass(frozen=True)
class ResolvedPoint:
  """A speculative point with a concrete gamma (0 = autoregressive) and how it was chosen.

  adaptive: the AdaptiveConfig of a GAMMA='adaptive' point (gamma is then its gamma_max).
  """

  draft: DraftSpec
  gamma: int
  temperature: float
  auto: bool = False
  calibration_alpha: float | None = None
  predicted_curve: tuple[tuple[int, float], ...] = ()
  adaptive: Any = None

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
  keys = list(costs)
  rows = distributed.agree([[c.target_ms, c.draft_ms, c.c, sorted(c.v.items())]
                            for c in costs.values()])
  return {k: timing.Costs(t, d, c, {int(n): float(x) for n, x in v})
          for k, (t, d, c, v) in zip(keys, rows)}


def calibration_alpha(target, target_params, draft, draft_params, inputs_BxP, *, rows: int,
                      gamma: int, sampling: SamplingConfig, max_decode_len: int, seed: int,
                      rule: str) -> float:
  """alpha (sum beta / positions) of a short speculative decode of `inputs_BxP`, over its first
  `rows` rows (the rest pads the batch to a data-parallel mesh and is not a prompt)."""
  res = generate_speculative(target, target_params, draft, draft_params, inputs_BxP, gamma=gamma,
                             sampling=sampling, max_decode_len=max_decode_len,
                             rng=jax.random.key(seed + 7919), rule=rule)
  return acceptance.alpha_of(distributed.gather(res.counters), rows)  # rows of every process


def resolve(point: Point, costs: timing.Costs, store, alpha_fn, *, gamma_max: int,
            min_speedup: float, adaptive=None) -> ResolvedPoint:
  """A concrete point; for 'auto', gamma from alpha (alpha_fn(), once) and the measured costs;
  for 'adaptive', the loop chooses per example (`adaptive`: its AdaptiveConfig)."""
  if point.gamma == ADAPTIVE:
    return ResolvedPoint(point.draft, adaptive.gamma_max, point.temperature, adaptive=adaptive)
  if point.gamma != AUTO:
    return ResolvedPoint(point.draft, int(point.gamma), point.temperature)
  memo_key = keys.auto_choice(point.draft.name, point.temperature)
  memo = store.recall("gammas", memo_key)
  if memo is None:
    alpha = float(alpha_fn())
    curve = theory.speedup_curve(alpha, costs.c, costs.v, gamma_max)
    chosen = theory.choose_gamma(alpha, costs.c, costs.v, gamma_max, min_speedup)
    memo = {"gamma": chosen, "alpha": alpha, "c": costs.c,
            "curve": [[g, s] for g, s in curve.items()]}
    store.remember("gammas", memo_key, memo)
  return ResolvedPoint(point.draft, int(memo["gamma"]), point.temperature, auto=True,
                       calibration_alpha=memo["alpha"],
                       predicted_curve=tuple((int(g), float(s)) for g, s in memo["curve"]))
