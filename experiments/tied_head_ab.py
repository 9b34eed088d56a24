r"""A tied output head as XLA's product over the embedding table against it untied and packed, in
the decode loops, one process.

Why: the float32 SmolLM2 target's head (its 49,152 x 576 embedding) went through XLA's product
over the [V, D] table, which re-reads it from two rows on; since 2026-12-08 `models.packed`
unties it for targets too (`_untied`: a projection like the rest, the kernel from two rows on).
This times both targets in one process: the autoregressive loop and the speculative loop of the
SmolLM2 configs' draft (q4 self-draft in the target's cache, prompt lookup first, 5 / 5, 3-token
match) on summarize TRAINING documents in the chat format (no measured prompt), every variant
interleaved per document (one untimed warm call, then `--rounds` timed ones, the order reversed
each round). The tied target is `models.packed` with `_untied` patched to the identity while it
packs (the code before the change). Prints and writes (`--output`, refused if it exists) each
variant's ms per token, and untied over tied for each loop with a paired bootstrap 95 % interval
over documents, and whether the two targets wrote the same tokens. (Record
smollm2_tied_head_ab_t1 came from commit 71acfef's copy of the prompt building and bootstrap,
since replaced by `chat.apply` and `metrics.bootstrap`.)

  SPECDEC_HOME=/tmp/sdhome python experiments/tied_head_ab.py --documents=16 \
      --output=/tmp/tied_ab/metrics.json
"""
from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.checkpoints import fetch
from specdec_jax.checkpoints.loader import load_model
from specdec_jax.data import chat, hf_tokenizer, local_tasks
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.lookup_token import LookupTokenDrafter
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.metrics import bootstrap
from specdec_jax.models import packed


def targets(model, params):
  """(untied, tied) packed targets: the current packing, and the same with `_untied` off."""
  untied = packed.for_backend(model, params)
  saved = packed._untied  # pylint: disable=protected-access
  packed._untied = lambda m, p: (m, p)  # pylint: disable=protected-access
  try:
    tied = packed.for_backend(model, params)
  finally:
    packed._untied = saved  # pylint: disable=protected-access
  if untied[0].config.tie_embeddings or not tied[0].config.tie_embeddings:
    raise SystemExit("tied_head_ab: the target is not a tied model, nothing to compare")
  return untied, tied


def prompts(ck: str, n: int, width: int) -> list[list[int]]:
  """The first `n` summarize training documents as the summaries config asks them (`chat.apply`,
  the runner's door), each cut to its last `width` tokens."""
  vocab = hf_tokenizer.HFTokenizerVocabulary(ck)
  examples = chat.apply(local_tasks.load_examples("summarize", "train", n), vocab, "chat")
  return [vocab.encode(ex.inputs)[-width:] for ex in examples]


def ratio(base_Px2, other_Px2) -> dict:
  """base ms per token over other's (sums over documents), with `bootstrap`'s paired interval."""
  (bs, bt), (os_, ot) = base_Px2.T, other_Px2.T
  return {"value": float((bs.sum() / bt.sum()) / (os_.sum() / ot.sum())),
          "interval95": list(bootstrap.ratio_of_ratios_interval(bs, bt, os_, ot))}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--documents", type=int, default=16)
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--temperature", type=float, default=1.0, help="top-p 0.95 when > 0")
  ap.add_argument("--max_decode_len", type=int, default=64)
  ap.add_argument("--width", type=int, default=1024, help="prompt tokens kept (the last ones)")
  ap.add_argument("--output", required=True)
  args = ap.parse_args()
  if os.path.exists(args.output):
    raise SystemExit(f"--output {args.output} exists; results are not overwritten")
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  ck = fetch.ensure("smollm2-135m-instruct")
  model, params = load_model(ck)
  (um, up), (tm, tp) = targets(model, params)
  dm, dp = packed.for_backend(model, params, panels="q4", role="draft")
  t = args.temperature
  sampling = SamplingConfig(temperature=t, top_p=0.95 if t else 1.0)
  n = args.max_decode_len
  spec = lambda m: Decoder(m, dm, Chain(5), sampling, max_decode_len=n,
                           drafter=LookupTokenDrafter(draft_gamma=5, lookup_ngram=3))
  variants = {"tied_ar": (Decoder(tm, sampling=sampling, max_decode_len=n), Params(tp)),
              "untied_ar": (Decoder(um, sampling=sampling, max_decode_len=n), Params(up)),
              "tied_spec": (spec(tm), Params(tp, dp)), "untied_spec": (spec(um), Params(up, dp))}
  gen = {k: jax.jit(lambda p, x, r, d=d: d.generate(p, x, r)) for k, (d, _) in variants.items()}
  rows = {k: np.zeros((args.documents, 2)) for k in variants}  # seconds, tokens
  same = {"ar": True, "spec": True}
  for j, ids in enumerate(prompts(ck, args.documents, args.width)):
    x = jnp.asarray([ids], jnp.int32)
    outs = {}
    for rnd in range(args.rounds + 1):
      for k in (list(variants) if rnd % 2 else list(variants)[::-1]):
        t0 = time.perf_counter()
        r = gen[k](variants[k][1], x, jax.random.key(j))
        jax.block_until_ready(r.tokens_BxN)
        if rnd:
          rows[k][j] += [time.perf_counter() - t0, int(r.lengths_B[0])]
        outs[k] = np.asarray(r.tokens_BxN).tolist()
    for loop in same:
      same[loop] &= outs[f"tied_{loop}"] == outs[f"untied_{loop}"]
    jax.clear_caches()  # each prompt length compiles anew; kept, they fill the memory
    print(j, {k: round(float(v[:j + 1, 0].sum()), 2) for k, v in rows.items()}, flush=True)
  out = {"kind": "tied_head_ab", "target": "smollm2-135m-instruct", "draft": "q4 self-draft, "
         "prompt lookup first 5/5, lookup_ngram 3", "temperature": t,
         "top_p": sampling.top_p, "documents": args.documents, "rounds": args.rounds,
         "max_decode_len": n, "prompt_width": args.width, "same_tokens": same,
         "ms_per_token": {k: float(1e3 * v[:, 0].sum() / v[:, 1].sum()) for k, v in rows.items()},
         "untied_over_tied": {loop: ratio(rows[f"tied_{loop}"], rows[f"untied_{loop}"])
                              for loop in ("ar", "spec")},
         "speedup": {h: ratio(rows[f"{h}_ar"], rows[f"{h}_spec"]) for h in ("tied", "untied")},
         "per_document": {k: v.tolist() for k, v in rows.items()}}
  print(json.dumps({k: out[k] for k in ("ms_per_token", "untied_over_tied", "speedup",
                                        "same_tokens")}, indent=1))
  with open(args.output, "x", encoding="utf-8") as f:
    json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
