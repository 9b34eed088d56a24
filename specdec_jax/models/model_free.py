"""Model-free drafts behind the decoding seam: unigram, bigram, prompt lookup and corpus lookup.

Why: Leviathan et al. (Table 3) report alpha for unigram and bigram drafts, and prompt lookup (copy
the continuation of an earlier occurrence of the last few tokens) costs almost nothing and is
strong when the output repeats the input (summaries, code, names and numbers). They implement the
model seam (`prefill` / `extend` / `start_tokens`), so the unchanged loop drives them. Their
"cache" is the token history in the target's cache coordinates (after `prefill`, `index_B` is the
start token's slot; rolling back sets it), and their tables are "params", so one compiled loop
serves any table of the same shape.

Deterministic proposals are logits 0 at the proposed token and NEG elsewhere: after any
temperature, top-k or top-p the others get probability exactly 0 in float32 and greedy picks the
proposed token. Exactness never depends on that: the loop samples x ~ q from the same processed q
it hands to the acceptance rule, whatever q is.

`make_draft(name, target)` builds one; its params are n-gram tables (data work done before
decoding: `specdec_jax.data.ngram_tables`), `{}` for prompt lookup, or a corpus index for corpus
lookup (`specdec_jax.data.corpus_index`); nothing here reads a file.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.reductions import argmax

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

  def rollback(self, index_B: jax.Array) -> "HistoryCache":
    """Stale slots are overwritten by the next `extend`: an index move, as for a model cache."""
    return self.replace(index_B=index_B.astype(jnp.int32))


# ---- the shared seam ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _HistoryDraft:
  """Prefill / extend bookkeeping shared by all model-free drafts; subclasses define `_logits`.
  The fields are the target's kind and ids (`seam.Decodable`'s; `make_draft` copies them)."""

  kind: Literal["t5", "decoder"] = "decoder"
  vocab_size: int = 32128
  pad_id: int = 0
  eos_id: int = 1

  def start_tokens(self, inputs_BxP: jax.Array) -> jax.Array:
    if self.kind == "t5":
      return jnp.full(inputs_BxP.shape[:1], self.pad_id, jnp.int32)
    lengths_B = _lengths(inputs_BxP, self.pad_id)
    return jnp.take_along_axis(inputs_BxP, jnp.maximum(lengths_B - 1, 0)[:, None], axis=1)[:, 0]

  def prefill(self, params, inputs_BxP: jax.Array, cache_len: int, *,
              encoded=None) -> HistoryCache:
    del params, encoded  # the tables are looked up in `extend`; no encoder
    inputs_BxP = inputs_BxP.astype(jnp.int32)
    batch, plen = inputs_BxP.shape
    tokens = jnp.zeros((batch, cache_len), jnp.int32)
    if self.kind == "t5":
      context = jnp.where(inputs_BxP != self.pad_id, inputs_BxP, -1)
      return HistoryCache(tokens, jnp.zeros((batch,), jnp.int32), context)
    n = min(plen, cache_len)
    tokens = tokens.at[:, :n].set(inputs_BxP[:, :n])
    return HistoryCache(tokens, jnp.maximum(_lengths(inputs_BxP, self.pad_id) - 1, 0),
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


def _lengths(inputs_BxP: jax.Array, pad_id: int) -> jax.Array:
  return jnp.sum(inputs_BxP != pad_id, axis=1).astype(jnp.int32)


# ---- unigram and bigram tables -----------------------------------------------------------------
def table_logits(params, prev_BxT: jax.Array) -> jax.Array:
  """log q(. | prev) of the bigram table in params -> [B, T, V].

  The bigram row of `prev` is stored sparsely (a dense V x V table is too large at real V):
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
  """Proposes the token after the longest recent match of the last n tokens (n = max..min), over
  the source (encoder-decoder targets) and the prompt and output so far; among the longest matches
  the latest wins (output before source). With no match of length >= min_ngram it falls back to
  `fallback`: 'uniform', or the 'unigram' / 'bigram' table in params.
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
    return self._proposal_logits(params, tokens_BxT, found_BxT, proposal_BxT)

  def _proposal_logits(self, params, tokens_BxT, found_BxT, proposal_BxT):
    """One-hot logits at each found proposal, the fallback's elsewhere."""
    onehot = jnp.where(jax.nn.one_hot(proposal_BxT, self.vocab_size, dtype=bool), 0.0, NEG)
    return jnp.where(found_BxT[..., None], onehot, self._fallback_logits(params, tokens_BxT))

  def _fallback_logits(self, params, tokens_BxT):
    shape = tokens_BxT.shape + (self.vocab_size,)
    if self.fallback == "uniform":
      return jnp.zeros(shape, jnp.float32)
    if self.fallback == "unigram":
      return jnp.broadcast_to(params["log_unigram"], shape)
    return table_logits(params, tokens_BxT)


