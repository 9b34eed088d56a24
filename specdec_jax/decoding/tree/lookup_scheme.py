"""The lookup-tree scheme: prompt-lookup branches (K continuations of length L copied from the
history) verified in one target call; one path kept; no draft model.

A `Decoder` with `scheme=LookupTreeScheme(branches=4, length=8)` and a model-free draft
(`model_free.make_draft('prompt_lookup', target)`: only its `HistoryCache` is used) runs
`lookup_tree_iteration`: `propose` (the root written to the history, `lookup.find_branches`),
one target call over `lookup.lookup_tree(K, L)` (`tree.scheme.tree_logits`), a `lookup_verify`
rule (exact for deterministic siblings), `commit.commit_path` on the target, the kept tokens
written into the history, then `commit.commit_tree`. The draft is never "pending": it has no
state but the history, which holds every committed token but the last, as after the chain's
commit. Counters are the tree's (drafted = L per call, one path's offer; beta at a node = p's
mass on the offered tokens, its acceptance probability); stats are `commit.TreeStats`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from specdec_jax import seam
from specdec_jax.decoding import state as st
from specdec_jax.decoding.sampling import SamplingConfig, process_logits
from specdec_jax.decoding.tree import lookup, lookup_verify
from specdec_jax.decoding.tree.commit import commit_path
from specdec_jax.decoding.tree.commit import TreeStats, commit_tree, tree_stats
from specdec_jax.decoding.tree.scheme import tree_logits
from specdec_jax.decoding.tree.shape import Tree
from specdec_jax.models import model_free

LOOKUP_VERIFIERS = ("auto",) + tuple(lookup_verify.LOOKUP_VERIFIERS)


def _positive_int(name: str, value) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f"LookupTreeScheme.{name} must be an integer >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class LookupTreeScheme:
  """K prompt-lookup branches of L tokens per iteration, verified in one target call.

  A hashable decoding scheme, duck-typed like `TreeScheme` (`tree`, `verifier`, `gamma`,
  `TreeStats`) so the runner's GAMMA='tree' path runs it (`gin/decoding/lookup_tree.gin`).
  branches: K, continuations per iteration (distinct first tokens). length: L, tokens each.
  max_ngram / min_ngram: the n-gram lengths matched, longest first (`PromptLookupDraft`'s).
  verifier: 'auto' (greedy at T = 0, point_mass above), 'greedy', 'point_mass', or a function
  with the tree verifiers' contract.
  """

  branches: int = 4
  length: int = 8
  max_ngram: int = 3
  min_ngram: int = 1
  verifier: Any = "auto"

  def __post_init__(self):
    for name in ("branches", "length", "max_ngram", "min_ngram"):
      _positive_int(name, getattr(self, name))
    if self.min_ngram > self.max_ngram:
      raise ValueError(f"need min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
    if not callable(self.verifier) and self.verifier not in LOOKUP_VERIFIERS:
      raise ValueError(f"unknown lookup-tree verifier {self.verifier!r}; known: "
                       f"{LOOKUP_VERIFIERS}")

  needs_draft = True

  @property
  def tree(self) -> Tree:
    return lookup.lookup_tree(self.branches, self.length)

  @property
  def gamma(self) -> int:
    """Every node but the root: the verify call writes N slots (as `TreeScheme.gamma`)."""
    return self.branches * self.length

  def init_stats(self, batch: int) -> TreeStats:
    del batch
    return TreeStats.zeros(self.tree)

  def check(self, decoder) -> None:
    """The target must score a masked block; the draft must keep a `HistoryCache`."""
    seam.check_masked(decoder.target, "target")
    if not isinstance(decoder.draft, tuple(model_free.DRAFT_KINDS.values())):
      raise TypeError(f"LookupTreeScheme reads a model-free draft's history; got a "
                      f"{type(decoder.draft).__name__} draft (use model_free.make_draft("
                      f"'prompt_lookup', target), DRAFT='prompt_lookup')")
    if isinstance(decoder.draft, model_free.CorpusLookupDraft):
      raise TypeError("LookupTreeScheme branches over the request's own history only; a "
                      "corpus-lookup draft's corpus would be ignored (its chain: an int gamma)")

  def verify_fn(self, sampling: SamplingConfig) -> Callable:
    if callable(self.verifier):
      return self.verifier
    if self.verifier == "auto":
      return lookup_verify.greedy if sampling.greedy else lookup_verify.point_mass
    if self.verifier == "greedy" and not sampling.greedy:
      raise ValueError("the greedy lookup-tree verifier is exact at temperature 0 only; use "
                       "'point_mass' (or 'auto') when sampling")
    return lookup_verify.LOOKUP_VERIFIERS[self.verifier]

  def iteration(self, decoder, params, state: st.DecodeState) -> st.DecodeState:
    return lookup_tree_iteration(decoder, params, state, self)


def propose(scheme: LookupTreeScheme, cache: model_free.HistoryCache, last_B: jax.Array,
            vocab: int) -> tuple[jax.Array, jax.Array, model_free.HistoryCache]:
  """(tokens_BxN, offered_BxNxV, the history with the root written at its slot): the branches of
  this iteration as the lookup tree's nodes (`lookup.node_arrays`)."""
  cache = lookup.write_history(cache, cache.index_B, last_B[:, None])
  tokens_BxKxL, valid_BxKxL = lookup.find_branches(cache, cache.index_B, scheme.branches,
                                                   scheme.length, scheme.max_ngram,
                                                   scheme.min_ngram)
  tokens_BxN, offered_BxNxV = lookup.node_arrays(last_B, tokens_BxKxL, valid_BxKxL, vocab)
  return tokens_BxN, offered_BxNxV, cache


def lookup_tree_iteration(decoder, params, state: st.DecodeState, scheme: LookupTreeScheme
                          ) -> st.DecodeState:
  """One propose -> verify -> keep a path -> commit iteration (one target call)."""
  tree, sampling, target = scheme.tree, decoder.sampling, decoder.target
  rng, k_verify = jax.random.split(state.rng)
  root_B = state.target_cache.index_B
  tokens_BxN, offered_BxNxV, history = propose(scheme, state.draft_cache, st.last_tokens(state),
                                               target.vocab_size)
  logits_BxNxV, _, target_cache = tree_logits(decoder, params.target, state.target_cache,
                                              tokens_BxN, tree)
  p_BxNxV = process_logits(logits_BxNxV, sampling)
  verdict = scheme.verify_fn(sampling)(k_verify, tree, tokens_BxN, offered_BxNxV, p_BxNxV)
  target_cache = commit_path(target_cache, root_B, verdict.path_BxD, verdict.num_accepted_B)
  history = lookup.write_history(history, history.index_B + 1, verdict.tokens_BxD)
  not_pending_B = jnp.zeros_like(state.done_B)
  state = state.replace(rng=rng, target_cache=target_cache, draft_cache=history,
                        draft_pending_B=not_pending_B)
  new = commit_tree(state, verdict, p_BxNxV, offered_BxNxV, jnp.zeros_like(state.bonus_p_BxV),
                    target.eos_id, decoder.max_decode_len)
  # The history needs no catch-up: it ends where the target's cache does (slot of the last token).
  new = new.replace(draft_pending_B=not_pending_B, bonus_p_BxV=jnp.zeros_like(new.bonus_p_BxV),
                    draft_cache=history.rollback(new.target_cache.index_B))
  kept_B = new.counters.accepted_B - state.counters.accepted_B
  return new.replace(stats=tree_stats(state.stats, verdict, ~state.done_B, kept_B))
