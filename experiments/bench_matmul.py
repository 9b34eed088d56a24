"""The packed CPU matmul kernel against XLA's dot on the zoo target, side by side in one process.

Prints (and with --output writes as JSON):
1. per matrix shape of the target's decode step (its own weights, every matrix of that shape
   multiplied in sequence, as a step streams them): ms per matrix, kernel vs XLA, T = 1..9 rows;
2. the target's `extend` over T = 1..9 tokens, and v(T) = time(T) / time(1), with XLA's dot, the
   kernel ("kernel": every row count), "hybrid" (XLA's dot for one row of a large float32
   matrix, the kernel otherwise; what matmul='auto' chooses on CPU, see
   specdec_jax/models/packed.py; a checkpoint of bfloat16 values packs into bfloat16 panels) and
   "hybrid-f32" (the same with float32 panels: the bytes the bfloat16 panels save);
3. autoregressive ms/token with each (`Decoder.generate`, greedy, batch 1, en-de prompts);
4. the floor: weight bytes one step reads / measured read bandwidth (a jitted sum over 256 MB and
   the kernel's own T = 1 stream over 128 MB; the larger), and AR ms/token over that floor.
Timings are medians over rounds; each round runs every candidate once, in rotated order, so the
drift of a shared machine hits kernel and XLA alike.

  python experiments/bench_matmul.py [--target specdec_jax/assets/zoo/t5_target] [--rounds 7]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.kernels import build
from specdec_jax.kernels import matmul as km
from specdec_jax.checkpoints.loader import load_model
from specdec_jax.models import packed

TOKENS = tuple(range(1, 10))


def sampler(fn, *args, min_sample_s: float = 0.05):
  """(sample() -> ms per call) for a jitted `fn(*args)`; compiles and sizes the sample now."""
  jax.block_until_ready(fn(*args))
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))
  calls = max(1, min(200, int(min_sample_s / max(time.perf_counter() - t0, 1e-6)) + 1))

  def sample() -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
      out = fn(*args)
    jax.block_until_ready(out)
    return 1e3 * (time.perf_counter() - t0) / calls
  return sample


def interleaved(samplers: dict, rounds: int, stat=statistics.median) -> dict:
  """{name: stat of ms} (median by default): every round runs each sampler once, the order
  rotated each round."""
  names = list(samplers)
  times = {n: [] for n in names}
  for r in range(rounds):
    shift = r % len(names)
    for n in names[shift:] + names[:shift]:
      times[n].append(samplers[n]())
  LAST_TIMES.clear()
  LAST_TIMES.update(times)
  return {n: stat(v) for n, v in times.items()}


LAST_TIMES: dict = {}  # the samples behind the last `interleaved` call (for the best-case figure)


# ---- 1. per matrix shape ------------------------------------------------------------------------
def step_matrices(params, pparams) -> dict:
  """{(D, F): [(kernel [D, F], panels), ...]} for every projection a packed decode step runs (a
  fused one, `packed.FUSED`, as its parts side by side: the matrix the step multiplies)."""
  from specdec_jax.models import packed  # pylint: disable=import-outside-toplevel
  out = {}

  def walk(tree, ptree):
    for name, sub in ptree.items():
      if name == "kernel_panels":
        w = tree["kernel"]
        out.setdefault(tuple(w.shape), []).append((w, sub))
      elif isinstance(sub, dict) and name not in tree and name in packed.FUSED:
        w = jnp.concatenate([tree[part]["kernel"] for part in packed.FUSED[name]], axis=-1)
        walk({"kernel": w}, sub)
      elif isinstance(sub, dict):
        walk(tree[name], sub)
  walk(params, pparams)
  return out


def chain(mm, weights, x_TxD):
  """Multiplies x by every weight in turn; a scalar from each result feeds the next input, so the
  products run one after another (as in a step) and none is dropped."""
  for w in weights:
    y = mm(x_TxD, w)
    x_TxD = x_TxD + 1e-6 * jnp.sum(y)
  return x_TxD


def bench_shapes(params, pparams, rounds: int) -> dict:
  rows = {}
  rng = np.random.default_rng(0)
  for (d, f), mats in sorted(step_matrices(params, pparams).items()):
    ws = [w for w, _ in mats]
    ps = [p for _, p in mats]
    xla = jax.jit(lambda x, ws: chain(km.xla_matmul, ws, x))
    ker = jax.jit(lambda x, ps, f=f: chain(lambda x, p: km.packed_matmul(x, p, f), ps, x))
    samplers = {}
    for t in TOKENS:
      x = jnp.asarray(rng.standard_normal((t, d)), jnp.float32)
      samplers[("xla", t)] = sampler(xla, x, ws)
      samplers[("kernel", t)] = sampler(ker, x, ps)
    med = interleaved(samplers, rounds)
    rows[f"{d}x{f}"] = {"count": len(mats), "mb_each": 4 * d * f / 2 ** 20,
                        **{k: [med[(k, t)] / len(mats) for t in TOKENS] for k in ("xla", "kernel")}}
    print_shape(f"{d}x{f}", rows[f"{d}x{f}"])
  return rows


def print_shape(name, row):
  print(f"  {name:>10} x{row['count']:<2} ({row['mb_each']:.1f} MB each in float32), ms per "
        "matrix, xla / kernel (the target's own panels: bfloat16 for bfloat16 values):", flush=True)
  print("    " + "  ".join(f"T{t} {a:.3f}/{b:.3f}" for t, a, b in
                           zip(TOKENS, row["xla"], row["kernel"])), flush=True)


# ---- 2. extend and v(T) ---------------------------------------------------------------------------
def extend_sampler(model, params, inputs_BxP, tokens: int, cache_len: int):
  """ms per `extend` over `tokens` tokens, timed as the loops run it: the cache donated back in
  and rolled back to its starting index after every call (the slots are re-written)."""
  cache = jax.jit(model.prefill, static_argnums=2)(params, inputs_BxP, cache_len)
  block = jnp.full((inputs_BxP.shape[0], tokens), 3, jnp.int32)

  def one(p, c, t):
    logits, new = model.extend(p, c, t)
    return logits, new.replace(index_B=c.index_B)
  step = jax.jit(one, donate_argnums=1)
  state = {"cache": cache}

  def call(p, t):
    logits, state["cache"] = step(p, state["cache"], t)
    return logits
  return sampler(call, params, block)


def bench_extend(variants: dict, inputs_BxP, rounds: int, cache_len: int) -> dict:
  samplers = {(k, t): extend_sampler(m, p, inputs_BxP, t, cache_len)
              for k, (m, p) in variants.items() for t in TOKENS}
  med = interleaved(samplers, rounds)
  out = {}
  for k in variants:
    ms = [med[(k, t)] for t in TOKENS]
    best = [min(LAST_TIMES[(k, t)]) for t in TOKENS]
    out[k] = {"ms": ms, "v": [m / ms[0] for m in ms], "best_ms": best}
    print(f"  {k:>10}: extend ms " + " ".join(f"{m:.2f}" for m in ms), flush=True)
    print(f"  {k:>10}: v(T)      " + " ".join(f"{v:.2f}" for v in out[k]["v"]), flush=True)
    print(f"  {k:>10}: best ms   " + " ".join(f"{m:.2f}" for m in best), flush=True)
  return out


# ---- 3. autoregressive ms/token ------------------------------------------------------------------
def en_de_prompts(num: int, width: int) -> np.ndarray:
  from specdec_jax.data import local_tasks  # pylint: disable=import-outside-toplevel
  from specdec_jax.data.vocabulary import default_vocabulary  # pylint: disable=import-outside-toplevel
  examples = local_tasks.load_examples("translate_en_de", "valid", num_examples=num)
  ids = local_tasks.tokenize_examples(examples, default_vocabulary(), max_input_length=width,
                                      truncate=True)
  return local_tasks.batch_inputs(ids, pad_to=width)


def bench_ar(variants: dict, prompts_NxP: np.ndarray, rounds: int, max_decode_len: int) -> dict:
  greedy = SamplingConfig(temperature=0.0)
  tokens = {}
  samplers = {}
  for k, (m, p) in variants.items():
    def run(p, m=m):  # every prompt at batch 1, one after another
      decoder = Decoder(m, sampling=greedy, max_decode_len=max_decode_len)
      return [decoder.generate(Params(p), jnp.asarray(row[None])) for row in prompts_NxP]
    tokens[k] = int(sum(int(r.lengths_B[0]) for r in run(p)))
    samplers[k] = sampler(lambda p, run=run: [r.tokens_BxN for r in run(p)], p, min_sample_s=0)
  med = interleaved(samplers, rounds)
  out = {k: {"ms_per_token": med[k] / tokens[k], "best_ms_per_token": min(LAST_TIMES[k]) / tokens[k],
             "tokens": tokens[k]} for k in variants}
  for k, r in out.items():
    print(f"  {k:>10}: {r['ms_per_token']:.2f} ms/token (best round {r['best_ms_per_token']:.2f}; "
          f"{r['tokens']} tokens, {len(prompts_NxP)} prompts)", flush=True)
  return out


# ---- 4. the floor -------------------------------------------------------------------------------
def read_bandwidth_gbs(rounds: int) -> dict:
  big = jnp.ones((64 << 20,), jnp.float32)  # 256 MB: far beyond any cache
  total = jax.jit(jnp.sum)
  d, f = 512, 65536  # 128 MB of panels
  panels = jnp.ones((f // km.PANEL, d, km.PANEL), jnp.float32)
  x = jnp.ones((1, d), jnp.float32)
  mm = jax.jit(lambda x, p: km.packed_matmul(x, p, f))
  med = interleaved({"xla_sum": sampler(total, big), "kernel_T1": sampler(mm, x, panels)}, rounds)
  return {"xla_sum": big.nbytes / med["xla_sum"] / 1e6,
          "kernel_T1": panels.nbytes / med["kernel_T1"] / 1e6}


def step_weight_bytes(pparams) -> int:
  """Bytes of the projections one decode step multiplies (decoder layers + output head)."""
  leaves = []

  def walk(tree):
    for name, sub in tree.items():
      if name == "kernel_panels":
        leaves.append(sub)
      elif isinstance(sub, dict):
        walk(sub)
  walk(pparams)
  return int(sum(x.nbytes for x in leaves))


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--target", default="specdec_jax/assets/zoo/t5_target")
  ap.add_argument("--rounds", type=int, default=7)
  ap.add_argument("--prompts", type=int, default=4, help="en-de prompts for the AR timing")
  ap.add_argument("--max_decode_len", type=int, default=48)
  ap.add_argument("--skip", default="", help="comma list of parts to skip: shapes,extend,ar")
  ap.add_argument("--output", default=None, help="also write the figures as JSON here")
  args = ap.parse_args(argv)
  skip = set(filter(None, args.skip.split(",")))
  if jax.default_backend() != "cpu" or not build.load():
    print("the kernel needs a CPU backend and a C++ compiler (see the log line)", file=sys.stderr)
    return 1
  model, params = load_model(args.target, dtype="float32")
  kmodel, kparams = packed.pack(model, params, "kernel")
  hmodel, hparams = packed.pack(model, params, "hybrid")
  variants = {"xla": (model, params), "kernel": (kmodel, kparams), "hybrid": (hmodel, hparams),
              # float32 panels of the same weights (bfloat16 values: the packing above chose
              # bfloat16 panels, bit-for-bit the same logits from half the bytes)
              "hybrid-f32": packed.pack(model, params, "hybrid", panels="float32")}
  prompts = en_de_prompts(args.prompts, 48)
  report = {"target": args.target, "device": str(jax.devices()[0]), "rounds": args.rounds}
  if "shapes" not in skip:
    print("per matrix shape of the decode step:", flush=True)
    report["shapes"] = bench_shapes(params, kparams, args.rounds)
  if "extend" not in skip:
    print("target extend (batch 1, encoder prompt of 48):", flush=True)
    report["extend"] = bench_extend(variants, jnp.asarray(prompts[:1]), args.rounds,
                                    cache_len=args.max_decode_len + 11)
  bw = read_bandwidth_gbs(args.rounds)
  wbytes = step_weight_bytes(kparams)
  best = max(bw.values())
  report["floor"] = {"weight_mb_per_step": wbytes / 2 ** 20, "read_gb_s": bw,
                     "floor_ms": wbytes / best / 1e6}
  print(f"weights per step {wbytes / 2 ** 20:.1f} MB; read bandwidth: XLA sum "
        f"{bw['xla_sum']:.1f} GB/s, kernel T=1 {bw['kernel_T1']:.1f} GB/s; floor "
        f"{report['floor']['floor_ms']:.2f} ms/token", flush=True)
  if "ar" not in skip:
    print("autoregressive, greedy, batch 1:", flush=True)
    report["ar"] = bench_ar(variants, prompts, max(3, args.rounds // 2), args.max_decode_len)
    for k, r in report["ar"].items():
      r["over_floor"] = r["ms_per_token"] / report["floor"]["floor_ms"]
      r["best_over_floor"] = r["best_ms_per_token"] / report["floor"]["floor_ms"]
      print(f"  {k:>10}: {r['over_floor']:.2f}x the floor (best round {r['best_over_floor']:.2f}x)",
            flush=True)
  if args.output:
    with open(args.output, "w", encoding="utf-8") as f:
      json.dump(report, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