def match_scores(context_BxC: jax.Array, tokens_BxS: jax.Array, pos_BxT: jax.Array,
                 max_ngram: int, min_ngram: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(score_BxTxL, seq_BxL, seg_L): how well the n-gram ending at history slot pos[b, t] matches
  the one ending at each place j of the search sequence seq = [context | history] (seg_L: 0 for
  context, 1 for history). The chain's `lookup` keeps the best j per query; the lookup tree
  (`tree/lookup.py`) keeps the K best with distinct continuations.

  A window never spans the two segments and history slots after `pos` are invisible. score =
  match length (capped at max_ngram) * L + j (ties to the latest end), -1 where j is no
  candidate: a match shorter than min_ngram, or no visible token after j in j's segment.
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
  same_next_L = (j_L + 1 < length) & (seg_L[nxt_L] == seg_L)
  visible_BxTxL = (seg_L[None, None, :] == 0) | (j_L[None, None, :] - c < pos_BxT[..., None])
  ok = (same_next_L[None, None, :] & (seq_BxL[:, nxt_L][:, None, :] >= 0) & visible_BxTxL
        & (match_BxTxL >= min_ngram))
  return jnp.where(ok, match_BxTxL * length + j_L[None, None, :], -1), seq_BxL, seg_L


def lookup(context_BxC: jax.Array, tokens_BxS: jax.Array, pos_BxT: jax.Array, max_ngram: int,
           min_ngram: int) -> tuple[jax.Array, jax.Array]:
  """(found_BxT, proposal_BxT): the continuation of the best match of the n-gram ending at pos
  (`match_scores`)."""
  ngram_BxT, proposal_BxT = best_match(context_BxC, tokens_BxS, pos_BxT, max_ngram, min_ngram)
  return ngram_BxT > 0, proposal_BxT


def best_match(context_BxC: jax.Array, tokens_BxS: jax.Array, pos_BxT: jax.Array,
               max_ngram: int, min_ngram: int) -> tuple[jax.Array, jax.Array]:
  """(ngram_BxT, proposal_BxT): the length of the best match of the n-gram ending at pos (0:
  none of at least min_ngram tokens) and its continuation (0 where none). The length is how
  sure the lookup is: the lookup-or-feature scheme (`lookup_feature.py`) drafts with the lookup
  only where it is long enough."""
  score, seq_BxL, _ = match_scores(context_BxC, tokens_BxS, pos_BxT, max_ngram, min_ngram)
  length = seq_BxL.shape[1]
  nxt_tok_BxL = seq_BxL[:, jnp.minimum(jnp.arange(length) + 1, length - 1)]
  best_BxT = argmax(score)
  top_BxT = jnp.max(score, axis=-1)
  found_BxT = top_BxT >= 0
  proposal_BxT = jnp.take_along_axis(nxt_tok_BxL, best_BxT, axis=1)
  return (jnp.where(found_BxT, top_BxT // length, 0).astype(jnp.int32),
          jnp.where(found_BxT, proposal_BxT, 0))


# ---- corpus lookup (REST-style retrieval over a fixed token corpus) -----------------------------
CORPUS_KEYS = ("corpus_keys", "corpus_grams", "corpus_next", "corpus_count")
_HASH_MUL = 0x9E3779B1  # Knuth's multiplicative constant; uint32 arithmetic wraps


def suffix_hashes(suffix_XxN: jax.Array) -> jax.Array:
  """hash_XxN[..., n-1]: a uint32 hash of the n-gram suffix[..., :n] (token 0 the latest, 1 the
  one before, ...), for every n at once. `data.corpus_index` hashes the corpus with this very
  function, so a query and the index agree bit for bit; a collision only costs a miss."""
  def mix(h, tok):
    h = (h ^ (tok.astype(jnp.uint32) + jnp.uint32(1))) * jnp.uint32(_HASH_MUL)
    h = h ^ (h >> jnp.uint32(15))
    return h, h
  h0 = jnp.full(suffix_XxN.shape[:-1], 0x2545F491, jnp.uint32)
  _, hs = jax.lax.scan(mix, h0, jnp.moveaxis(suffix_XxN, -1, 0))
  return jnp.moveaxis(hs, 0, -1)


def corpus_match(index: dict, tokens_BxS: jax.Array, pos_BxT: jax.Array, max_ngram: int
                 ) -> tuple[jax.Array, jax.Array]:
  """(ngram_BxT, proposal_BxT): the longest n <= max_ngram for which the n tokens ending at
  history slot pos[b, t] occur in the corpus, and the continuation most often seen after them
  there (0, 0 where none).

  The index (`data.corpus_index.build_corpus_index`) holds every distinct n-gram of the corpus
  once, sorted by `suffix_hashes`: a query is N binary searches and one gather, O(N log U),
  whatever the corpus's size, where `match_scores` compares against every history slot.
  """
  keys_U, grams_UxM = index["corpus_keys"], index["corpus_grams"]
  n = min(max_ngram, grams_UxM.shape[1])
  s = tokens_BxS.shape[1]
  k_N = jnp.arange(n, dtype=jnp.int32)
  qpos_BxTxN = pos_BxT[..., None] - k_N[None, None, :]
  b_Bx1x1 = jnp.arange(tokens_BxS.shape[0])[:, None, None]
  suffix_BxTxN = jnp.where(qpos_BxTxN >= 0,
                           tokens_BxS[b_Bx1x1, jnp.clip(qpos_BxTxN, 0, s - 1)], -2)
  hash_BxTxN = suffix_hashes(suffix_BxTxN)
  idx_BxTxN = jnp.clip(jnp.searchsorted(keys_U, hash_BxTxN), 0, keys_U.shape[0] - 1)
  # The entry must be this very n-gram (hashes collide): its tokens, then -1 past its length.
  m = grams_UxM.shape[1]
  in_gram_NxM = jnp.arange(m)[None, :] <= k_N[:, None]
  want_BxTxNxM = jnp.where(in_gram_NxM[None, None],
                           jnp.pad(suffix_BxTxN, [(0, 0), (0, 0), (0, m - n)])[:, :, None, :], -1)
  hit_BxTxN = ((keys_U[idx_BxTxN] == hash_BxTxN)
               & jnp.all(grams_UxM[idx_BxTxN] == want_BxTxNxM, axis=-1)
               & jnp.cumprod(suffix_BxTxN >= 0, axis=-1).astype(bool))
  ngram_BxT = jnp.max(jnp.where(hit_BxTxN, k_N[None, None, :] + 1, 0), axis=-1)
  best_BxT = jnp.take_along_axis(idx_BxTxN, jnp.maximum(ngram_BxT - 1, 0)[..., None], axis=-1)
  proposal_BxT = jnp.where(ngram_BxT > 0, index["corpus_next"][best_BxT[..., 0]], 0)
  return ngram_BxT.astype(jnp.int32), proposal_BxT.astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class CorpusLookupDraft(PromptLookupDraft):
  """Prompt lookup that also retrieves from a fixed corpus (REST, He et al. 2024): where the
  last n tokens occur in the corpus, the continuation most often seen after them there. The
  longer match of the two wins, the prompt-and-output one at equal length (it copies this very
  request); with neither, `fallback`. The corpus index is the params (`CORPUS_KEYS`, built by
  `data.corpus_index`, e.g. over the target's own replies to training prompts), so one compiled
  loop serves any corpus of the same size.

  Why: prompt lookup drafts only what the request repeats; the rest of a reply (a function's
  body, a summary's connective phrases) is often common text the target writes again and again.
  A draft model learns it; a corpus of the target's own outputs stores it, at no training cost
  and a few binary searches a token.
  """

  def _logits(self, params, cache, tokens_BxT, pos_BxT):
    hist_n, hist_tok = best_match(cache.context_BxC, cache.tokens_BxS, pos_BxT,
                                  self.max_ngram, self.min_ngram)
    corp_n, corp_tok = corpus_match(params, cache.tokens_BxS, pos_BxT, self.max_ngram)
    corp_n = jnp.where(corp_n >= self.min_ngram, corp_n, 0)
    use_hist = hist_n >= corp_n
    found_BxT = (hist_n > 0) | (corp_n > 0)
    proposal_BxT = jnp.where(use_hist, hist_tok, corp_tok)
    return self._proposal_logits(params, tokens_BxT, found_BxT, proposal_BxT)


DRAFT_KINDS = {"unigram": UnigramDraft, "bigram": BigramDraft, "prompt_lookup": PromptLookupDraft,
               "corpus_lookup": CorpusLookupDraft}


def make_draft(name: str, target, **kwargs):
  """A model-free draft (unigram, bigram, prompt_lookup) in the coordinates and ids of `target`
  (a model behind the seam, or a `ModelConfig`: both carry kind, vocab_size, pad_id, eos_id)."""
  if name not in DRAFT_KINDS:
    raise ValueError(f"unknown model-free draft {name!r}; known: {sorted(DRAFT_KINDS)}")
  return DRAFT_KINDS[name](kind=target.kind, vocab_size=target.vocab_size,
                           pad_id=target.pad_id, eos_id=target.eos_id, **kwargs)


def needs_tables(draft) -> bool:
  """Whether a model-free draft reads n-gram tables: all but a prompt lookup whose fallback is
  uniform (its params may then be `{}` or any tables; a corpus lookup's are its index)."""
  return not (isinstance(draft, PromptLookupDraft) and draft.fallback == "uniform")
