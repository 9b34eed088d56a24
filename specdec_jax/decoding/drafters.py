"""Model-free drafts behind the decoding seam: unigram, bigram and prompt lookup.

Why: Leviathan et al. (Table 3) report alpha for unigram and bigram drafts, and prompt lookup (copy
the continuation of an earlier occurrence of the last few tokens) costs almost nothing (c ~ 0) and
is strong when the output repeats the input (summaries, code, translation of names and numbers).
They implement the same `prefill` / `extend` / `start_tokens` seam as `models.model.Model`, so the
unchanged on-device speculative loop drives them; their "cache" is the token history.

Coordinates match the target's cache: after `prefill`, `index_B` is the slot of the start token
(0 for an encoder-decoder target, prompt length - 1 for a decoder-only one), and rolling back is
setting `index_B` (slots at or past it are stale and get overwritten). The tables are the draft's
"params" (arrays), so one compiled loop serves any table of the same shape.

Deterministic proposals are logits 0 at the proposed token and -1e9 elsewhere: after any
temperature > 0, top-k or top-p in `process_logits` the others get probability exactly 0 in float32
(exp(-1e9 / T) underflows), and greedy picks the proposed token, so q is the one-hot the loop
samples from. Exactness never depends on that: the loop samples x ~ q from the same processed q it
hands to the acceptance rule, whatever q is.

Building one: `make_draft(name, target_config)` gives the draft; its params are the tables of
`build_ngram_tables` (the runner estimates them on TASK's train split), `tables_for_task` (the
same, tokenized here and cached under $SPECDEC_CACHE_DIR), or `{}` for prompt lookup.
`build_draft(name, target=..., task=..., vocabulary=...)` does both (scripts, check tools).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from typing import Literal

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

NEG = -1e9  # "impossible" logit; finite so that an all-impossible row cannot produce NaN


@flax.struct.dataclass
class HistoryCache:
  """The "cache" of a model-free draft.

  tokens_BxS: the decoder stream in the target's cache coordinates (decoder-only: the prompt, then
    the output); slots >= index_B are stale.
  index_B: the slot the next fed token is written to.
  context_BxC: encoder-decoder targets: the encoder input (the source), pads replaced by -1, so the
    prompt lookup can copy from it; decoder-only targets: shape [B, 0] (the prompt is in tokens).
  """

  tokens_BxS: jax.Array
  index_B: jax.Array
  context_BxC: jax.Array


@dataclasses.dataclass(frozen=True)
class NgramConfig:
  """The config-like attributes the loops read. `kind` must be the target's kind."""

  kind: Literal["t5", "decoder"] = "decoder"
  vocab_size: int = 32128
  pad_id: int = 0
  eos_id: int = 1

  @property
  def is_encoder_decoder(self) -> bool:
    return self.kind == "t5"

  @classmethod
  def for_target(cls, target_config) -> "NgramConfig":
    return cls(kind=target_config.kind, vocab_size=target_config.vocab_size,
               pad_id=target_config.pad_id, eos_id=target_config.eos_id)


