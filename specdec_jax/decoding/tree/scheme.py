"""The tree scheme: draft a static tree, verify every node in one target call, keep one path.

A `Decoder` with `scheme=TreeScheme((3, 2, 1))` runs `tree_iteration`, as `speculative.Chain`
runs its chain:
1. `draft_tree`: the drafter's first call (the chain's), then one windowed draft call per deeper
   level over that level's nodes alone (node n to slot root + n), which sees its ancestors among
   the levels cached before and not their cousins (`transformer.masked_block`'s window): D draft
   calls, as the chain's gamma. Children: the draft's top-k (`draw_children`), q kept.
2. `tree_logits`: one target call over all N nodes, node n at slot root + n; a tree verifier
   (`tree_verifier`) keeps a path and gives the next token.
3. `commit.commit_path` on both caches (the kept path into consecutive slots, so rollback stays
   an index move), then `commit_tree`: write the path and the next token, count, roll back.
Static shapes throughout; every row keeps its own path (ragged acceptance).

Why `gamma` is N - 1 (every drafted node): the verify call writes N cache slots past the last
kept token and `start.slack(gamma)` sizes cache and buffer from it; the per-position counters get
a column per drafted node, of which the first D (one per depth) are used.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import seam
from specdec_jax.decoding import state as st
from specdec_jax.decoding.sampling import SamplingConfig, process_logits
from specdec_jax.decoding.tree import token_path, verify
from specdec_jax.decoding.tree.commit import (TreeStats, commit_path, commit_tree_with,
                                              never_pending, observe_tree, row_beta)
from specdec_jax.decoding.tree.shape import Tree

VERIFIERS = ("auto",) + tuple(verify.TREE_VERIFIERS)


def level_ranges(tree: Tree) -> tuple[tuple[int, int], ...]:
  """[start, end) node range of each depth 0..D (the tree is level-ordered)."""
  depths = tree.depths_N
  return tuple((int(np.searchsorted(depths, d)), int(np.searchsorted(depths, d, "right")))
               for d in range(tree.max_depth + 1))


def child_plan(tree: Tree, start: int, end: int):
  """For the nodes of one level [start, end): every child's (node id, parent's place in the
  level, rank), as static index arrays."""
  kids = tree.children_NxK[start:end]
  pos_L, rank_L = np.nonzero(kids >= 0)
  return kids[pos_L, rank_L], pos_L, rank_L


def draw_children(key: jax.Array, logits_BxLxV: jax.Array, q_BxLxV: jax.Array, k: int,
                  sampling: SamplingConfig) -> jax.Array:
  """k distinct children per node, in rank order, int32 [B, L, k]. Temperature 0: the draft's
  k highest logits (q is one-hot there, so only the raw logits rank the rest). T > 0: k draws
  without replacement from the processed q (`verify.sample_without_replacement`), which is what
  `recursive_rejection` assumes of the siblings it tries in turn."""
  if sampling.greedy:
    return jax.lax.top_k(logits_BxLxV.astype(jnp.float32), k)[1].astype(jnp.int32)
  b, l, v = q_BxLxV.shape
  return verify.sample_without_replacement(key, q_BxLxV.reshape(b * l, v), k).reshape(b, l, k)


def draft_tree(decoder, draft_params, state: st.DecodeState, key: jax.Array, tree: Tree,
               sampling: SamplingConfig, token_ids: bool = False):
  """Drafts the tree with the decoder's drafter: (node tokens [B, N], q per node [B, N, V] (rows
  of leaves 0), the processed q at the previous iteration's bonus position [B, V] (zeros for a
  drafter that scores none), the draft cache holding the root at its slot and node n (every
  depth < D) at root + n). token_ids (temperature 0, `tree.token_path`): the draft's argmax per
  node [B, N] (-1 at leaves) and at the bonus position [B] (None where none) instead of the
  one-hot rows. A feature-level drafter feeds each node its parent's output feature."""
  drafter = decoder.drafter
  levels, depths = level_ranges(tree), tree.depths_N
  logits_BxV, bonus_logits_BxV, out_Bx1xD, cache = drafter.first_call(decoder, draft_params,
                                                                      state)
  batch, vocab = logits_BxV.shape
  tokens_BxN = jnp.zeros((batch, tree.num_nodes), jnp.int32).at[:, 0].set(st.last_tokens(state))
  rows = (jnp.full((batch, tree.num_nodes), -1, jnp.int32) if token_ids
          else jnp.zeros((batch, tree.num_nodes, vocab), jnp.float32))
  # Every node's output feature (the root's from the first call): a child's input.
  out_BxNxD = None if out_Bx1xD is None else jnp.zeros(
      (batch, tree.num_nodes, out_Bx1xD.shape[-1]), jnp.float32).at[:, 0].set(
          out_Bx1xD[:, 0].astype(jnp.float32))
  parents_N = jnp.asarray(np.maximum(tree.parents_N, 0))
  keys = jax.random.split(key, tree.max_depth)
  logits_BxLxV = logits_BxV[:, None]
  for d, (start, end) in enumerate(levels[:-1]):
    if d > 0:  # depth d's nodes at root + node, seeing their ancestors among nodes 1..end - 1
      g_BxLxD = None if out_BxNxD is None else out_BxNxD[:, parents_N[start:end]]
      logits_BxLxV, level_out_BxLxD, cache = drafter.step(
          decoder, draft_params, cache, tokens_BxN[:, start:end], g_BxLxD,
          offsets=jnp.asarray(depths[1:end] - 1),
          visible=jnp.asarray(tree.ancestor_mask_NxN[start:end, 1:end]))
      if out_BxNxD is not None:
        out_BxNxD = out_BxNxD.at[:, start:end].set(level_out_BxLxD.astype(jnp.float32))
    q_BxLxV = None if token_ids else process_logits(logits_BxLxV, sampling)
    rows = rows.at[:, start:end].set(token_path.logits_argmax(logits_BxLxV) if token_ids
                                     else q_BxLxV)
    child_C, pos_C, rank_C = child_plan(tree, start, end)
    kids_BxLxK = draw_children(keys[d], logits_BxLxV, q_BxLxV, int(rank_C.max()) + 1, sampling)
    tokens_BxN = tokens_BxN.at[:, child_C].set(kids_BxLxK[:, pos_C, rank_C])
  return tokens_BxN, rows, bonus_row(bonus_logits_BxV, logits_BxV, sampling, token_ids), cache


