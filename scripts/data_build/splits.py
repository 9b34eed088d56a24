"""Deterministic train / valid / test splits and the written <task>/<split>.jsonl.xz files.

Why: a row's split depends on its key only (sha1(key) % 1000 < 10 -> test, < 20 -> valid, else
train), so rebuilds agree with each other. The key (`local_tasks.source_key`) is the lower-cased
English text (translation), the document text (summaries: sibling binary packages share one
description, which must not straddle the splits) and the source file (code, so no function of a
held-out file is trained on). The committed files are the local benchmark's own split, made on a
key it does not spell out, so rows whose key is in the committed valid split never reach a
rebuilt train split: models trained on a rebuild can still be evaluated on the committed files.
"""
from __future__ import annotations

import collections
import hashlib
import json
import lzma
from pathlib import Path

from absl import logging

from specdec_jax.data import local_tasks

# Short UI strings (the gettext sources of translate_en_de) go to train only.
TRAIN_ONLY_DEFAULT = ["mo_base", "mo_gcc", "mo_lo", "mo_pypi", "mo_plone"]


def bucket(key: str) -> str:
  """'test', 'valid' or 'train' by sha1(key) % 1000: < 10, < 20, the rest."""
  b = int(hashlib.sha1(key.encode("utf-8")).hexdigest(), 16) % 1000
  return "test" if b < 10 else "valid" if b < 20 else "train"


def split_key(task: str, row: dict) -> str:
  """What decides the split of a row of `task` (rows with the same key share a split)."""
  return local_tasks.source_key(task, row)


def holdout_keys(task: str, holdout_from: str) -> set[str]:
  """Keys of `holdout_from`/<task>/valid.jsonl.xz (--holdout_from; '' for none)."""
  if not holdout_from:
    return set()
  path = Path(holdout_from) / task / "valid.jsonl.xz"
  if not path.is_file():
    logging.warning("no %s; no holdout for %s", path, task)
    return set()
  with lzma.open(path, "rt", encoding="utf-8") as f:
    return {split_key(task, json.loads(line)) for line in f if line.strip()}


def write_task(out_dir: Path, task: str, rows: list[dict], info: dict, *, holdout_from: str,
               train_only: list[str], xz_preset: int):
  """Writes out_dir/<task>/{train,valid,test}.jsonl.xz and its row counts into `info[task]`.

  Rows of the `train_only` sources (--train_only_sources) go to train; a train row whose key is
  held out is dropped and counted.
  """
  held = holdout_keys(task, holdout_from)
  train_only = set(train_only)
  splits = collections.defaultdict(list)
  counts = collections.defaultdict(collections.Counter)
  dropped = 0
  for row in rows:
    key = split_key(task, row)
    split = "train" if row.get("src") in train_only else bucket(key)
    if split == "train" and key in held:
      dropped += 1
      continue
    splits[split].append(row)
    counts[split][row.get("src", task)] += 1
  (out_dir / task).mkdir(parents=True, exist_ok=True)
  for split in ("train", "valid", "test"):
    with lzma.open(out_dir / task / f"{split}.jsonl.xz", "wt", encoding="utf-8",
                   preset=xz_preset) as f:
      for row in splits[split]:
        f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
  info[task] = {"rows": {s: len(splits[s]) for s in ("train", "valid", "test")},
                "by_source": {s: dict(c) for s, c in counts.items()},
                "dropped_from_train_as_committed_valid": dropped}
  logging.info("%s: %s", task, info[task]["rows"])
