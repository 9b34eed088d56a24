"""The tree scheme: draft a static tree, verify every node in one target call, keep one path.

A `Decoder` (decoding/decoder.py) with `scheme=TreeScheme(Tree.from_branching((3, 2, 1)))` runs
`tree_iteration` inside its one `lax.while_loop`, as `speculative.Chain` runs its chain:
1. `draft_tree`: the draft expands the tree level by level. Its first call is the chain's
   (`speculative.first_draft_call`: the root, and the token it had not seen when a whole path was
   kept last time); each deeper level is one `extend_with_mask` call over that level's nodes
   alone (node n to slot root + n), whose window reaches back to the slot after the root: it
   sees its ancestors among the levels cached before and not their cousins, positions by depth
   (`transformer.masked_block`'s window). D draft calls in all, as the chain's gamma. Each
   expanded node's children are the draft's top-k: ranked by the raw logits at temperature 0,
   drawn without replacement from the processed q at T > 0
   (`verify.sample_without_replacement`), q kept for the verifier.
2. `verify_tree`: one target `extend_with_mask` over all N nodes: node n at slot root + n.
3. a tree verifier (`verify.greedy` at T = 0, `verify.recursive_rejection` at T > 0): the kept
   path and the next token.
4. `commit.commit_path` on both caches (the kept path into consecutive slots, so rollback stays an
   index move), then `commit_tree`: write the path and the next token, count, roll back.
Static shapes throughout; every row keeps its own path (batch > 1, ragged acceptance).

Why the scheme's `gamma` is N - 1 (every drafted node): the verify call writes N cache slots past
the last kept token, and `start.slack(gamma)` sizes the cache and buffer from it; the per-position
counters then have a column per drafted node, of which the first D (one per depth) are used.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import seam
from specdec_jax.decoding import state as st
from specdec_jax.decoding.sampling import SamplingConfig, process_logits
from specdec_jax.decoding.speculative import count, first_draft_call, write_back
from specdec_jax.decoding.tree import token_path, verify
from specdec_jax.decoding.tree.commit import commit_path
from specdec_jax.decoding.tree.shape import Tree

VERIFIERS = ("auto",) + tuple(verify.TREE_VERIFIERS)


@flax.struct.dataclass
class TreeStats:
  """The tree's own on-device counters (summed over active rows), for the dashboards and a
  Sequoia-style tree optimised from measured acceptance by depth and sibling rank.

  kept_rank_DxK: target calls whose kept path took the rank-r sibling at depth d + 1 (written
    tokens only). reached_D: target calls whose walk tested siblings at depth d + 1.
  """

  kept_rank_DxK: jax.Array
  reached_D: jax.Array

  @classmethod
  def zeros(cls, tree: Tree) -> "TreeStats":
    return cls(kept_rank_DxK=jnp.zeros((tree.max_depth, tree.max_branching), jnp.int32),
               reached_D=jnp.zeros((tree.max_depth,), jnp.int32))


class PathDrafted(NamedTuple):
  """What `speculative.count` reads of a proposal, for a tree: drafts offered along one path
  (D) and draft calls made (D)."""
  proposed_B: jax.Array
  fed_B: jax.Array


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


def draft_tree(draft, draft_params, state: st.DecodeState, key: jax.Array, tree: Tree,
               sampling: SamplingConfig, token_ids: bool = False):
  """Drafts the tree: (node tokens [B, N], q per node [B, N, V] (rows of leaves 0), the processed
  q at the previous iteration's bonus position [B, V], the draft cache holding the root at its
  slot and node n (every depth < D) at root + n). token_ids (temperature 0, `tree.token_path`): the
  draft's argmax per node [B, N] (-1 at leaves) and at the bonus position [B] instead of the
  one-hot rows."""
  levels, depths = level_ranges(tree), tree.depths_N
  logits_BxV, bonus_logits_BxV, cache = first_draft_call(draft, draft_params, state)
  batch, vocab = logits_BxV.shape
  tokens_BxN = jnp.zeros((batch, tree.num_nodes), jnp.int32).at[:, 0].set(st.last_tokens(state))
  rows = (jnp.full((batch, tree.num_nodes), -1, jnp.int32) if token_ids
          else jnp.zeros((batch, tree.num_nodes, vocab), jnp.float32))
  keys = jax.random.split(key, tree.max_depth)
  logits_BxLxV = logits_BxV[:, None]
  for d, (start, end) in enumerate(levels[:-1]):
    if d > 0:  # depth d's nodes at root + node, seeing their ancestors among nodes 1..end - 1
      logits_BxLxV, cache = draft.extend_with_mask(
          draft_params, cache, tokens_BxN[:, start:end], jnp.asarray(depths[1:end] - 1),
          jnp.asarray(tree.ancestor_mask_NxN[start:end, 1:end]))
    q_BxLxV = None if token_ids else process_logits(logits_BxLxV, sampling)
    rows = rows.at[:, start:end].set(token_path.logits_argmax(logits_BxLxV) if token_ids
                                     else q_BxLxV)
    child_C, pos_C, rank_C = child_plan(tree, start, end)
    kids_BxLxK = draw_children(keys[d], logits_BxLxV, q_BxLxV, int(rank_C.max()) + 1, sampling)
    tokens_BxN = tokens_BxN.at[:, child_C].set(kids_BxLxK[:, pos_C, rank_C])
  bonus = (token_path.logits_argmax(bonus_logits_BxV) if token_ids
           else process_logits(bonus_logits_BxV, sampling))
  return tokens_BxN, rows, bonus, cache


def tree_logits(target, target_params, cache: seam.Cache, tokens_BxN: jax.Array, tree: Tree
                ) -> tuple[jax.Array, seam.Cache]:
  """One target call over every node (node n at slot root + n, position root + depth, seeing
  its ancestors): the raw logits [B, N, V] and the cache."""
  return target.extend_with_mask(target_params, cache, tokens_BxN, jnp.asarray(tree.depths_N),
                                 jnp.asarray(tree.ancestor_mask_NxN))


def verify_tree(target, target_params, cache: seam.Cache, tokens_BxN: jax.Array, tree: Tree,
                sampling: SamplingConfig) -> tuple[jax.Array, seam.Cache]:
  """`tree_logits`, processed: p per node [B, N, V] (float32) and the cache."""
  logits_BxNxV, cache = tree_logits(target, target_params, cache, tokens_BxN, tree)
  return process_logits(logits_BxNxV, sampling), cache


def _path_rows(probs_BxNxV: jax.Array, nodes_BxD1: jax.Array) -> jax.Array:
  """The rows [B, D + 1, V] of the path's nodes (root first; -1 past the path reads the root)."""
  return jnp.take_along_axis(probs_BxNxV, jnp.maximum(nodes_BxD1, 0)[:, :, None], axis=1)


