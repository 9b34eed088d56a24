"""Prompt-lookup branches: several continuations of the decoded stream, copied from its history,
laid out as a static tree of K chains of length L for one target call.

Why: prompt lookup (`model_free.PromptLookupDraft`) costs nothing but bets on ONE earlier occurrence
of the last n tokens; in code and summaries the same n-gram often recurs with different
continuations (`self.` -> `x`, `y`, `name`). Offering the K best occurrences whose continuations
start differently, verified in one target call, keeps the chain's cost (no draft model, one
call) and raises the tokens per call where the target's next token is among them.

Static shapes: the tree is always `lookup_tree(K, L)`. A row with fewer matches, or a
continuation that runs into the end of a source, marks the missing nodes invalid: fed to the
target (static width), never offered to the verifier. Branches are distinct at depth 1; branches
sharing a first token are not merged into a trie (per-row parents would need a walk over per-row
children): only the best is kept.

The history is the model-free draft's `model_free.HistoryCache` (the decoded stream, and a T5
target's source), so any draft of `model_free.DRAFT_KINDS` supplies it; only its prefill is used.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specdec_jax.decoding.sampling import argmax
from specdec_jax.decoding.tree.shape import Tree
from specdec_jax.models.model_free import HistoryCache, lookup, match_scores


@functools.lru_cache(maxsize=None)
def lookup_tree(branches: int, length: int) -> Tree:
  """K chains of L drafted tokens under one root, chain by chain (node 1 + k * L + d is branch
  k's depth-(d + 1) token), so every path's indices increase as `commit.commit_path` needs."""
  if branches < 1 or length < 1:
    raise ValueError(f"a lookup tree needs branches >= 1 and length >= 1, got {branches}, "
                     f"{length}")
  parents = [-1]
  for k in range(branches):
    parents += [0] + [1 + k * length + d for d in range(length - 1)]
  return Tree(tuple(parents))


def write_history(cache: HistoryCache, start_B: jax.Array, tokens_BxT: jax.Array
                  ) -> HistoryCache:
  """Tokens written at slots start_B ... (past the cache: dropped); the index is left alone: a
  HistoryCache has no K/V to gather, so committing a kept path is writing its tokens."""
  t = tokens_BxT.shape[1]
  pos_BxT = start_B[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
  b_Bx1 = jnp.arange(tokens_BxT.shape[0])[:, None]
  hist = cache.tokens_BxS.at[b_Bx1, pos_BxT].set(tokens_BxT.astype(jnp.int32), mode="drop")
  return cache.replace(tokens_BxS=hist)


def find_branches(cache: HistoryCache, pos_B: jax.Array, branches: int, length: int,
                  max_ngram: int = 3, min_ngram: int = 1) -> tuple[jax.Array, jax.Array]:
  """(tokens_BxKxL, valid_BxKxL): up to K continuations of the stream ending at slot pos_B.

  Branch k follows the k-th best match (longest n-gram, then latest) among those whose next token
  differs from every better branch's first token; its tokens are the L that followed the match
  (`_continuation`: in the history, periodic past the query), valid while they stay in the
  match's segment (a source's end, its pads). Invalid entries are 0.
  """
  score_Bx1xL, seq_BxL, seg_L = match_scores(cache.context_BxC, cache.tokens_BxS, pos_B[:, None],
                                             max_ngram, min_ngram)
  score_BxL = score_Bx1xL[:, 0]
  total, c = seq_BxL.shape[1], cache.context_BxC.shape[1]
  first_BxL = seq_BxL[:, jnp.minimum(jnp.arange(total) + 1, total - 1)]
  ends, found = [], []
  for _ in range(branches):  # K is small and static
    best_B = argmax(score_BxL)
    found.append(jnp.max(score_BxL, axis=1) >= 0)
    ends.append(best_B)
    first_B = jnp.take_along_axis(first_BxL, best_B[:, None], axis=1)
    score_BxL = jnp.where(first_BxL == first_B, -1, score_BxL)
  end_BxK, found_BxK = jnp.stack(ends, axis=1), jnp.stack(found, axis=1)
  src_BxKxL = _continuation(end_BxK, seg_L[end_BxK] == 1, pos_B[:, None] - (end_BxK - c),
                            length)
  safe_BxKxL = jnp.minimum(src_BxKxL, total - 1)
  tok_BxKxL = jnp.take_along_axis(seq_BxL, safe_BxKxL.reshape(seq_BxL.shape[0], -1),
                                  axis=1).reshape(safe_BxKxL.shape)
  ok_BxKxL = ((src_BxKxL < total) & (seg_L[safe_BxKxL] == seg_L[end_BxK][:, :, None])
              & (tok_BxKxL >= 0) & found_BxK[:, :, None]
              & ((seg_L[safe_BxKxL] == 0) | (src_BxKxL - c <= pos_B[:, None, None])))
  valid_BxKxL = jnp.cumprod(ok_BxKxL.astype(jnp.int32), axis=-1).astype(bool)
  chain_BxL, chain_ok_BxL = chain_proposal(cache, pos_B, length, max_ngram, min_ngram)
  tok_BxKxL = tok_BxKxL.at[:, 0].set(chain_BxL)
  valid_BxKxL = valid_BxKxL.at[:, 0].set(chain_ok_BxL)
  return jnp.where(valid_BxKxL, tok_BxKxL, 0), valid_BxKxL


def chain_proposal(cache: HistoryCache, pos_B: jax.Array, length: int, max_ngram: int,
                   min_ngram: int) -> tuple[jax.Array, jax.Array]:
  """(tokens_BxL, valid_BxL): what the prompt-lookup chain proposes at slot pos (L lookups, each
  on the history extended by the proposals before it: `model_free.lookup`), valid up to the first
  position with no match. Branch 0: its first token is the best match's, as `find_branches`
  ranks them, and later tokens may switch to a longer match, which a fixed copy cannot; so the
  tree offers a superset of the chain's proposal (greedy: never fewer tokens kept per call)."""
  hist_BxS = cache.tokens_BxS
  b_B = jnp.arange(hist_BxS.shape[0])
  toks, oks = [], []
  for i in range(length):  # L is small and static
    found_Bx1, tok_Bx1 = lookup(cache.context_BxC, hist_BxS, (pos_B + i)[:, None], max_ngram,
                                min_ngram)
    hist_BxS = hist_BxS.at[b_B, pos_B + i + 1].set(tok_Bx1[:, 0], mode="drop")
    toks.append(tok_Bx1[:, 0])
    oks.append(found_Bx1[:, 0])
  ok_BxL = jnp.cumprod(jnp.stack(oks, axis=1).astype(jnp.int32), axis=1).astype(bool)
  return jnp.stack(toks, axis=1), ok_BxL


