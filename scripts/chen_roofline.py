r"""Chen et al.'s Table 1 on the TPU v4 roofline: Llama 3.1 70B with a Llama 3.2 1B draft.

  python scripts/chen_roofline.py           # the markdown table docs/aot_results.md quotes

Predictions from the models' shapes, not measurements (no TPU here): `specdec_jax.aot.roofline`'s
byte basis (weights and caches read once per step, split over the chips a model is sharded
over; sampling on every chip) on a v4 chip's published figures, with the layouts of
configs/paper/chen/mesh_tpu_v4_{16,32}.gin (target over 8 chips, draft over 2; the v4-32 layout
is two such replicas, each row at the v4-16 latency) and of mesh_tpu_v4_32_tp16.gin (the target
over all 16 chips, its 8 key/value heads held twice: `models.gqa`). No alpha has been measured for this pair,
so the speculative ms/token is given at alphas 0.6 / 0.7 / 0.8 and the alpha at which the
roofline reaches Chen's speedup is solved for. Chen: Chinchilla 70B, 16 v4 chips, 14.1 ms/token
autoregressive; 7.00 (XSum greedy, K 3), 7.52 (XSum nucleus, K 3), 5.73 (HumanEval, K 4).
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from specdec_jax.aot import roofline, topologies  # noqa: E402  pylint: disable=wrong-import-position
from specdec_jax.metrics import theory  # noqa: E402  pylint: disable=wrong-import-position
from specdec_jax.models import gqa  # noqa: E402  pylint: disable=wrong-import-position
from specdec_jax.models.model_config import get_preset  # noqa: E402  pylint: disable=wrong-import-position

# (experiment, K, prompt slots, decode length, Chen's ms/token speculative, Chen's speedup)
ROWS = (("XSum greedy", 3, 1024, 128, 7.00, 2.01), ("XSum nucleus", 3, 1024, 128, 7.52, 1.92),
        ("HumanEval", 4, 512, 256, 5.73, 2.46))
CHEN_AR_MS = 14.1
ALPHAS = (0.6, 0.7, 0.8)


# mesh file -> chips the target is split over (the draft: 2, model_inner, in both).
LAYOUTS = {"configs/paper/chen/mesh_tpu_v4_16.gin": 8,
           "configs/paper/chen/mesh_tpu_v4_32_tp16.gin": 16}


def layout(gamma: int, prompt: int, decode: int, mesh_file: str) -> roofline.Layout:
  """A configs/paper/chen layout: bf16 target over LAYOUTS[mesh_file] chips (its kv heads
  replicated where the chips outnumber them, as `sharding.fit_kv_heads` places it), draft over
  2, batch 1, the cache as the run sizes it (prompt + decode length + gamma + 2 slack slots)."""
  cache, chips = prompt + decode + gamma + 2, LAYOUTS[mesh_file]
  config = get_preset("llama3_1_70b", dtype="bfloat16")
  config = gqa.replicated_config(config, gqa.replication_for(config, chips))
  target = roofline.Placement(config, cache_len=cache, chips=chips)
  draft = roofline.Placement(get_preset("llama3_2_1b", dtype="bfloat16"), cache_len=cache,
                             chips=2)
  return roofline.Layout(mesh_file, topologies.CHIPS["v4"], target, {"llama3_2_1b": draft})


def alpha_for(speedup: float, gamma: int, c: float, v: float) -> float | None:
  """The alpha at which the predicted speedup reaches `speedup` (bisection; None if never)."""
  lo, hi = 0.0, 0.9999
  if theory.predicted_speedup(hi, gamma, c, v) < speedup:
    return None
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if theory.predicted_speedup(mid, gamma, c, v) < speedup else (lo, mid)
  return (lo + hi) / 2


def row(mesh_file: str, name: str, gamma: int, prompt: int, decode: int, chen_ms: float,
        chen_x: float) -> str:
  lay = layout(gamma, prompt, decode, mesh_file)
  ar_ms = lay.target_s() * 1e3
  c, v = lay.c("llama3_2_1b"), lay.v(gamma + 1)
  specs = [ar_ms / theory.predicted_speedup(a, gamma, c, v) for a in ALPHAS]
  need = alpha_for(chen_x, gamma, c, v)
  return (f"| {name} | {LAYOUTS[mesh_file]} | {gamma} | {ar_ms:.2f} | {c:.4f} | {v:.3f} | "
          + " / ".join(f"{s:.2f}" for s in specs)
          + f" | {CHEN_AR_MS} -> {chen_ms} ({chen_x}x) | "
          + ("-" if need is None else f"{need:.2f}") + " |")


def main() -> None:
  print("| experiment | target chips | K | AR ms/token (roofline) | c | v(K+1) | spec ms/token at alpha "
        + " / ".join(f"{a:.1f}" for a in ALPHAS)
        + " | Chen (Chinchilla 70B, 16 chips) | alpha for Chen's speedup |")
  print("|---|---|---|---|---|---|---|---|---|")
  for mesh_file in LAYOUTS:
    for r in ROWS:
      print(row(mesh_file, *r))


if __name__ == "__main__":
  main()
