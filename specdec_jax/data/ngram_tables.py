"""N-gram tables for the model-free drafts: estimated on the streams the target decodes, stored.

Why one path: the run (`python -m specdec_jax.run`, on TASK's train split) and the scripts
(`scripts/bench_drafts.py`, `check_exactness`) must estimate the same tables from the same token
streams, or a benchmark's bigram alpha is not the run's. Every caller goes through
`tables_for_examples` (`tables_for_task` adds a disk cache under $SPECDEC_CACHE_DIR), which
counts `streams`; the run reaches it through `tables_for_run`, a script through `draft_params`.
Why in data/: this is reading, tokenizing, counting and caching data; the drafts
(`models/model_free.py`) only take the finished tables as their params and never read a file.

The tables (float32 / int32): log_unigram [V], next_ids [V, K], next_counts [V, K], backoff [V],
total [V]: the params of `model_free.UnigramDraft`, `BigramDraft` and `PromptLookupDraft`.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.data import local_tasks
from specdec_jax.paths import resolve_path


def build_ngram_tables(sequences: Iterable[Sequence[int]], vocab_size: int, *, top_k: int = 64,
                       add_alpha: float = 0.1, prior: float = 1.0, bos_id: int | None = None,
                       eos_id: int | None = None) -> dict[str, np.ndarray]:
  """Unigram and (top-K sparse) bigram tables from token-id sequences (e.g. training targets).

  Args:
    sequences: token ids; `bos_id` / `eos_id` are added around each when given (T5 decoder
      streams start with BOS = 0 and end with EOS = 1, so the first token gets a bigram row too).
    add_alpha: pseudo-count of every token in the unigram (no token gets probability 0).
    prior: weight of the unigram inside each bigram row (Dirichlet smoothing).
  Returns:
    float32 / int32 arrays: log_unigram [V], next_ids [V, K], next_counts [V, K], backoff [V],
    total [V]; the params of `UnigramDraft`, `BigramDraft` and `PromptLookupDraft`.
  """
  v = int(vocab_size)
  firsts, seconds, singles = [], [], []
  for seq in sequences:
    ids = ([bos_id] if bos_id is not None else []) + list(seq) + (
        [eos_id] if eos_id is not None else [])
    arr = np.asarray(ids, np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= v):
      raise ValueError(f"token id out of range [0, {v}) in a training sequence")
    singles.append(arr[1:] if bos_id is not None else arr)
    firsts.append(arr[:-1])
    seconds.append(arr[1:])
  cat = lambda xs: np.concatenate(xs) if xs else np.zeros((0,), np.int64)  # noqa: E731
  uni = np.bincount(cat(singles), minlength=v).astype(np.float64)
  u = (uni + add_alpha) / (uni.sum() + add_alpha * v)
  codes, counts = np.unique(cat(firsts) * v + cat(seconds), return_counts=True)
  rows, cols = codes // v, codes % v
  row_total = np.bincount(rows, weights=counts, minlength=v)
  # Within each row: most frequent first, ties to the smaller id; keep the first K.
  order = np.lexsort((cols, -counts, rows))
  rows, cols, counts = rows[order], cols[order], counts[order]
  first_of_row = np.searchsorted(rows, rows, side="left")
  rank = np.arange(rows.size) - first_of_row
  keep = rank < min(top_k, v)
  k = min(top_k, v)
  next_ids = np.zeros((v, k), np.int32)
  next_counts = np.zeros((v, k), np.float64)
  next_ids[rows[keep], rank[keep]] = cols[keep]
  next_counts[rows[keep], rank[keep]] = counts[keep]
  dropped = row_total - next_counts.sum(axis=1)
  return {"log_unigram": np.log(u).astype(np.float32), "next_ids": next_ids,
          "next_counts": next_counts.astype(np.float32),
          "backoff": (prior + dropped).astype(np.float32),
          "total": (prior + row_total).astype(np.float32)}


def uniform_tables(vocab_size: int, top_k: int = 1) -> dict[str, np.ndarray]:
  """Tables with no data: a uniform unigram and bigram (used when no task is given)."""
  return build_ngram_tables([], vocab_size, top_k=top_k)


def save_tables(path, tables: dict[str, np.ndarray]) -> None:
  """Writes the tables as one .npz (what a gin file points `DRAFT_CHECKPOINT` at)."""
  np.savez(path, **tables)


def load_tables(path) -> dict[str, jax.Array]:
  with np.load(path) as f:
    return {name: jnp.asarray(f[name]) for name in f.files}


def streams(examples, vocab, *, encoder_decoder: bool) -> list[list[int]]:
  """The token streams the target's decoder produces on `examples`: what the tables count.

  Encoder-decoder: the tokenized reference (BOS / EOS are added by `tables_for_examples`).
  Decoder-only: the prompt exactly as the runner tokenizes it (`local_tasks.tokenize_examples`,
  no EOS), then the tokenized reference. Examples without a reference contribute their prompt
  ids, and without a vocabulary only `input_ids` lines can contribute: that is all they have.
  """
  out = []
  for ex in examples:
    if vocab is None:
      prompt = list(ex.input_ids) if ex.input_ids is not None else []
    elif encoder_decoder and ex.reference is not None:
      prompt = []
    else:
      prompt = local_tasks.tokenize_examples([ex], vocab, add_eos=False)[0]
    ref = vocab.encode(ex.reference) if (vocab is not None and ex.reference is not None) else []
    out.append(ref if encoder_decoder and ref else prompt + ref)
  return [s for s in out if s]


def tables_for_examples(examples, vocab, target, *, top_k: int = 64) -> dict[str, np.ndarray]:
  """Unigram / bigram tables of the streams `target` decodes on `examples` (`streams`); T5 streams
  get BOS (= pad id) and EOS around them, as the decode loop sees them. Ids outside the target's
  vocabulary (a padded vocabulary's tail) are dropped."""
  ed = target.kind == "t5"
  seqs = [[t for t in s if t < target.vocab_size]
          for s in streams(examples, vocab, encoder_decoder=ed)]
  seqs = [s for s in seqs if s]
  if not seqs:
    raise ValueError("no token streams to estimate n-gram tables on (no references, no input "
                     "ids); give RunConfig.ngram_tables (an .npz of save_tables)")
  return build_ngram_tables(seqs, target.vocab_size, top_k=top_k,
                            bos_id=target.pad_id if ed else None,
                            eos_id=target.eos_id if ed else None)


def cache_dir() -> str:
  return os.environ.get("SPECDEC_CACHE_DIR",
                        os.path.join(os.path.expanduser("~"), ".cache", "specdec_jax"))


def _cache_file(path, split: str, max_examples: int | None, top_k: int, vocab, target) -> str:
  """CACHE_DIR/ngram/<16 hex>.npz, keyed by the task file (path, size, mtime) and every input of
  the estimate."""
  st = os.stat(path)
  key = json.dumps(["streams-v2", str(path), st.st_size, int(st.st_mtime), split, max_examples,
                    top_k, target.vocab_size, target.kind, target.eos_id, target.pad_id,
                    None if vocab is None else str(getattr(vocab, "model_file", vocab))])
  return os.path.join(cache_dir(), "ngram", hashlib.sha1(key.encode()).hexdigest()[:16] + ".npz")


def tables_for_task(task: str, vocab, target, *, split: str = "train",
                    max_examples: int | None = 20000, top_k: int = 64,
                    use_cache: bool = True) -> dict[str, np.ndarray]:
  """`tables_for_examples` of a task split (a shipped task or a JSONL path), cached on disk by
  their inputs."""
  fname = _cache_file(local_tasks.resolve(task, split), split, max_examples, top_k, vocab, target)
  if use_cache and os.path.exists(fname):
    with np.load(fname) as f:
      return {name: f[name] for name in f.files}
  tables = tables_for_examples(local_tasks.load_examples(task, split, max_examples), vocab, target,
                               top_k=top_k)
  if use_cache:
    try:
      os.makedirs(os.path.dirname(fname), exist_ok=True)
      tmp = fname + f".{os.getpid()}.tmp.npz"
      np.savez(tmp, **tables)
      os.replace(tmp, fname)
    except OSError:  # a read-only home is not an error; the tables are just rebuilt next time
      pass
  return tables


def tables_for_run(path: str | None, examples_fn: Callable[[], tuple], vocab, target,
                   log: Callable[[str], None] | None = None) -> dict[str, jax.Array]:
  """A run's tables: from a .npz (`save_tables`; `RunConfig.ngram_tables`), else estimated on
  `examples_fn()` -> (examples, description) through `tables_for_examples` (the scripts' path)."""
  if path:
    return load_tables(resolve_path(path))
  examples, source = examples_fn()
  try:
    tables = tables_for_examples(examples, vocab, target)
  except ValueError as e:
    raise ValueError(f"{e} ({source})") from None
  if log is not None:
    log(f"n-gram tables estimated on {len(examples)} examples of {source}")
  return jax.tree.map(jnp.asarray, tables)


def draft_params(target, *, tables: dict | str | None = None, task: str | None = None,
                 vocabulary=None, needs_tables: bool = True, split: str = "train",
                 max_examples: int | None = 20000) -> dict[str, jax.Array]:
  """The params of a model-free draft over `target`'s ids, as the scripts build them.

  From `tables` (a dict, or an .npz written by `save_tables`), else from `task`'s `split`
  tokenized with `vocabulary` (`tables_for_task`, cached on disk) when the draft `needs_tables`
  (all but a prompt-lookup draft with the uniform fallback), else uniform tables.
  """
  if isinstance(tables, (str, os.PathLike)):
    params = load_tables(tables)
  elif tables is not None:
    params = {k: jnp.asarray(v) for k, v in tables.items()}
  elif task is not None and needs_tables:
    params = {k: jnp.asarray(v) for k, v in tables_for_task(
        task, vocabulary, target, split=split, max_examples=max_examples).items()}
  else:
    params = {k: jnp.asarray(v) for k, v in uniform_tables(target.vocab_size).items()}
  if params["log_unigram"].shape[0] != target.vocab_size:
    raise ValueError(f"draft tables have vocabulary {params['log_unigram'].shape[0]}, the target "
                     f"{target.vocab_size}")
  return params
