"""The corpus index of the corpus-lookup draft (`models.model_free.CorpusLookupDraft`).

Why: retrieval drafting (REST, He et al. 2024) proposes what usually follows the last few tokens
in a corpus, e.g. the target's own replies to training prompts (`specdec_jax.distill_data`).
Scanning the corpus at every draft step would cost O(corpus) per token; instead every distinct
n-gram (n = 1..max_ngram) is stored once with its most frequent continuation, sorted by the
draft's own hash (`model_free.suffix_hashes`), so a draft step is a few binary searches.

The index (`model_free.CORPUS_KEYS`): corpus_keys [U] uint32 (sorted), corpus_grams [U, N] int32
(the n-gram, latest token first, -1 past its length), corpus_next [U] int32 (its most frequent
continuation, ties to the smaller id), corpus_count [U] int32 (how often that continuation
followed). Two n-grams whose hashes collide keep the more frequent one (the other is a miss).
Sequences are separate documents: no n-gram spans two.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

import jax
import numpy as np

from specdec_jax.models import model_free


def build_corpus_index(sequences: Iterable[Sequence[int]], vocab_size: int, *,
                       max_ngram: int = 4, min_count: int = 1) -> dict[str, np.ndarray]:
  """The index of every n-gram (1 <= n <= max_ngram) followed by a token in `sequences`.

  min_count: n-grams whose most frequent continuation was seen fewer times are left out (1 keeps
    all; 2 drops what the corpus saw once, which a longer query n-gram would otherwise prefer).
  """
  if max_ngram < 1 or min_count < 1:
    raise ValueError(f"need max_ngram >= 1 and min_count >= 1, got {max_ngram}, {min_count}")
  # suffix[j, k] = the token k before position j (-1 before the document's start), and the
  # token after j: one row per position that has a continuation.
  suffixes, nexts = [], []
  for seq in sequences:
    arr = np.asarray(list(seq), np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
      raise ValueError(f"token id out of range [0, {vocab_size}) in a corpus sequence")
    if arr.size < 2:
      continue
    j = np.arange(arr.size - 1)
    src = j[:, None] - np.arange(max_ngram)[None, :]
    suffixes.append(np.where(src >= 0, arr[np.maximum(src, 0)], -1))
    nexts.append(arr[1:])
  if not suffixes:
    raise ValueError("no corpus sequence has two tokens: nothing to index")
  suffix_JxN = np.concatenate(suffixes).astype(np.int32)
  next_J = np.concatenate(nexts).astype(np.int32)
  hash_fn = jax.jit(model_free.suffix_hashes)
  keys, grams, nxt, count = [], [], [], []
  for n in range(1, max_ngram + 1):
    ok = np.all(suffix_JxN[:, :n] >= 0, axis=1)
    gram_JxN = np.where(np.arange(max_ngram)[None, :] < n, suffix_JxN, -1)[ok]
    # Distinct (gram, next) pairs and their counts, then each gram's most frequent next.
    pairs, counts = np.unique(np.concatenate([gram_JxN, next_J[ok][:, None]], axis=1), axis=0,
                              return_counts=True)
    p_gram, p_next = pairs[:, :-1], pairs[:, -1]
    p_hash = np.asarray(hash_fn(p_gram))[:, n - 1]
    order = np.lexsort((p_next, -counts, p_hash))  # by gram hash, most frequent first
    p_gram, p_next, p_hash, p_count = (p_gram[order], p_next[order], p_hash[order],
                                       counts[order])
    same_gram = np.concatenate([[False], np.all(p_gram[1:] == p_gram[:-1], axis=1)])
    keep = ~same_gram & (p_count >= min_count)
    keys.append(p_hash[keep])
    grams.append(p_gram[keep])
    nxt.append(p_next[keep])
    count.append(p_count[keep])
  keys_U, grams_UxN = np.concatenate(keys), np.concatenate(grams)
  next_U, count_U = np.concatenate(nxt), np.concatenate(count)
  order = np.lexsort((-count_U, keys_U))  # by hash; within a collision the most frequent first
  keys_U, grams_UxN, next_U, count_U = (keys_U[order], grams_UxN[order], next_U[order],
                                        count_U[order])
  first = np.concatenate([[True], keys_U[1:] != keys_U[:-1]])
  return {"corpus_keys": keys_U[first].astype(np.uint32),
          "corpus_grams": grams_UxN[first].astype(np.int32),
          "corpus_next": next_U[first].astype(np.int32),
          "corpus_count": count_U[first].astype(np.int32)}


def check_index(index, vocab_size: int) -> None:
  """Refuses what is not a corpus index over `vocab_size` ids, naming what is wrong."""
  missing = [k for k in model_free.CORPUS_KEYS if k not in index]
  if missing:
    raise ValueError(f"not a corpus index: no {', '.join(missing)} (data.corpus_index builds one; "
                     "scripts/corpus_index.py writes it)")
  u = index["corpus_keys"].shape[0]
  if u == 0 or any(index[k].shape[0] != u for k in model_free.CORPUS_KEYS):
    raise ValueError("corpus index: empty, or its arrays differ in length")
  nxt = np.asarray(index["corpus_next"])
  if nxt.min() < 0 or nxt.max() >= vocab_size:
    raise ValueError(f"corpus index continuations fall outside the target's vocabulary "
                     f"[0, {vocab_size}): built with another tokenizer?")


def distill_sequences(directory: str, *, with_prompts: bool = False) -> list[list[int]]:
  """The token sequences of a finished `distill_data` task directory (sequences.jsonl): each
  record's output_ids, after its input_ids when `with_prompts`."""
  path = os.path.join(directory, "sequences.jsonl")
  index_path = os.path.join(directory, "index.json")
  if not os.path.exists(path) or not os.path.exists(index_path):
    raise ValueError(f"{directory}: no sequences.jsonl / index.json (a distill_data task "
                     "directory, e.g. OUTPUT_DIR/code_complete)")
  with open(index_path) as f:
    if not json.load(f).get("complete"):
      raise ValueError(f"{directory}: the distill_data job has not finished (index.json: "
                       "complete is false); re-run its command to resume it")
  seqs = []
  with open(path) as f:
    for line in f:
      rec = json.loads(line)
      seqs.append((list(rec["input_ids"]) if with_prompts else []) + list(rec["output_ids"]))
  return seqs


def save_index(path: str, index: dict[str, np.ndarray], meta: dict) -> None:
  """One .npz (what `RunConfig.lookup_corpus` names), `meta` as JSON beside the arrays;
  written to a temporary name first, so a killed write leaves nothing at `path`."""
  tmp = f"{path}.{os.getpid()}.tmp.npz"
  np.savez_compressed(tmp, meta=np.asarray(json.dumps(meta, sort_keys=True)), **index)
  os.replace(tmp, path)


def load_index(path: str) -> tuple[dict[str, np.ndarray], dict]:
  with np.load(path) as f:
    index = {k: f[k] for k in f.files if k != "meta"}
    meta = json.loads(str(f["meta"])) if "meta" in f.files else {}
  return index, meta
