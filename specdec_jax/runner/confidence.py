"""How sure GAMMA='auto''s choice among timed chains is, in the loops' own noise (issue 46).

Why apart from runner/calibrate.py: the choice is made there; this says, for the record and the
log line, how far it cleared the gate and the runner-up in standard errors of the loops' rounds,
and warns when another run of the same config on the same machine may choose otherwise.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specdec_jax.runner.costs import LoopCosts


def confidence(loop: LoopCosts, curve: Mapping[int, float], tokens: Mapping[int, float],
               chosen: int, min_speedup: float) -> dict:
  """How sure a chain choice is, in the loops' own noise (issue 46): `pick` (the chosen gamma,
  or the best-predicted one where plain decoding was chosen), its predicted margin over the gate
  (`min_speedup`) in standard errors of its speedup (`gate_z`), and its lead over the
  best-predicted other gamma (`runner_up`) in standard errors of that lead (`lead_z`, paired by
  round). `within_noise`: the gate or the runner-up is within one standard error, so another run
  of the same config on the same machine may choose otherwise. z is None where the rounds
  were not kept (fewer than two)."""
  timed = [g for g in tokens if g > 0]
  if not timed:
    return {}
  pick = chosen if chosen else max(timed, key=lambda g: curve[g])
  gate_se = loop.speedup_se(pick, tokens[pick])
  out = {"pick": pick, "gate": min_speedup, "margin": curve[pick] - min_speedup,
         "gate_z": (curve[pick] - min_speedup) / gate_se if gate_se > 0 else None}
  others = [g for g in timed if g != pick]
  if others:
    runner = max(others, key=lambda g: curve[g])
    lead_se = loop.lead_se(pick, tokens[pick], runner, tokens[runner])
    out.update(runner_up=runner, lead=curve[pick] - curve[runner],
               lead_z=(curve[pick] - curve[runner]) / lead_se if lead_se > 0 else None)
  zs = [out.get("gate_z")] + ([out.get("lead_z")] if chosen else [])
  out["within_noise"] = any(z is not None and abs(z) < 1.0 for z in zs)
  return out


def describe_confidence(conf: Mapping[str, Any]) -> str:
  """The log's words for `confidence`: '' where nothing was measured."""
  if not conf:
    return ""
  def z(v):
    return "n/a" if v is None else f"{v:+.1f} SE"
  text = (f"; gamma {conf['pick']} vs the gate {conf['gate']:.2f}: {conf['margin']:+.3f} "
          f"({z(conf['gate_z'])})")
  if "runner_up" in conf:
    text += f", vs gamma {conf['runner_up']}: {conf['lead']:+.3f} ({z(conf.get('lead_z'))})"
  if conf.get("within_noise"):
    text += " -- WITHIN NOISE: another run of this config may choose otherwise"
  return text