def commit_tree(state: st.DecodeState, verdict: verify.TreeVerdict, p_BxNxV: jax.Array,
                q_BxNxV: jax.Array, bonus_q_BxV: jax.Array, eos_id: int, max_decode_len: int,
                pending_B: jax.Array | None = None) -> st.DecodeState:
  """Writes the kept path and the next token for active rows, rolls both caches back to them
  (their path entries already gathered by `commit_path`), counts what was written
  (`speculative.count`; drafted = D per call, the drafts one path offers; a kept pruned child of
  a dynamic tree, `verdict.pruned_B`, is an accepted draft written as the next token).
  pending_B: the draft has not seen the last kept node (it is fed next iteration by
  `first_draft_call`, as in the chain). A static tree's draft fed every node above depth D, so
  None means: the path reached depth D. Where pending, the draft computed no q after that node,
  so alpha's columns stop at it (the next token's q comes as next iteration's bonus q)."""
  beta_BxD1, p_last_BxV = row_beta(state, verdict, p_BxNxV, q_BxNxV, bonus_q_BxV)
  return commit_tree_with(state, verdict, beta_BxD1, p_last_BxV, eos_id, max_decode_len,
                          pending_B)


def row_beta(state: st.DecodeState, verdict: verify.TreeVerdict, p_BxNxV: jax.Array,
             q_BxNxV: jax.Array, bonus_q_BxV: jax.Array) -> tuple[jax.Array, jax.Array]:
  """What `commit_tree` reads of the rows: beta_BxD1 = sum_x min(p, q) at the previous call's
  bonus position, then at the root and each path node above depth D (past the path the root:
  columns the counters mask), and the target's processed row at the last kept node."""
  depth = verdict.path_BxD.shape[1]
  nodes_BxD1 = jnp.concatenate([jnp.zeros_like(verdict.num_accepted_B)[:, None],
                                verdict.path_BxD], axis=1)
  path_beta_BxD = jnp.sum(jnp.minimum(_path_rows(p_BxNxV, nodes_BxD1),
                                      _path_rows(q_BxNxV, nodes_BxD1)), axis=-1)[:, :depth]
  bonus_beta_B = jnp.sum(jnp.minimum(state.bonus_p_BxV, bonus_q_BxV), axis=-1)
  beta_BxD1 = jnp.concatenate([bonus_beta_B[:, None], path_beta_BxD], axis=1)
  p_last_BxV = jnp.take_along_axis(p_BxNxV, verdict.last_node_B[:, None, None], axis=1)[:, 0]
  return beta_BxD1, p_last_BxV