def _continuation(end_BxK: jax.Array, in_history_BxK: jax.Array, period_BxK: jax.Array,
                  length: int) -> jax.Array:
  """Indices into [context | history] of the L tokens copied after each match end.

  A history match ending `period` slots before the query reaches the query's own slot (the last
  committed token) after `period` tokens; the slots after it are stale. Past it the copy repeats
  its last `period` tokens: in a loop of that period this is what the chain's prompt lookup
  proposes, re-run on its own proposals (without it a loop shorter than L caps every branch at
  the period, far below what the chain proposes)."""
  i_L = jnp.arange(length, dtype=jnp.int32)
  wrapped_BxKxL = i_L[None, None, :] % jnp.maximum(period_BxK, 1)[:, :, None]
  offset_BxKxL = jnp.where(in_history_BxK[:, :, None], wrapped_BxKxL, i_L[None, None, :])
  return end_BxK[:, :, None] + 1 + offset_BxKxL


def node_arrays(root_B: jax.Array, tokens_BxKxL: jax.Array, valid_BxKxL: jax.Array, vocab: int
                ) -> tuple[jax.Array, jax.Array]:
  """(tokens_BxN, offered_BxNxV) of `lookup_tree(K, L)`: each node's token (root first) and, per
  node, the indicator of its valid children's tokens: what the verifier may keep there (the
  point-mass rules' `q` row, `lookup_verify`)."""
  batch, k, l = tokens_BxKxL.shape
  tokens_BxN = jnp.concatenate([root_B[:, None].astype(jnp.int32),
                                tokens_BxKxL.reshape(batch, k * l)], axis=1)
  parents_M = jnp.asarray(lookup_tree(k, l).parents_N[1:])
  b_Bx1 = jnp.arange(batch)[:, None]
  offered_BxNxV = jnp.zeros((batch, 1 + k * l, vocab), jnp.float32).at[
      b_Bx1, parents_M[None, :], tokens_BxN[:, 1:]].max(
          valid_BxKxL.reshape(batch, k * l).astype(jnp.float32))
  return tokens_BxN, offered_BxNxV
