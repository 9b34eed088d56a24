r"""Writes a draft checkpoint's token ranking (head_ranking.json) from its training targets.

A run with `DRAFT_HEAD_VOCAB = K` (RunConfig.draft_head_vocab) restricts the draft's output head to
the K first ids of this ranking (specdec_jax/models/head_vocab.py: exact for any K; only alpha
depends on it). The ranking counts the decoder-side tokens of the training config's tasks, each
task's counts normalised to frequencies and mixed by its TaskSpec.weight, as the training batches
mix them (the "ranking" a run uses for a task the draft did not train on), and each task's own
(what a run on that task uses); for a distilled draft those targets are the target's own outputs,
the tokens it will have to propose.

  python scripts/head_ranking.py \
      --gin_file=configs/local/train/t5_shared_draft_seqkd_fkl.gin \
      --checkpoint=specdec_jax/assets/zoo/t5_shared_draft

Also prints the share of each task's target tokens the K most frequent ids cover (--report_k).
Needs the tasks the config trains on (a generated-sequence directory is made by
`python -m specdec_jax.distill_data`, see the config's comment).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np


def task_frequencies(cfg, vocab_size: int, encoder_decoder: bool
                     ) -> list[tuple[str, float, np.ndarray]]:
  """[(task name, weight, token frequencies [V])] over the decoder-side targets of cfg.tasks."""
  from specdec_jax.data import tasks as tasks_lib
  from specdec_jax.training import data as data_lib
  vocab = tasks_lib.load_vocabulary(cfg.vocabulary, required=True)  # SentencePiece or tokenizer.json
  return data_lib.target_frequencies(
      [data_lib.tokenize_task(spec, vocab, encoder_decoder, "train") for spec in cfg.tasks],
      vocab_size)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--gin_file", action="append", required=True,
                      help="the draft's training config (its TrainConfig.tasks are counted)")
  parser.add_argument("--gin", action="append", default=[], help="extra gin bindings")
  parser.add_argument("--checkpoint", required=True,
                      help="the draft checkpoint directory to write head_ranking.json into")
  parser.add_argument("--report_k", default="1024,2048,3072,4096",
                      help="comma list of K to report the coverage of")
  args = parser.parse_args(argv)
  from specdec_jax import train as train_cli
  from specdec_jax.checkpoints import feature_draft_io as fd_ckpt
  from specdec_jax.checkpoints import head_ranking, loader
  from specdec_jax.models import head_vocab
  ckpt = args.checkpoint
  if not os.path.isdir(ckpt):
    print(f"error: --checkpoint {ckpt!r} is not a directory", file=sys.stderr)
    return 1
  cfg = train_cli.parse(args.gin_file, args.gin)
  if fd_ckpt.is_feature_draft(ckpt):  # its config is enough: vocabulary, EOS, kind
    model = fd_ckpt.read_draft(ckpt)
    encoder_decoder = model.config.kind == "t5"
  else:
    model, _ = loader.load_model(ckpt, vocab_size=None, dtype=None, seed=0)
    encoder_decoder = model.config.is_encoder_decoder
  v = model.vocab_size
  freqs = task_frequencies(cfg, v, encoder_decoder)
  from specdec_jax.training import data as data_lib
  mixed_V = data_lib.mixed_frequencies(freqs)
  ranking = head_ranking.ranking_from_counts(mixed_V)
  source = ("token frequencies of the decoder-side training targets of " +
            ", ".join(args.gin_file) + ": " +
            ", ".join(f"{name} (weight {w:g})" for name, w, _ in freqs))
  per_task = {name: head_ranking.ranking_from_counts(f) for name, _, f in freqs}
  path = head_ranking.write_ranking(ckpt, ranking, v, source, tasks=per_task)
  report = {}
  for k in (int(x) for x in args.report_k.split(",") if x):
    report[k] = {}
    for name, _, f in freqs:  # a task's share of target tokens: its own ranking, the mixture's
      own = np.asarray(head_vocab.select(per_task[name], min(k, v), model.eos_id))
      mixed = np.asarray(head_vocab.select(ranking, min(k, v), model.eos_id))
      report[k][name] = {"own": round(float(f[own].sum()), 4),
                         "mixture": round(float(f[mixed].sum()), 4)}
  print(json.dumps({"written": path, "distinct_tokens": int((mixed_V > 0).sum()),
                    "coverage_of_targets": report}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
