"""The self-draft's weight layout, chosen on held-out HumanEval problems: int8 against q4 panels.

Why: a self-draft (the target's checkpoint as its own draft) pays only if its step is cheap, and
its layout sets both its bytes (int8 8 bits a weight, q4 5) and its acceptance. SmolLM2-135M's
projections are Q4_1 values, so q4 panels recover them exactly; its head is Q8_0, so a 4-bit
head is a real rounding. This decodes the first `--problems` of HumanEval's 48 held-out
calibration problems (the runs' calibration split: never measured), plain completion, batch 1,
in one process, every variant interleaved per problem (one untimed warm call, one discarded
round, one timed round), and prints each variant's ms per token, speedup over the
autoregressive loop, tokens per target call, acceptance and whether its tokens equal the
autoregressive ones, with `--output` a JSON of per-problem figures and, for each variant, its
speed relative to the autoregressive loop and to `--baseline` with bootstrap 95 % intervals over
problems (paired: a resample takes a problem's every variant). Variants: the self-draft alone
(self_*: Chain(gamma), prompt_cache 'shared') and lookup-first (lookup_*: `LookupTokenDrafter`,
gamma / gamma, lookup_ngram 3) with int8 panels, q4 panels (q4 layers, int8 head:
`draft_panels='q4'`) and all_q4 (the head in q4 too, built here).

  SPECDEC_HOME=/tmp/sdhome python experiments/self_draft_panels.py --problems=8
  SPECDEC_HOME=/tmp/sdhome python experiments/self_draft_panels.py --offset=8 --problems=40 \
      --variants=lookup_int8,lookup_q4 --baseline=lookup_int8 --output=/tmp/panels.json
"""
from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from tokenizers import Tokenizer

from specdec_jax import api
from specdec_jax.checkpoints import fetch
from specdec_jax.checkpoints.loader import load_model
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.drafter import TokenDrafter
from specdec_jax.decoding.lookup_token import LookupTokenDrafter
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.kernels import matmul as kmatmul
from specdec_jax.models import packed
from specdec_jax.runner.prompt_sets import choose

flags.DEFINE_integer("problems", 8, "Held-out calibration problems decoded.")
flags.DEFINE_integer("offset", 0, "Skip this many calibration problems first (those a choice "
                     "was made on).")
flags.DEFINE_list("variants", [], "Variants beside 'ar' (default: all six).")
flags.DEFINE_string("baseline", None, "A variant every other is also compared with.")
flags.DEFINE_string("output", None, "A JSON of the figures (refused if it exists).")
flags.DEFINE_integer("gamma", 5, "Draft tokens (and lookup tokens) per iteration.")
flags.DEFINE_integer("max_decode_len", 128, "New tokens per problem.")
flags.DEFINE_float("temperature", 0.0, "0: greedy; else sampled with top-p 0.95.")
FLAGS = flags.FLAGS


def _all_q4(dp4):
  """q4 panels' tree with the head packed in q4 too (its "hybrid" kernel the dequantized one)."""
  head = dp4["decoder"]["logits_dense"]
  width = head["kernel"].shape[-1]
  panels_q4 = kmatmul.pack_q4_panels(kmatmul.unpack_panels(head["kernel_panels"], width))
  head = {"kernel_panels": panels_q4, "kernel": kmatmul.unpack_panels(panels_q4, width)}
  return {**dp4, "decoder": {**dp4["decoder"], "logits_dense": head}}


