"""A lookup-first drafter's loop costs moved to another lookup share.

Why a module: a lookup-first iteration (`decoding/lookup_token.py`, `lookup_feature.py`) is one of
two programs, the prompt lookup's (no draft call) and the draft's (draft_gamma draft steps), and
its timed loop mixes them in the proportion of the few timed prompts (HumanEval: 37 % lookup on 4
problems against 64 % on the 48 calibration ones). Both GAMMA='auto''s choice among draft gammas
(`calibrate.choose`) and the record's `speedup_predicted` (`collect.lookup_prediction`) need the
loop at the calibration decode's proportion; both read it here, so 'auto''s curve at the chosen
gamma is the record's prediction.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from specdec_jax.metrics import theory
from specdec_jax.runner.costs import LoopCosts


def at_shares(loop: LoopCosts, shares: Mapping[int, float], draft_ms: float) -> LoopCosts:
  """`loop` with each lookup-first gamma's iteration (its median and every timed round) moved
  from the timed share (`loop.lookup_share`) to `shares[gamma]` (`theory.mixed_iteration`, the
  draft's calls at gamma lone draft steps of `draft_ms`). Gammas not in both are left as timed;
  a round the noise ate (<= 0) stays eaten."""
  moved = {g: theory.mixed_iteration(loop.iteration_ms[g], loop.lookup_share[g], s,
                                     g * draft_ms) - loop.iteration_ms[g]
           for g, s in shares.items() if g in loop.lookup_share and g in loop.iteration_ms}
  if not moved:
    return loop
  rounds = {g: [r + moved[g] if r > 0 else r for r in rs] if g in moved else rs
            for g, rs in loop.iteration_rounds_ms.items()}
  return dataclasses.replace(
      loop, iteration_ms={g: t + moved.get(g, 0.0) for g, t in loop.iteration_ms.items()},
      iteration_rounds_ms=rounds,
      lookup_share={**loop.lookup_share, **{g: float(shares[g]) for g in moved}})


def calibration_shares(profiles: Mapping[int, Mapping]) -> dict[int, float]:
  """{gamma: the lookup share of its own calibration decode} for the decodes that recorded one
  (`calibrate.calibration_acceptance` of a drafter that `chooses_per_batch`)."""
  return {int(g): float(a["lookup_share"]) for g, a in profiles.items()
          if a is not None and a.get("lookup_share") is not None}
