r"""Where the time of one decode goes: memory bandwidth, the verify-cost curve, the loop overhead.

  python scripts/bench_loop.py                          # zoo-sized T5 target (84 MB), small draft
  python scripts/bench_loop.py --target=decoder_97m --draft=decoder_6m --max_t=8
  python scripts/bench_loop.py --xla_variants           # v(T) under several XLA:CPU settings

Prints (random weights; speed does not depend on their values):
1. the autoregressive ms/token beside (decode-path weight bytes) / (measured memory bandwidth),
   the time a purely memory-bound step would take;
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


def measure_bandwidth(mbytes: int = 512, repeats: int = 7) -> float:
  """GB/s of a jitted sum over a float32 array much larger than the caches."""
  import jax
  import jax.numpy as jnp
  x = jnp.ones((mbytes * 2 ** 20 // 4,), jnp.float32)
  f = jax.jit(jnp.sum)
  jax.block_until_ready(f(x))
  return x.nbytes / _median_time(lambda: f(x), repeats) / 1e9


def decode_path_bytes(params, kind: str) -> tuple[int, int]:
  """(all weight bytes, bytes one decode step reads: decoder side, embedding row aside)."""
  import jax
  import numpy as np
  total = sum(np.asarray(x).nbytes for x in jax.tree.leaves(params))
  if kind != "t5":
    emb = params["token_embedder"]["embedding"]
    return total, total - np.asarray(emb).nbytes
  dec = sum(np.asarray(x).nbytes for x in jax.tree.leaves(params["decoder"]))
  return total, dec


def verify_curve(target, tp, inputs, max_t: int, repeats: int) -> dict[int, float]:
  """Seconds of one target `extend` over T tokens, T = 1..max_t (`timing.extend_program`: donated
  cache, rolled back each call, as the loops run it; interleaved repeats)."""
  import jax
  from specdec_jax import timing
  cache = jax.jit(target.prefill, static_argnums=2)(tp, inputs, inputs.shape[1] + max_t + 8)
  programs = {t: timing.extend_program(target, tp, cache, t) for t in range(1, max_t + 1)}
  return timing.interleaved(programs, repeats)[1]


def iteration_breakdown(target, tp, draft, dp, inputs, gamma: int, repeats: int) -> dict:
  """One jitted speculative iteration vs its parts timed alone (greedy, random draft)."""
  import jax
  import jax.numpy as jnp
  from specdec_jax import timing
  from specdec_jax.decoding import speculative as sp
  from specdec_jax.decoding import start
  from specdec_jax.decoding import state as st
  from specdec_jax.decoding.sampling import SamplingConfig
  sampling = SamplingConfig(temperature=0.0)
  max_len = 64
  state = jax.jit(lambda x: start.init_state(target, tp, x, jax.random.key(0),
                                             max_decode_len=max_len, gamma=gamma, draft=draft,
                                             draft_params=dp))(inputs)
  iteration = jax.jit(lambda s: sp.spec_iteration(target, tp, draft, dp, s, gamma=gamma,
                                                   sampling=sampling, rule="tokenwise",
                                                   max_decode_len=max_len))
  drafting = jax.jit(lambda s, k: sp.draft_step(draft, dp, s.draft_cache, s.tokens_BxL, s.num_B,
                                                s.draft_pending_B, k, gamma, sampling))
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


def autoregressive_ms_per_token(target, tp, inputs, tokens: int, repeats: int) -> float:
  import jax
  from specdec_jax.decoding.autoregressive import autoregressive_decode
  from specdec_jax.decoding.sampling import SamplingConfig
  run = lambda: autoregressive_decode(target, tp, inputs, jax.random.key(0),  # noqa: E731
                                      sampling=SamplingConfig(), max_decode_len=tokens)
  jax.block_until_ready(run())
  return 1e3 * _median_time(run, repeats) / tokens


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--target", default="zoo_t5_target", help="preset of the target")
  ap.add_argument("--draft", default="zoo_t5_draft_small", help="preset of the draft")
  ap.add_argument("--gamma", type=int, default=4)
  ap.add_argument("--max_t", type=int, default=16)
  ap.add_argument("--tokens", type=int, default=48, help="tokens per autoregressive decode")
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--curve_only", action="store_true", help="only v(T) (used by --xla_variants)")
  ap.add_argument("--xla_variants", action="store_true",
                  help="also measure v(T) under each XLA:CPU setting in XLA_VARIANTS")
  ap.add_argument("--output", default=None, help="write all figures to this JSON file")
  args = ap.parse_args(argv)

  import jax
  import jax.numpy as jnp
  import numpy as np
  from specdec_jax.models.config import get_preset
  from specdec_jax.models.model import Model

  # eos_id -1: random weights would otherwise stop some decodes early and skew ms/token.
  target = Model(get_preset(args.target, eos_id=-1))
  tp = target.init(jax.random.key(0))
  inputs = jnp.asarray(np.arange(3, 19, dtype=np.int32)[None] % target.vocab_size)
  curve = verify_curve(target, tp, inputs, args.max_t, args.repeats)
  v = {t: curve[t] / curve[1] for t in curve}
  out = {"device": str(jax.devices()[0]), "xla_flags": os.environ.get("XLA_FLAGS", ""),
         "target": args.target, "extend_ms": {t: 1e3 * s for t, s in curve.items()}, "v": v}
  if args.curve_only:
    print(json.dumps(out))
    return out

  draft = Model(get_preset(args.draft, eos_id=-1))
  dp = draft.init(jax.random.key(1))
  total, path = decode_path_bytes(tp, target.config.kind)
  bandwidth = measure_bandwidth()
  ar = autoregressive_ms_per_token(target, tp, inputs, args.tokens, args.repeats)
  it = iteration_breakdown(target, tp, draft, dp, inputs, args.gamma, args.repeats)
  out.update(target_weight_mb=total / 2 ** 20, decode_path_mb=path / 2 ** 20,
             bandwidth_gb_s=bandwidth, ar_ms_per_token=ar,
             memory_bound_ms_per_token=1e3 * path / (bandwidth * 1e9), gamma=args.gamma,
             iteration_ms={k: 1e3 * s for k, s in it.items()},
             c=it["draft_extend_T1"] / curve[1])
  print(f"target {args.target}: {total / 2**20:.1f} MB float32 weights, "
        f"{path / 2**20:.1f} MB read per decode step; draft {args.draft}")
  print(f"memory bandwidth (sum over 512 MB): {bandwidth:.1f} GB/s")
  print(f"autoregressive: {ar:.2f} ms/token; decode-path bytes / bandwidth = "
        f"{out['memory_bound_ms_per_token']:.2f} ms/token "
        f"({ar / out['memory_bound_ms_per_token']:.2f}x the memory-bound floor)")
  print("verify-cost curve v(T) = extend(T) / extend(1):")
  print("  T    " + " ".join(f"{t:>5d}" for t in curve))
  print("  ms   " + " ".join(f"{1e3 * curve[t]:5.2f}" for t in curve))
  print("  v    " + " ".join(f"{v[t]:5.2f}" for t in curve))
  ms = out["iteration_ms"]
  print(f"one speculative iteration, gamma={args.gamma}: {ms['iteration']:.2f} ms; draft_step "
        f"{ms['draft_step']:.2f} + verify {ms['verify_step']:.2f} = "
        f"{ms['draft_step_plus_verify']:.2f} ms; loop overhead {ms['loop_overhead']:.2f} ms; "
        f"c = draft extend / target extend = {out['c']:.3f}")

  if args.xla_variants:
    out["xla_variants"] = {}
    for name, flags in XLA_VARIANTS.items():
      env = dict(os.environ, XLA_FLAGS=flags)
      proc = subprocess.run([sys.executable, __file__, "--curve_only", f"--target={args.target}",
                             f"--max_t={args.max_t}", f"--repeats={args.repeats}"],
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
