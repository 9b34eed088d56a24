r"""Chen et al.'s Table 1 on the TPU v4 roofline: Llama 3.1 70B with a Llama 3.2 1B draft.

  python scripts/chen_roofline.py                               # prints the table
  python scripts/chen_roofline.py --name=chen_roofline_tpu_v4   # writes the record
  python scripts/results.py tables     # docs/aot_results.md's table, from the record

Predictions from the models' shapes, not measurements (no TPU here): `specdec_jax.aot.roofline`'s
byte basis (weights and caches read once per step, split over the chips a model is sharded
over; sampling on every chip) on a v4 chip's published figures, with the layouts of
configs/paper/chen/mesh_tpu_v4_{16,32}.gin (target over 8 chips, draft over 2; the v4-32 layout
is two such replicas, each row at the v4-16 latency) and of mesh_tpu_v4_32_tp16.gin (the target
over all 16 chips, Chen's own count, its 8 key/value heads held twice: `models.gqa`). K as
Chen's Table 1 ran it (4 for every row), and the XSum rows again at K = 3, what
configs/paper/chen/xsum_*.gin use (Chen's Figure: XSum's best K). No alpha has been measured for
this pair, so the speculative ms/token is given at alphas 0.6 / 0.7 / 0.8 and the alpha at which
the roofline reaches Chen's speedup (measured at K = 4) is solved for. Chen: Chinchilla 70B, 16
v4 chips, 14.1 ms/token autoregressive; 7.00 (XSum greedy), 7.52 (XSum nucleus), 5.73
(HumanEval).
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

# (experiment, K, prompt slots, decode length, Chen's ms/token speculative, Chen's speedup):
# Table 1's K = 4 rows, then XSum at the K = 3 the configs use.
ROWS = (("XSum greedy", 4, 1024, 128, 7.00, 2.01), ("XSum nucleus", 4, 1024, 128, 7.52, 1.92),
        ("HumanEval", 4, 512, 256, 5.73, 2.46),
        ("XSum greedy", 3, 1024, 128, 7.00, 2.01), ("XSum nucleus", 3, 1024, 128, 7.52, 1.92))
CHEN_AR_MS = 14.1
CHEN_K = 4
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
        chen_x: float) -> dict:
  """One predicted row, as the record keeps it (`aot.tables.chen_table` renders it)."""
  lay = layout(gamma, prompt, decode, mesh_file)
  ar_ms = lay.target_s() * 1e3
  c, v = lay.c("llama3_2_1b"), lay.v(gamma + 1)
  need = alpha_for(chen_x, gamma, c, v)
  return {"experiment": name, "mesh_file": mesh_file, "target_chips": LAYOUTS[mesh_file],
          "draft_chips": 2, "K": gamma, "ar_ms": round(ar_ms, 4), "c": round(c, 6),
          "v": round(v, 6),
          "spec_ms": {f"{a:.1f}": round(ar_ms / theory.predicted_speedup(a, gamma, c, v), 4)
                      for a in ALPHAS},
          "chen": {"K": CHEN_K, "chips": 16, "ar_ms": CHEN_AR_MS, "spec_ms": chen_ms,
                   "speedup": chen_x},
          "alpha_for_chen_speedup": None if need is None else round(need, 4)}


def main(argv=None) -> int:
  import argparse  # pylint: disable=import-outside-toplevel
  from specdec_jax.aot import tables  # pylint: disable=import-outside-toplevel
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--name", default="", help="write docs/results/NAME.json (append-only)")
  args = ap.parse_args(argv)
  rows = [row(mesh_file, *r) for mesh_file in LAYOUTS for r in ROWS]
  metrics = {"rows": rows, "alphas": [f"{a:.1f}" for a in ALPHAS],
             "basis": "aot.roofline byte basis on TPU v4 published figures (HBM 1.2 TB/s, "
                      "275 TFLOP/s bf16): predictions from shapes, not measurements"}
  print(tables.chen_table([{"metrics": metrics}]))
  if args.name:
    from specdec_jax.metrics import results  # pylint: disable=import-outside-toplevel
    print("wrote", results.save_record(os.path.join(ROOT, "docs", "results"), args.name, metrics,
                                       command="python scripts/chen_roofline.py --name="
                                       + args.name))
  return 0


if __name__ == "__main__":
  sys.exit(main())
