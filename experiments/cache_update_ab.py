r"""The decode step with the cache updated in place against the old scatter write, in one process.

Why: XLA:CPU fused a decode step's cache update into attention's read and into the returned
cache and copied every layer's whole cache for each (kernels/cache_write.py). The fix
(`LayerKV.write_in_place`, the kernels' `specdec_cache_write` call, on the kernels' path) is
timed here against the old write (`LayerKV.write`'s scatter, what the layer does where the call
is not available: `cache_write.available` patched to False while the second program is traced):
both compiled in this process, then timed interleaved (alternating order), so the machine's
drift hits both alike. One program = `STEPS` target `extend` calls of one token in a
`fori_loop` over a donated cache, as the autoregressive loop runs them, at each cache size.

  python experiments/cache_update_ab.py --target=smollm2-135m-instruct --slots=300,1026 \
      --output=runs/cache_ab/metrics.json

Needs the kernels (a C++ compiler; the in-place path is theirs). Random prompt tokens; the
speed does not depend on them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp

from specdec_jax.checkpoints import loader
from specdec_jax.kernels import cache_write
from specdec_jax.models import packed

STEPS = 16


def step_program(model):
  """A jitted fori_loop of STEPS one-token extends over a donated cache."""
  def run(params, cache, tokens_Bx1):
    def body(_, carry):
      c, acc = carry
      logits, new = model.extend(params, c, tokens_Bx1)
      return new, acc + logits[0, 0, 0]
    return jax.lax.fori_loop(0, STEPS, body, (cache, 0.0))
  return jax.jit(run, donate_argnums=1)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--target", default="smollm2-135m-instruct")
  ap.add_argument("--slots", default="300,1026", help="cache sizes (comma list)")
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--output", required=True)
  args = ap.parse_args()
  if not packed.kernel_available():
    raise SystemExit("cache_update_ab: the kernels did not build (no C++ compiler?); the "
                     "in-place update is their path")
  model, params = loader.load_model(args.target, dtype="float32")
  model, params = packed.for_backend(model, params, matmul="auto")
  slots = [int(s) for s in args.slots.split(",") if s]
  tokens_Bx1 = jnp.full((1, 1), 3, jnp.int32)
  prompt_BxP = jnp.full((1, 16), 5, jnp.int32)
  programs, caches = {}, {}

  def compile_variant(name):
    programs[name] = step_program(model)
    for s in slots:
      cache = jax.jit(model.prefill, static_argnums=2)(params, prompt_BxP, s)
      cache, acc = programs[name](params, cache, tokens_Bx1)  # traced now, with the write in force
      acc.block_until_ready()
      caches[(name, s)] = cache.replace(index_B=cache.index_B - STEPS)

  compile_variant("in_place")
  saved = cache_write.available
  cache_write.available = lambda: False  # the layer falls back to LayerKV.write
  try:
    compile_variant("scatter")
  finally:
    cache_write.available = saved

  times = {k: [] for k in caches}
  for r in range(args.rounds):
    for key in (list(caches) if r % 2 == 0 else list(reversed(list(caches)))):
      name, _ = key
      t0 = time.perf_counter()
      cache, acc = programs[name](params, caches[key], tokens_Bx1)
      acc.block_until_ready()
      times[key].append(1e3 * (time.perf_counter() - t0) / STEPS)
      caches[key] = cache.replace(index_B=cache.index_B - STEPS)
  rows = {}
  for s in slots:
    a = statistics.median(times[("in_place", s)])
    b = statistics.median(times[("scatter", s)])
    rows[str(s)] = {"in_place_ms_per_step": a, "scatter_ms_per_step": b,
                    "scatter_over_in_place": b / a, "in_place_rounds": times[("in_place", s)],
                    "scatter_rounds": times[("scatter", s)]}
    print(f"{s} slots: in place {a:.2f} ms/step, scatter {b:.2f} ms/step, ratio {b / a:.3f}")
  out = {"kind": "cache_update_ab", "target": args.target, "steps_per_program": STEPS,
         "rounds": args.rounds, "slots": rows}
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
