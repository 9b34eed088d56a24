r"""Writes the corpus index a corpus-lookup draft retrieves from (`DRAFT='corpus_lookup'`).

The corpus is token sequences in the target's tokenizer: finished `distill_data` task
directories (the target's own replies to training prompts, never the measured ones; the reply
tokens, or prompt and reply with --with_prompts). Every distinct n-gram (n <= --max_ngram) is
stored with its most frequent continuation (`specdec_jax.data.corpus_index`).

  python -m specdec_jax.distill_data \
      --gin_file=configs/local/train/generate/smollm2_code_greedy.gin --output_dir=runs/seqkd/code
  python scripts/corpus_index.py --distill_dir=runs/seqkd/code/code_complete \
      --target=smollm2-135m-instruct --output=runs/smollm2_code_corpus.npz
  python -m specdec_jax.run --gin_file=configs/local/smollm2_humaneval.gin \
      --gin.DRAFT="'corpus_lookup'" --gin.RunConfig.lookup_corpus="'runs/smollm2_code_corpus.npz'" \
      --output_dir=runs/he_corpus

The output must be a new file (nothing is written on an error).
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--distill_dir", action="append", required=True,
                      help="a finished distill_data task directory (repeatable)")
  parser.add_argument("--target", required=True,
                      help="the target checkpoint or name whose vocabulary the ids are in")
  parser.add_argument("--output", required=True, help="the .npz to write (must not exist)")
  parser.add_argument("--max_ngram", type=int, default=4)
  parser.add_argument("--min_count", type=int, default=1)
  parser.add_argument("--with_prompts", action="store_true",
                      help="index each record's prompt before its reply")
  args = parser.parse_args(argv)
  from specdec_jax.checkpoints import loader
  from specdec_jax.data import corpus_index
  if os.path.exists(args.output):
    print(f"error: --output {args.output!r} exists; name a new file", file=sys.stderr)
    return 1
  if not args.output.endswith(".npz"):
    print(f"error: --output {args.output!r} must end in .npz", file=sys.stderr)
    return 1
  try:
    vocab_size = loader.model_config(args.target).vocab_size
    seqs = [s for d in args.distill_dir
            for s in corpus_index.distill_sequences(d, with_prompts=args.with_prompts)]
    index = corpus_index.build_corpus_index(seqs, vocab_size, max_ngram=args.max_ngram,
                                            min_count=args.min_count)
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  meta = {"source": [os.path.abspath(d) for d in args.distill_dir], "target": args.target,
          "vocab_size": vocab_size, "sequences": len(seqs),
          "tokens": int(sum(len(s) for s in seqs)), "max_ngram": args.max_ngram,
          "min_count": args.min_count, "with_prompts": args.with_prompts,
          "ngrams": int(index["corpus_keys"].shape[0])}
  corpus_index.save_index(args.output, index, meta)
  print(json.dumps({"written": args.output, **meta}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