def main(argv):
  del argv
  ck = fetch.ensure("smollm2-135m-instruct")
  model, params = load_model(ck)
  tm, tp = packed.for_backend(model, params)
  dm8, dp8 = packed.for_backend(model, params, panels="int8", role="draft")
  dm4, dp4 = packed.for_backend(model, params, panels="q4", role="draft")
  drafts = {"int8": (dm8, dp8), "q4": (dm4, dp4), "all_q4": (dm4, _all_q4(dp4))}
  tok = Tokenizer.from_file(f"{ck}/tokenizer.json")
  problems = api.humaneval()
  cal = choose(len(problems), num_examples=None, calibration_examples=48, seed=0).calibration
  if FLAGS.output and os.path.exists(FLAGS.output):
    raise app.UsageError(f"--output {FLAGS.output} exists; results are not overwritten")
  chosen = list(cal[FLAGS.offset:FLAGS.offset + FLAGS.problems])
  prompts = [tok.encode(problems[i]["prompt"]).ids for i in chosen]
  t = FLAGS.temperature
  sampling = SamplingConfig(temperature=t, top_p=0.95 if t else 1.0)
  g, n = FLAGS.gamma, FLAGS.max_decode_len
  variants = {"ar": (Decoder(tm, sampling=sampling, max_decode_len=n), Params(tp))}
  for name, (dm, dp) in drafts.items():
    variants[f"self_{name}"] = (Decoder(tm, dm, Chain(g), sampling, max_decode_len=n,
                                        drafter=TokenDrafter(prompt_cache="shared")),
                                Params(tp, dp))
    variants[f"lookup_{name}"] = (Decoder(tm, dm, Chain(g), sampling, max_decode_len=n,
                                          drafter=LookupTokenDrafter(draft_gamma=g,
                                                                     lookup_ngram=3)),
                                  Params(tp, dp))
  if FLAGS.variants:
    unknown = set(FLAGS.variants) - set(variants)
    if unknown:
      raise app.UsageError(f"unknown --variants {sorted(unknown)}; known: {sorted(variants)}")
    variants = {k: v for k, v in variants.items() if k == "ar" or k in FLAGS.variants}
  gen = {k: jax.jit(lambda p, x, r, d=d: d.generate(p, x, r)) for k, (d, _) in variants.items()}
  # per problem: seconds, tokens, target calls, accepted, drafted
  rows = {k: np.zeros((len(prompts), 5)) for k in variants}
  outs = {k: [] for k in variants}
  for j, ids in enumerate(prompts):
    x = jnp.asarray([ids], jnp.int32)
    for rnd in range(3):
      for k, (_, p) in variants.items():
        t0 = time.perf_counter()
        r = gen[k](p, x, jax.random.key(j))
        jax.block_until_ready(r.tokens_BxN)
        if rnd == 2:
          c = r.counters
          rows[k][j] = [time.perf_counter() - t0, int(r.lengths_B[0]),
                        int(np.sum(c.target_calls_B)), int(np.sum(c.accepted_B)),
                        int(np.sum(c.drafted_B))]
          outs[k].append(np.asarray(r.tokens_BxN[0]).tolist())
    print(j, {k: round(float(v[:j + 1, 0].sum()), 2) for k, v in rows.items()}, flush=True)
    # Each prompt length compiles every variant's program anew; kept, they ran a 40-problem
    # run out of memory (23 GB) at its 39th problem.
    jax.clear_caches()
  summary = {}
  for k, v in rows.items():
    tot = v.sum(axis=0)
    summary[k] = {"ms_per_token": 1000 * tot[0] / tot[1], "tokens_per_call": tot[1] / tot[2],
                  "acceptance": tot[3] / max(tot[4], 1), "same_tokens_as_ar": outs[k] == outs["ar"],
                  "speedup": _ratio(rows["ar"], v)}
    if FLAGS.baseline and k != FLAGS.baseline:
      summary[k]["over_" + FLAGS.baseline] = _ratio(rows[FLAGS.baseline], v)
    print(k, json.dumps(summary[k]))
  if FLAGS.output:
    with open(FLAGS.output, "x", encoding="utf-8") as f:
      json.dump({"problems": [int(i) for i in chosen], "temperature": t, "gamma": g,
                 "max_decode_len": n, "summary": summary,
                 "per_problem": {k: v.tolist() for k, v in rows.items()},
                 "columns": ["seconds", "tokens", "target_calls", "accepted", "drafted"]}, f,
                indent=1)


def _ratio(base_Px5, other_Px5, resamples: int = 2000, seed: int = 0) -> dict:
  """How much faster `other` is than `base` per token (their ms per token's ratio over all
  problems) with a paired bootstrap 95 % interval over problems."""
  per_token = lambda rows, idx: rows[idx, 0].sum() / rows[idx, 1].sum()
  every = np.arange(len(base_Px5))
  rng = np.random.default_rng(seed)
  draws = [per_token(base_Px5, i) / per_token(other_Px5, i)
           for i in rng.integers(0, len(every), (resamples, len(every)))]
  return {"value": float(per_token(base_Px5, every) / per_token(other_Px5, every)),
          "interval95": [float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))]}


if __name__ == "__main__":
  app.run(main)