def bonus_row(bonus_logits_BxV, logits_BxV, sampling: SamplingConfig, token_ids: bool):
  """What the tree's commit reads at the previous call's bonus position: the draft's argmax
  there (token ids) or its processed q; a drafter that scores no bonus position (None): None
  (token ids) or zeros, so beta's bonus column is 0 there."""
  if bonus_logits_BxV is None:
    return None if token_ids else jnp.zeros(logits_BxV.shape, jnp.float32)
  return (token_path.logits_argmax(bonus_logits_BxV) if token_ids
          else process_logits(bonus_logits_BxV, sampling))


def tree_logits(decoder, target_params, cache: seam.Cache, tokens_BxN: jax.Array, tree: Tree):
  """The drafter's verify call over every node (node n at slot root + n, position root + depth,
  seeing its ancestors): (raw logits [B, N, V], the target's states or None, cache)."""
  return decoder.drafter.verify(decoder, target_params, cache, tokens_BxN,
                                offsets=jnp.asarray(tree.depths_N),
                                visible=jnp.asarray(tree.ancestor_mask_NxN))


def tree_verifier(verifier: Any, sampling: SamplingConfig) -> Callable:
  """A tree scheme's verifier (static or dynamic: both pass their tree to the same functions):
  'auto' is `greedy` at temperature 0 and `recursive_rejection` above; a name of
  `verify.TREE_VERIFIERS`; or a function with their contract (the tests' faulty verifiers)."""
  if callable(verifier):
    return verifier
  if verifier == "auto":
    return verify.greedy if sampling.greedy else verify.recursive_rejection
  if verifier == "greedy" and not sampling.greedy:
    raise ValueError("the greedy tree verifier is exact at temperature 0 only; use "
                     "'recursive_rejection' (or 'auto') when sampling")
  return verify.get_verifier(verifier)


class ModelTree:
  """What the schemes that draft a tree with a model share (`TreeScheme`, the static one, and
  `dynamic.DynamicTreeScheme`): stats shaped by their `tree`, both models scoring masked blocks,
  the verifier picked by name and temperature (`tree_verifier`)."""

  needs_draft = True

  @property
  def written(self) -> int:
    """Tokens one iteration writes at most: a path of D drafts and the next token."""
    return self.tree.max_depth + 1

  def init_stats(self, batch: int) -> TreeStats:
    del batch
    return TreeStats.zeros(self.tree)

  def check(self, decoder) -> None:
    """A token drafter's models must score a masked block (called by `start.check_decoder`); a
    feature drafter's pair is checked by the drafter (the target's states with a layout)."""
    if not decoder.drafter.feeds_verified:
      seam.check_masked(decoder.target, "target")
      seam.check_masked(decoder.draft, "draft")

  def verify_fn(self, sampling: SamplingConfig) -> Callable:
    return tree_verifier(self.verifier, sampling)