# ---- the shared seam ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _HistoryDraft:
  """Prefill / extend bookkeeping shared by all model-free drafts; subclasses define `_logits`."""

  config: NgramConfig

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def start_tokens(self, inputs_BxP: jax.Array) -> jax.Array:
    if self.config.is_encoder_decoder:
      return jnp.full(inputs_BxP.shape[:1], self.config.pad_id, jnp.int32)
    lengths_B = _lengths(inputs_BxP)
    return jnp.take_along_axis(inputs_BxP, jnp.maximum(lengths_B - 1, 0)[:, None], axis=1)[:, 0]

  def prefill(self, params, inputs_BxP: jax.Array, cache_len: int) -> HistoryCache:
    inputs_BxP = inputs_BxP.astype(jnp.int32)
    batch, plen = inputs_BxP.shape
    tokens = jnp.zeros((batch, cache_len), jnp.int32)
    if self.config.is_encoder_decoder:
      context = jnp.where(inputs_BxP > 0, inputs_BxP, -1)
      return HistoryCache(tokens, jnp.zeros((batch,), jnp.int32), context)
    n = min(plen, cache_len)
    tokens = tokens.at[:, :n].set(inputs_BxP[:, :n])
    return HistoryCache(tokens, jnp.maximum(_lengths(inputs_BxP) - 1, 0),
                        jnp.zeros((batch, 0), jnp.int32))

  def extend(self, params, cache: HistoryCache, tokens_BxT: jax.Array
             ) -> tuple[jax.Array, HistoryCache]:
    """Writes T tokens at index_B...; logits [B, T, V] of the token after each of them."""
    t = tokens_BxT.shape[1]
    pos_BxT = cache.index_B[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    b_Bx1 = jnp.arange(tokens_BxT.shape[0])[:, None]
    hist = cache.tokens_BxS.at[b_Bx1, pos_BxT].set(tokens_BxT.astype(jnp.int32), mode="drop")
    cache = cache.replace(tokens_BxS=hist, index_B=cache.index_B + t)
    return self._logits(params, cache, tokens_BxT.astype(jnp.int32), pos_BxT), cache

  def _logits(self, params, cache: HistoryCache, tokens_BxT, pos_BxT) -> jax.Array:
    raise NotImplementedError


def _lengths(inputs_BxP: jax.Array) -> jax.Array:
  return jnp.sum(inputs_BxP != 0, axis=1).astype(jnp.int32)


# ---- unigram and bigram tables -----------------------------------------------------------------
def table_logits(params, prev_BxT: jax.Array) -> jax.Array:
  """log q(. | prev) of the bigram table in params -> [B, T, V].

  The bigram row of `prev` is stored sparsely (a full V x V table is 268 MB at V = 8192):
  q(x | prev) = (count_K(prev, x) + backoff(prev) * u(x)) / total(prev), where count_K keeps the
  K most frequent continuations and backoff = prior + the dropped counts, so each row sums to 1.
  """
  u_V = jnp.exp(params["log_unigram"])
  b, t = prev_BxT.shape
  row = params["backoff"][prev_BxT][..., None] * u_V[None, None, :]
  bi = jnp.arange(b)[:, None, None]
  ti = jnp.arange(t)[None, :, None]
  row = row.at[bi, ti, params["next_ids"][prev_BxT]].add(params["next_counts"][prev_BxT])
  probs = row / params["total"][prev_BxT][..., None]
  return jnp.where(probs > 0.0, jnp.log(jnp.maximum(probs, 1e-38)), NEG)


@dataclasses.dataclass(frozen=True)
class UnigramDraft(_HistoryDraft):
  """q(x) = the training data's token frequencies, whatever the context."""

  def _logits(self, params, cache, tokens_BxT, pos_BxT):
    log_u = params["log_unigram"]
    return jnp.broadcast_to(log_u, tokens_BxT.shape + log_u.shape)


@dataclasses.dataclass(frozen=True)
class BigramDraft(_HistoryDraft):
  """q(x | previous token), from the training data's bigram counts."""

  def _logits(self, params, cache, tokens_BxT, pos_BxT):
    return table_logits(params, tokens_BxT)


# ---- prompt lookup -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PromptLookupDraft(_HistoryDraft):
  """Proposes the token after the longest recent match of the last n tokens (n = max..min).

  The search runs over the source (encoder-decoder targets) and over the prompt and output so
  far; among matches of the longest length the latest wins (output before source). With no match
  of length >= min_ngram it falls back to `fallback`: 'uniform', or the 'unigram' / 'bigram'
  table in params (one-hot proposals otherwise).
  """

  max_ngram: int = 3
  min_ngram: int = 1
  fallback: Literal["uniform", "unigram", "bigram"] = "uniform"

  def __post_init__(self):
    if not 1 <= self.min_ngram <= self.max_ngram:
      raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
    if self.fallback not in ("uniform", "unigram", "bigram"):
      raise ValueError(f"fallback must be uniform, unigram or bigram, got {self.fallback!r}")

  def _logits(self, params, cache, tokens_BxT, pos_BxT):
    found_BxT, proposal_BxT = lookup(cache.context_BxC, cache.tokens_BxS, pos_BxT,
                                     self.max_ngram, self.min_ngram)
    v = self.vocab_size
    onehot = jnp.where(jax.nn.one_hot(proposal_BxT, v, dtype=bool), 0.0, NEG)
    if self.fallback == "uniform":
      fb = jnp.zeros(tokens_BxT.shape + (v,), jnp.float32)
    elif self.fallback == "unigram":
      fb = jnp.broadcast_to(params["log_unigram"], tokens_BxT.shape + (v,))
    else:
      fb = table_logits(params, tokens_BxT)
    return jnp.where(found_BxT[..., None], onehot, fb)


def lookup(context_BxC: jax.Array, tokens_BxS: jax.Array, pos_BxT: jax.Array, max_ngram: int,
           min_ngram: int) -> tuple[jax.Array, jax.Array]:
  """(found_BxT, proposal_BxT): the continuation of the best match of the n-gram ending at pos.

  Search sequence: [context | history]; a window never spans the two segments and history slots
  after `pos` are invisible. Score = match length (capped at max_ngram), ties to the latest end.
  """
  c, s = context_BxC.shape[1], tokens_BxS.shape[1]
  seq_BxL = jnp.concatenate([context_BxC, tokens_BxS], axis=1)
  seg_L = jnp.concatenate([jnp.zeros((c,), jnp.int32), jnp.ones((s,), jnp.int32)])
  length = c + s
  j_L = jnp.arange(length, dtype=jnp.int32)
  k_N = jnp.arange(max_ngram, dtype=jnp.int32)
  # window[b, j, k] = seq[j - k] if j - k lies in j's segment, else a sentinel (-3).
  src_LxN = j_L[:, None] - k_N[None, :]
  same_LxN = (src_LxN >= 0) & (seg_L[jnp.maximum(src_LxN, 0)] == seg_L[:, None])
  window_BxLxN = jnp.where(same_LxN[None], seq_BxL[:, jnp.maximum(src_LxN, 0)], -3)
  # suffix[b, t, k] = history[pos - k] (the query), or -2 before the stream's start.
  qpos_BxTxN = pos_BxT[..., None] - k_N[None, None, :]
  b_Bx1x1 = jnp.arange(tokens_BxS.shape[0])[:, None, None]
  suffix = jnp.where(qpos_BxTxN >= 0, tokens_BxS[b_Bx1x1, jnp.clip(qpos_BxTxN, 0, s - 1)], -2)
  eq = window_BxLxN[:, None, :, :] == suffix[:, :, None, :]  # [B, T, L, N]
  match_BxTxL = jnp.sum(jnp.cumprod(eq.astype(jnp.int32), axis=-1), axis=-1)
  # Valid ends j: the continuation j + 1 is a real token of j's segment, visible at pos.
  nxt_L = jnp.minimum(j_L + 1, length - 1)
  nxt_tok_BxL = seq_BxL[:, nxt_L]
  same_next_L = (j_L + 1 < length) & (seg_L[nxt_L] == seg_L)
  visible_BxTxL = (seg_L[None, None, :] == 0) | (j_L[None, None, :] - c < pos_BxT[..., None])
  ok = (same_next_L[None, None, :] & (nxt_tok_BxL[:, None, :] >= 0) & visible_BxTxL
        & (match_BxTxL >= min_ngram))
  score = jnp.where(ok, match_BxTxL * length + j_L[None, None, :], -1)
  best_BxT = jnp.argmax(score, axis=-1)
  found_BxT = jnp.max(score, axis=-1) >= 0
  proposal_BxT = jnp.take_along_axis(nxt_tok_BxL, best_BxT, axis=1)
  return found_BxT, jnp.where(found_BxT, proposal_BxT, 0)


# ---- estimating and storing the tables -------------------------------------------------------------
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


def bigram_matrix(tables: dict[str, np.ndarray]) -> np.ndarray:
  """The dense [V, V] bigram q(x | prev) of `tables` (tests and small vocabularies)."""
  v = tables["log_unigram"].shape[0]
  u = np.exp(tables["log_unigram"].astype(np.float64))
  m = tables["backoff"][:, None].astype(np.float64) * u[None, :]
  np.add.at(m, (np.arange(v)[:, None], tables["next_ids"]), tables["next_counts"])
  return m / tables["total"][:, None]


def dense_bigram_params(matrix_VxV: np.ndarray) -> dict[str, np.ndarray]:
  """Tables whose bigram is exactly the row-stochastic `matrix_VxV` (K = V, no smoothing left).

  For small vocabularies: a `BigramDraft` over these params is a context-dependent model whose
  exact law is known, e.g. a cheap target for distribution tests of the whole loop.
  """
  m = np.asarray(matrix_VxV, np.float64)
  v = m.shape[0]
  if m.shape != (v, v) or np.any(m < 0) or not np.allclose(m.sum(1), 1.0, atol=1e-6):
    raise ValueError("need a row-stochastic [V, V] matrix")
  tiny = 1e-30  # the unigram's weight in each row: numerically nothing
  return {"log_unigram": np.full(v, -np.log(v), np.float32),
          "next_ids": np.tile(np.arange(v, dtype=np.int32), (v, 1)),
          "next_counts": m.astype(np.float32), "backoff": np.full(v, tiny, np.float32),
          "total": np.full(v, 1.0 + tiny, np.float32)}


def save_tables(path, tables: dict[str, np.ndarray]) -> None:
  """Writes the tables as one .npz (what a gin file points `DRAFT_CHECKPOINT` at)."""
  np.savez(path, **tables)


def load_tables(path) -> dict[str, jax.Array]:
  with np.load(path) as f:
    return {name: jnp.asarray(f[name]) for name in f.files}


def training_sequences(task: str, vocab, *, encoder_decoder: bool, split: str = "train",
                       max_examples: int | None = 20000) -> list[list[int]]:
  """The decoder streams a draft table is estimated from, for a local task name or a JSONL path.

  Encoder-decoder targets emit the reference (`de`, `summary`, ...), so the tables count the
  tokenized references; a decoder-only target's stream is the prompt and then the reference.
  Lines without a reference (e.g. `input_ids`-only files) contribute their input ids: that is all
  the text such a file has. A JSONL path is read as is (`split` only applies to shipped tasks).
  """
  from specdec_jax.data import local_tasks  # pylint: disable=import-outside-toplevel
  examples = local_tasks.load_examples(task, split, max_examples)
  out = []
  for ex in examples:
    if ex.reference is not None and vocab is not None:
      ref = vocab.encode(ex.reference)
      if encoder_decoder:
        out.append(ref)
      else:
        prompt = list(ex.input_ids) if ex.input_ids is not None else vocab.encode(ex.inputs)
        out.append(prompt + ref)
    elif ex.input_ids is not None:
      out.append(list(ex.input_ids))
    elif vocab is not None and ex.inputs:
      out.append(vocab.encode(ex.inputs))
  if not out:
    raise ValueError(f"task {task!r} ({split}) has no usable sequences for n-gram tables")
  return out


def cache_dir() -> str:
  return os.environ.get("SPECDEC_CACHE_DIR",
                        os.path.join(os.path.expanduser("~"), ".cache", "specdec_jax"))


def tables_for_task(task: str, vocab, *, vocab_size: int, encoder_decoder: bool,
                    eos_id: int = 1, bos_id: int = 0, split: str = "train",
                    max_examples: int | None = 20000, top_k: int = 64,
                    use_cache: bool = True) -> dict[str, np.ndarray]:
  """Unigram / bigram tables of a task's training split, cached on disk by their inputs."""
  from specdec_jax.data import local_tasks  # pylint: disable=import-outside-toplevel
  path = local_tasks.resolve(task, split)
  st = os.stat(path)
  key = json.dumps([str(path), st.st_size, int(st.st_mtime), split, max_examples, top_k,
                    vocab_size, encoder_decoder, eos_id, bos_id,
                    None if vocab is None else str(getattr(vocab, "model_file", vocab))])
  fname = os.path.join(cache_dir(), "ngram", hashlib.sha1(key.encode()).hexdigest()[:16] + ".npz")
  if use_cache and os.path.exists(fname):
    with np.load(fname) as f:
      return {name: f[name] for name in f.files}
  seqs = training_sequences(task, vocab, encoder_decoder=encoder_decoder, split=split,
                            max_examples=max_examples)
  seqs = [[t for t in s if t < vocab_size] for s in seqs]
  tables = build_ngram_tables(seqs, vocab_size, top_k=top_k,
                              bos_id=bos_id if encoder_decoder else None,
                              eos_id=eos_id if encoder_decoder else None)
  if use_cache:
    try:
      os.makedirs(os.path.dirname(fname), exist_ok=True)
      tmp = fname + f".{os.getpid()}.tmp.npz"
      np.savez(tmp, **tables)
      os.replace(tmp, fname)
    except OSError:  # a read-only home is not an error; the tables are just rebuilt next time
      pass
  return tables


def uniform_tables(vocab_size: int, top_k: int = 1) -> dict[str, np.ndarray]:
  """Tables with no data: a uniform unigram and bigram (used when no task is given)."""
  return build_ngram_tables([], vocab_size, top_k=top_k)


DRAFT_KINDS = {"unigram": UnigramDraft, "bigram": BigramDraft, "prompt_lookup": PromptLookupDraft}


def make_draft(name: str, target_config, **kwargs):
  """A model-free draft for `target_config`'s kind and vocabulary: unigram, bigram, prompt_lookup."""
  if name not in DRAFT_KINDS:
    raise ValueError(f"unknown model-free draft {name!r}; known: {sorted(DRAFT_KINDS)}")
  return DRAFT_KINDS[name](NgramConfig.for_target(target_config), **kwargs)


def build_draft(name: str, *, target, target_params=None, task: str | None = None, vocabulary=None,
          tables: dict | str | None = None, split: str = "train",
          max_examples: int | None = 20000, **kwargs):
  """(draft, params) for a model-free draft over the target's ids, as the runner loads drafts.

  The tables come from `tables` (a dict or an .npz written by `save_tables`), else from `task`'s
  training split tokenized with `vocabulary` (cached on disk), else they are uniform (only a
  prompt-lookup draft is then meaningful; its fallback is uniform anyway). `target_params` is
  unused: a model-free draft shares nothing with the target but its vocabulary.
  """
  del target_params
  cfg = target.config
  draft = make_draft(name, cfg, **kwargs)
  if isinstance(tables, (str, os.PathLike)):
    params = load_tables(tables)
  elif tables is not None:
    params = {k: jnp.asarray(v) for k, v in tables.items()}
  elif task is not None and (name != "prompt_lookup" or draft.fallback != "uniform"):
    params = {k: jnp.asarray(v) for k, v in tables_for_task(
        task, vocabulary, vocab_size=cfg.vocab_size, encoder_decoder=cfg.is_encoder_decoder,
        eos_id=cfg.eos_id, bos_id=cfg.pad_id, split=split, max_examples=max_examples).items()}
  else:
    params = {k: jnp.asarray(v) for k, v in uniform_tables(cfg.vocab_size).items()}
  if params["log_unigram"].shape[0] != cfg.vocab_size:
    raise ValueError(f"draft tables have vocabulary {params['log_unigram'].shape[0]}, the target "
                     f"{cfg.vocab_size}")
  return draft, params
