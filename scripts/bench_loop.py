r"""Where the time of one decode goes: memory bandwidth, the verify-cost curve, the loop overhead.

  python scripts/bench_loop.py                          # zoo-sized T5 target (84 MB), small draft
  python scripts/bench_loop.py --target=decoder_97m --draft=decoder_6m --max_t=8
  python scripts/bench_loop.py --xla_variants           # v(T) under several XLA:CPU settings
  python scripts/bench_loop.py --matmul=xla,auto            # before / after the CPU kernel
  python scripts/bench_loop.py --target=smollm2_135m --draft=smollm2_draft   # the fetched target's shape
  python scripts/bench_loop.py --target=smollm2_135m --draft=smollm2_draft --prompt_len=1000

--matmul (comma list of RunConfig.matmul values, default 'xla,auto') decodes with each weight
layout (models/packed.py: 'auto' is the packed kernel from two rows on one CPU device), every
figure below timed for all layouts side by side in one process (the speed of a shared machine
drifts; a before/after table from two processes would measure the drift). The kernel against
XLA's dot per matrix shape of the step is an experiment of its own: experiments/bench_matmul.py.

Prints (random weights; speed does not depend on their values):
1. the autoregressive ms/token beside (decode-path weight bytes) / (measured memory bandwidth:
   the faster of a jitted sum and the kernel's matrix-vector product over 512 MB), the time a
   purely memory-bound step would take;
2. the verify-cost curve v(T) = time(target extend over T tokens) / time(extend over 1 token),
   T = 1..max_t. Speculative decoding's speedup is (1 - a^(G+1)) / ((1 - a)(G c + v(G+1))): the
   papers assume v ~ 1 (TPU/GPU at batch 1); on a CPU it is not, and this curve decides whether
   speculation can pay;
3. one speculative iteration (draft G tokens, verify, accept, commit) beside G x draft step + one
   verify call timed separately: the difference is the loop's own overhead.
Every figure is the median of interleaved repeats in this one process.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

# XLA:CPU settings tried for v(T) (each in a fresh process: flags are read at backend start).
XLA_VARIANTS = {
    "default": "",
    "no_eigen_multithread": "--xla_cpu_multi_thread_eigen=false",
    "fast_math": "--xla_cpu_enable_fast_math=true",
    "opt_level_1": "--xla_backend_optimization_level=1",
}


def _median_time(fn, repeats: int) -> float:
  from specdec_jax import timing
  return timing.time_call(fn, repeats=repeats)


def measure_bandwidth(mbytes: int = 512, repeats: int = 7) -> dict[str, float]:
  """GB/s of two reads of float32 data much larger than the caches: a jitted sum ('xla_sum'),
  and one row through a matrix of that size by the packed CPU kernel ('kernel_gemv', where the
  kernel builds). Why both: the floor is the fastest the machine streams weights, and the sum
  alone read 40-44 GB/s where the kernel's matrix-vector product read 48-62 (AMD EPYC, 2 cores):
  a floor from the sum alone put a step 1.08x 'the floor' that was ~1.4x the weights' time."""
  import jax
  import jax.numpy as jnp
  x = jnp.ones((mbytes * 2 ** 20 // 4,), jnp.float32)
  f = jax.jit(jnp.sum)
  jax.block_until_ready(f(x))
  out = {"xla_sum": x.nbytes / _median_time(lambda: f(x), repeats) / 1e9}
  from specdec_jax.kernels import matmul as km
  from specdec_jax.models import packed
  if packed.kernel_available():
    rows, cols = 1024, mbytes * 2 ** 20 // 4 // 1024
    w = km.pack_panels(jax.device_put(np.ones((rows, cols), np.float32)))  # not a constant
    v = jnp.ones((1, rows), jnp.float32)
    g = jax.jit(lambda v, w: km.packed_matmul(v, w, cols))
    jax.block_until_ready(g(v, w))
    out["kernel_gemv"] = rows * cols * 4 / _median_time(lambda: g(v, w), repeats) / 1e9
  return out


def decode_path_bytes(params, kind: str, tied: bool = False) -> tuple[int, int]:
  """(all weight bytes, bytes one decode step reads: decoder side, embedding row aside; a tied
  head reads the whole embedding every step)."""
  import jax
  import numpy as np
  total = sum(np.asarray(x).nbytes for x in jax.tree.leaves(params))
  if kind != "t5" and tied:
    return total, total
  if kind != "t5":
    emb = params["token_embedder"]["embedding"]
    return total, total - np.asarray(emb).nbytes
  dec = sum(np.asarray(x).nbytes for x in jax.tree.leaves(params["decoder"]))
  return total, dec


def verify_curve(target, tp, inputs, max_t: int, repeats: int) -> dict[int, float]:
  """Seconds of one target `extend` over T tokens, T = 1..max_t (`timing.extend_program`: donated
  cache, rolled back each call, as the loops run it; interleaved repeats)."""
  return verify_curves({"": (target, tp)}, inputs, max_t, repeats)[""]


def verify_curves(variants: dict, inputs, max_t: int, repeats: int) -> dict:
  """{layout: verify_curve} for {layout: (target, params)}, all timed in one interleaved call."""
  import jax
  from specdec_jax import timing
  programs = {}
  for k, (target, tp) in variants.items():
    cache = jax.jit(target.prefill, static_argnums=2)(tp, inputs, inputs.shape[1] + max_t + 8)
    programs.update({(k, t): timing.extend_program(target, tp, cache, t)
                     for t in range(1, max_t + 1)})
  med = timing.interleaved(programs, repeats)[1]
  return {k: {t: med[(k, t)] for t in range(1, max_t + 1)} for k in variants}


def iteration_breakdown(target, tp, draft, dp, inputs, gamma: int, repeats: int) -> dict:
  """One jitted speculative iteration vs its parts timed alone (greedy, random draft)."""
  import jax
  import jax.numpy as jnp
  from specdec_jax import timing
  from specdec_jax.decoding import speculative as sp
  from specdec_jax.decoding import state as st
  from specdec_jax.decoding.decoder import Decoder, Params
  from specdec_jax.decoding.sampling import SamplingConfig
  sampling = SamplingConfig(temperature=0.0)
  decoder = Decoder(target, draft, sp.Chain(gamma), sampling, max_decode_len=64)
  params = Params(tp, dp)
  state = jax.jit(lambda x: decoder.init(params, x, jax.random.key(0)))(inputs)
  iteration = jax.jit(lambda s: decoder.iteration(params, s))
  drafting = jax.jit(lambda s, k: sp.draft_step(decoder, dp, s, k))
  x_BxG = jnp.full((inputs.shape[0], gamma), 5, jnp.int32)
  verifying = jax.jit(lambda s, x: sp.verify_step(target, tp, s.target_cache, st.last_tokens(s),
                                                  x, sampling))
  key = jax.random.key(1)
  progs = {"iteration": lambda: iteration(state), "draft_step": lambda: drafting(state, key),
           "verify_step": lambda: verifying(state, x_BxG),
           "draft_extend_T1": timing.extend_program(draft, dp, state.draft_cache, 1)}
  med = dict(timing.interleaved(progs, repeats)[1])
  med["draft_step_plus_verify"] = med["draft_step"] + med["verify_step"]
  med["loop_overhead"] = med["iteration"] - med["draft_step_plus_verify"]
  return med


def autoregressive_costs(variants: dict, inputs, tokens: int, repeats: int) -> dict:
  """{layout: {"ms_per_token", "step_ms"}}: a greedy decode of `tokens` tokens over its tokens
  (prefill included), and one decode step, (time(tokens) - time(tokens / 2)) / (tokens / 2):
  both decodes prefill the same prompt, so the difference is steps alone (with a long prompt
  the prefill is most of a short decode's time). All programs interleaved."""
  import jax
  from specdec_jax import timing
  from specdec_jax.decoding.decoder import Decoder, Params, decode_program
  half = tokens // 2
  programs = {(k, n): (lambda m=m, p=p, n=n: decode_program(
      Decoder(m, max_decode_len=n), Params(p), inputs, jax.random.key(0), None))
              for k, (m, p) in variants.items() for n in (tokens, half)}
  med = timing.interleaved(programs, repeats)[1]
  return {k: {"ms_per_token": 1e3 * med[(k, tokens)] / tokens,
              "step_ms": 1e3 * (med[(k, tokens)] - med[(k, half)]) / (tokens - half)}
          for k in variants}


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--target", default="zoo_t5_target", help="preset of the target")
  ap.add_argument("--draft", default="zoo_t5_draft_small", help="preset of the draft")
  ap.add_argument("--gamma", type=int, default=4)
  ap.add_argument("--max_t", type=int, default=16)
  ap.add_argument("--tokens", type=int, default=48, help="tokens per autoregressive decode")
  ap.add_argument("--prompt_len", type=int, default=16,
                  help="prompt tokens: the cache every figure runs at (attention reads every "
                       "slot, and a long cache is what HumanEval's decodes reach)")
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--matmul", default="xla,auto",
                  help="comma list of weight layouts (RunConfig.matmul values) to compare")
  ap.add_argument("--curve_only", action="store_true", help="only v(T) (used by --xla_variants)")
  ap.add_argument("--xla_variants", action="store_true",
                  help="also measure v(T) under each XLA:CPU setting in XLA_VARIANTS")
  ap.add_argument("--output", default=None, help="write all figures to this JSON file")
  args = ap.parse_args(argv)

  import jax
  import jax.numpy as jnp
  import numpy as np
  from specdec_jax.models import packed
  from specdec_jax.models.model_config import get_preset
  from specdec_jax.models.model import Model

  # eos_id -1: random weights would otherwise stop some decodes early and skew ms/token.
  target = Model(get_preset(args.target, eos_id=-1))
  tp = target.init(jax.random.key(0))
  layouts = [m for m in args.matmul.split(",") if m]
  variants = {}
  for name in layouts:
    model, params = packed.for_backend(target, tp, matmul=name)
    variants[f"{name}->{packed.resolve_matmul(name)}"] = (model, params)
  inputs = jnp.asarray(np.arange(3, 3 + args.prompt_len, dtype=np.int32)[None]
                       % target.vocab_size)
  curves = verify_curves(variants, inputs, args.max_t, args.repeats)
  out = {"device": str(jax.devices()[0]), "xla_flags": os.environ.get("XLA_FLAGS", ""),
         "target": args.target, "prompt_len": args.prompt_len, "layouts": {}}
  for k, curve in curves.items():
    out["layouts"][k] = {"extend_ms": {t: 1e3 * s for t, s in curve.items()},
                         "v": {t: curve[t] / curve[1] for t in curve}}
  first = out["layouts"][next(iter(curves))]
  out.update(extend_ms=first["extend_ms"], v=first["v"])
  if args.curve_only:
    print(json.dumps(out))
    return out

  draft = Model(get_preset(args.draft, eos_id=-1))
  dp = draft.init(jax.random.key(1))
  drafts = {k: packed.for_backend(draft, dp, matmul=k.split("->")[0]) for k in variants}
  total, path = decode_path_bytes(tp, target.config.kind, target.config.tie_embeddings)
  probes = measure_bandwidth()
  bandwidth = max(probes.values())  # the fastest read the machine showed
  ar_costs = autoregressive_costs(variants, inputs, args.tokens, args.repeats)
  ar = {k: v["ms_per_token"] for k, v in ar_costs.items()}
  floor = 1e3 * path / (bandwidth * 1e9)
  out.update(target_weight_mb=total / 2 ** 20, decode_path_mb=path / 2 ** 20,
             bandwidth_gb_s=bandwidth, bandwidth_probes_gb_s=probes,
             memory_bound_ms_per_token=floor, gamma=args.gamma)
  print(f"target {args.target}: {total / 2**20:.1f} MB float32 weights, "
        f"{path / 2**20:.1f} MB read per decode step; draft {args.draft}")
  print("memory bandwidth over 512 MB: " + ", ".join(f"{k} {v:.1f} GB/s" for k, v in
                                                    probes.items())
        + f"; decode-path bytes / the fastest = {floor:.2f} ms/token (the memory-bound floor)")
  for k, (model, params) in variants.items():
    dm, dparams = drafts[k]
    it = iteration_breakdown(model, params, dm, dparams, inputs, args.gamma, args.repeats)
    lay = out["layouts"][k]
    lay.update(ar_ms_per_token=ar[k], ar_over_floor=ar[k] / floor,
               ar_step_ms=ar_costs[k]["step_ms"],
               iteration_ms={n: 1e3 * s for n, s in it.items()},
               c=it["draft_extend_T1"] / curves[k][1])
  ts = list(range(1, args.max_t + 1))
  print("\nlayout (matmul -> chosen) | " + " | ".join(f"v({t})" for t in ts)
        + " | extend(1) ms | AR ms/token | AR step ms | AR / floor | iteration ms (gamma "
        f"{args.gamma}) | draft_step + verify | loop overhead")
  for k, lay in out["layouts"].items():
    ms = lay["iteration_ms"]
    print(f"{k} | " + " | ".join(f"{lay['v'][t]:.2f}" for t in ts)
          + f" | {lay['extend_ms'][1]:.2f} | {lay['ar_ms_per_token']:.2f} | "
          f"{lay['ar_step_ms']:.2f} | "
          f"{lay['ar_over_floor']:.2f}x | {ms['iteration']:.2f} | "
          f"{ms['draft_step_plus_verify']:.2f} | {ms['loop_overhead']:.2f}")

  if args.xla_variants:
    out["xla_variants"] = {}
    for name, flags in XLA_VARIANTS.items():
      env = dict(os.environ, XLA_FLAGS=flags)
      proc = subprocess.run([sys.executable, __file__, "--curve_only", f"--target={args.target}",
                             f"--max_t={args.max_t}", f"--repeats={args.repeats}",
                             "--matmul=xla"],
                            env=env, capture_output=True, text=True)
      if proc.returncode != 0:
        out["xla_variants"][name] = {"error": proc.stderr.strip().splitlines()[-1:]}
        print(f"  {name:24s} failed: {out['xla_variants'][name]['error']}")
        continue
      res = json.loads(proc.stdout.strip().splitlines()[-1])
      out["xla_variants"][name] = res
      vv = res["v"]
      print(f"  {name:24s} extend(1) {res['extend_ms']['1']:.2f} ms  v(4) {vv['4']:.2f}  "
            f"v(8) {vv['8']:.2f}  v({args.max_t}) {vv[str(args.max_t)]:.2f}")
  if args.output:
    with open(args.output, "w") as f:
      json.dump(out, f, indent=1)
  return out


if __name__ == "__main__":
  main()