@dataclasses.dataclass(frozen=True)
class TreeScheme(ModelTree):
  """Draft a static tree per iteration, verify all its nodes in one target call.

  A hashable decoding scheme. tree: a level-ordered `Tree` (as `Tree.from_branching` lays it
  out), or a branching per depth such as (3, 2, 1) (what gin binds; the default). verifier: as
  `tree_verifier` takes it. A token drafter's models need `extend_with_mask` (`ModelTree.check`).
  """

  tree: Any = (3, 2, 1)
  verifier: Any = "auto"

  def __post_init__(self):
    if isinstance(self.tree, (list, tuple)):  # a branching per depth
      object.__setattr__(self, "tree", Tree.from_branching(tuple(self.tree)))
    if not isinstance(self.tree, Tree):
      raise TypeError(f"TreeScheme.tree must be a decoding.tree.Tree or a branching per depth "
                      f"such as (3, 2, 1), got {type(self.tree).__name__}")
    if np.any(np.diff(self.tree.depths_N) < 0):
      raise ValueError("the tree's nodes must be laid out depth by depth (level order, as "
                       "Tree.from_branching makes them): the draft expands one level per call")
    if not callable(self.verifier) and self.verifier not in VERIFIERS:
      raise ValueError(f"unknown tree verifier {self.verifier!r}; known: {VERIFIERS}")

  @classmethod
  def from_branching(cls, branching, verifier: Any = "auto") -> "TreeScheme":
    return cls(Tree.from_branching(tuple(branching)), verifier)

  @property
  def gamma(self) -> int:
    """Every drafted node: the verify call writes N slots (see the module docstring)."""
    return self.tree.num_nodes - 1

  def iteration(self, decoder, params, state: st.DecodeState) -> st.DecodeState:
    return tree_iteration(decoder, params, state, self)


def tree_iteration(decoder, params, state: st.DecodeState, scheme: TreeScheme
                   ) -> st.DecodeState:
  """One draft -> verify -> keep a path -> commit iteration (one target call); at temperature 0
  with a named verifier as token ids (`tree.token_path`: the same result, bit for bit)."""
  tree, sampling, drafter = scheme.tree, decoder.sampling, decoder.drafter
  rng, k_draft, k_verify = jax.random.split(state.rng, 3)
  root_B = state.target_cache.index_B
  token_ids = token_path.uses_token_path(scheme.verifier, sampling)
  tokens_BxN, rows, bonus, draft_cache = draft_tree(decoder, params.draft, state, k_draft, tree,
                                                    sampling, token_ids)
  logits_BxNxV, hidden, target_cache = tree_logits(decoder, params.target, state.target_cache,
                                                   tokens_BxN, tree)
  if token_ids:
    target_BxN = token_path.logits_argmax(logits_BxNxV)
    verdict = token_path.argmax_walk(tree, tokens_BxN, target_BxN)
  else:
    p_BxNxV = process_logits(logits_BxNxV, sampling)
    verdict = scheme.verify_fn(sampling)(k_verify, tree, tokens_BxN, rows, p_BxNxV)
  keep = functools.partial(commit_path, root_slot_B=root_B, path_BxD=verdict.path_BxD,
                           num_accepted_B=verdict.num_accepted_B)
  # A feature drafter is fed the kept nodes again (with the target's states): nothing to keep.
  state = state.replace(rng=rng, target_cache=keep(target_cache),
                        draft_cache=draft_cache if drafter.feeds_verified else keep(draft_cache))
  if token_ids:
    beta_BxD1 = token_path.path_beta(state, verdict, target_BxN, rows, bonus)
    p_last_BxV = token_path.next_row(verdict, logits_BxNxV.shape[-1])
  else:
    beta_BxD1, p_last_BxV = row_beta(state, verdict, p_BxNxV, rows, bonus)
  new = commit_tree_with(state, verdict, beta_BxD1, p_last_BxV, decoder.target.eos_id,
                         decoder.max_decode_len, pending_B=never_pending(drafter, state))
  return observe_tree(decoder, params, state, new, verdict, hidden)
