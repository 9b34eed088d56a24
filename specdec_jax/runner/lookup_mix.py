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

from specdec_jax import timing
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


# 'auto' times up to this many of a lookup-first draft's gammas (1..lookup_gamma; `lone_curve`
# ranks them too roughly to keep only a chain's three).
MAX_CANDIDATES = 5


def lone_curve(accept_at_least, share: float, costs: timing.Costs, gamma_max: int
               ) -> dict[int, float]:
  """The lone-extend prediction for a lookup-first draft's gammas 0..gamma_max, from the one
  calibration decode (profile A_1..A_L over lookup_gamma L = its length, lookup share `share`):
  what ranks and prunes 'auto''s candidates, not what chooses. Every iteration verifies L + 1
  tokens (v(L + 1), or the largest measured); only the draft's iterations call it (g c (1 -
  share)); a lookup iteration keeps up to L tokens whatever g, a draft one mostly its own g
  (the lookup continues them, rarely kept): E(g) = 1 + A_1..A_g + share x (A_(g+1)..A_L). Rough
  (the profile mixes both kinds), hence more candidates timed than a chain's."""
  a_i = [min(max(float(a), 0.0), 1.0) for a in accept_at_least]
  v = costs.v.get(len(a_i) + 1, costs.v[max(costs.v)])
  out = {0: 1.0}
  for g in range(1, gamma_max + 1):
    tokens = 1.0 + sum(a_i[:g]) + share * sum(a_i[g:])
    out[g] = theory.loop_speedup(tokens, 1.0, g * costs.c * (1.0 - share) + v)
  return out


def at_calibration(loop: LoopCosts, profiles: Mapping[int, Mapping], draft_ms: float
                   ) -> tuple[LoopCosts, dict[int, float]]:
  """(`loop` moved by `at_shares`, the shares it was moved to): each lookup-first gamma of
  `loop` to the share of its own calibration decode (`profiles`: {gamma: a
  `calibrate.calibration_acceptance` dict}; those of a drafter that `chooses_per_batch` record
  one)."""
  shares = {int(g): float(a["lookup_share"]) for g, a in profiles.items()
            if a is not None and a.get("lookup_share") is not None
            and int(g) in loop.lookup_share}
  return at_shares(loop, shares, draft_ms), shares