def commit_tree_with(state: st.DecodeState, verdict: verify.TreeVerdict, beta_BxD1: jax.Array,
                     p_last_BxV: jax.Array, eos_id: int, max_decode_len: int,
                     pending_B: jax.Array | None = None) -> st.DecodeState:
  """`commit_tree` given beta_BxD1 (`speculative.count`) and the target's processed row at the
  last kept node: what the general tree path and its temperature-0 path (`tree.token_path`, no rows
  to compute them from) share."""
  n_B, depth = verdict.num_accepted_B, verdict.path_BxD.shape[1]
  d_D1 = jnp.arange(depth + 1, dtype=jnp.int32)
  padded_BxD1 = jnp.concatenate([verdict.tokens_BxD, jnp.zeros_like(n_B)[:, None]], axis=1)
  new_BxD1 = jnp.where(d_D1[None, :] == n_B[:, None], verdict.next_token_B[:, None], padded_BxD1)
  count_B, done_B = st.emit_count(new_BxD1, n_B + 1, state.num_B, state.done_B, eos_id,
                                  max_decode_len)
  num_B = state.num_B + count_B
  fresh_B = n_B == depth if pending_B is None else pending_B
  pending_B = jnp.where(state.done_B, state.draft_pending_B, fresh_B)
  path_B = jnp.full_like(n_B, depth)  # one path offers D drafts: a per-path acceptance rate
  drafted = PathDrafted(path_B, jnp.where(fresh_B, n_B, path_B))
  kept_B = jnp.minimum(n_B + verdict.pruned_B.astype(n_B.dtype), count_B)
  counters = count(state.counters, ~state.done_B, done_B, state.draft_pending_B, drafted, kept_B,
                   count_B, beta_BxD1)
  return write_back(state, num_B, done_B, counters, pending_B, new_BxD1, count_B,
                    p_last_BxV)


def tree_stats(stats: TreeStats, verdict: verify.TreeVerdict, active_B: jax.Array,
               kept_B: jax.Array) -> TreeStats:
  """Adds one call's kept sibling ranks and reached depths (active rows, written tokens)."""
  depth, k = stats.kept_rank_DxK.shape
  kept_BxD = (jnp.arange(depth, dtype=jnp.int32)[None, :] < kept_B[:, None])
  rank_BxDxK = (verdict.rank_BxD[:, :, None] == jnp.arange(k, dtype=jnp.int32)[None, None, :])
  reached_BxD = (verdict.tried_BxD > 0) & active_B[:, None]
  return TreeStats(
      kept_rank_DxK=stats.kept_rank_DxK + jnp.sum(rank_BxDxK & kept_BxD[:, :, None], axis=0,
                                                  dtype=jnp.int32),
      reached_D=stats.reached_D + jnp.sum(reached_BxD, axis=0, dtype=jnp.int32))


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

  def init_stats(self, batch: int) -> TreeStats:
    del batch
    return TreeStats.zeros(self.tree)

  def check(self, decoder) -> None:
    """Both models must score a masked block (called by `start.check_decoder`)."""
    seam.check_masked(decoder.target, "target")
    seam.check_masked(decoder.draft, "draft")

  def verify_fn(self, sampling: SamplingConfig) -> Callable:
    return tree_verifier(self.verifier, sampling)


@dataclasses.dataclass(frozen=True)
class TreeScheme(ModelTree):
  """Draft a static tree per iteration, verify all its nodes in one target call.

  A decoding scheme (`decoder.Decoder.scheme`), hashable. tree: a level-ordered `Tree` (nodes
  laid out depth by depth, as `Tree.from_branching` makes them), or a branching per depth such
  as (3, 2, 1) (what gin binds: `TreeScheme.tree = (3, 2, 1)`). verifier: 'auto' (`greedy` at
  temperature 0, `recursive_rejection` above), a name of `verify.TREE_VERIFIERS`, or a function
  with the tree verifiers' contract (the tests' faulty verifiers). Both models need
  `extend_with_mask` (`seam.check_masked`).
  """

  tree: Any
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
  tree, sampling = scheme.tree, decoder.sampling
  rng, k_draft, k_verify = jax.random.split(state.rng, 3)
  root_B = state.target_cache.index_B
  token_ids = token_path.uses_token_path(scheme.verifier, sampling)
  tokens_BxN, rows, bonus, draft_cache = draft_tree(decoder.draft, params.draft, state, k_draft,
                                                    tree, sampling, token_ids)
  if token_ids:
    logits_BxNxV, target_cache = tree_logits(decoder.target, params.target, state.target_cache,
                                             tokens_BxN, tree)
    target_BxN = token_path.logits_argmax(logits_BxNxV)
    verdict = token_path.argmax_walk(tree, tokens_BxN, target_BxN)
  else:
    p_BxNxV, target_cache = verify_tree(decoder.target, params.target, state.target_cache,
                                        tokens_BxN, tree, sampling)
    verdict = scheme.verify_fn(sampling)(k_verify, tree, tokens_BxN, rows, p_BxNxV)
  keep = functools.partial(commit_path, root_slot_B=root_B, path_BxD=verdict.path_BxD,
                           num_accepted_B=verdict.num_accepted_B)
  state = state.replace(rng=rng, target_cache=keep(target_cache), draft_cache=keep(draft_cache))
  if token_ids:
    beta_BxD1 = token_path.path_beta(state, verdict, target_BxN, rows, bonus)
    p_last_BxV = token_path.next_row(verdict, logits_BxNxV.shape[-1])
  else:
    beta_BxD1, p_last_BxV = row_beta(state, verdict, p_BxNxV, rows, bonus)
  new = commit_tree_with(state, verdict, beta_BxD1, p_last_BxV, decoder.target.eos_id,
                         decoder.max_decode_len)
  kept_B = new.counters.accepted_B - state.counters.accepted_B
  return new.replace(stats=tree_stats(state.stats, verdict, ~state.done_B, kept_B))
