"""Committing a verified tree path: its cache entries into consecutive slots, its tokens and
counters into the state, and the drafter's view of it.

Why: the verify call writes node n to slot root + n (positions by depth), so the kept path's
entries sit at scattered slots. Gathered to root + 1 .. root + n, the cache is the one a chain
over the path would have built (entries were computed at their depth's position, which is their
new slot), and the rest is the chain's commit again: a rollback, an index move.
"""
from __future__ import annotations

from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.decoding import state as st
from specdec_jax.decoding.speculative import count, write_back
from specdec_jax.decoding.tree import verify
from specdec_jax.decoding.tree.shape import Tree
from specdec_jax.seam import Cache


def commit_path(cache: Cache, root_slot_B: jax.Array, path_BxD: jax.Array,
                num_accepted_B: jax.Array) -> Cache:
  """The cache after a tree verify call, reduced to the kept path. root_slot_B: the cache index
  before the verify call. path_BxD: `TreeVerdict.path_BxD`. Returns the cache with node path[d]'s
  entries at slot root + d + 1 and the index at root + n + 1, the slot of the token emitted after
  the path (not fed yet), as the chain's commit leaves it. Needs `copy_slots` (`DecodeCache`)."""
  depth = path_BxD.shape[1]
  dst_BxD = root_slot_B[:, None] + jnp.arange(1, depth + 1, dtype=jnp.int32)[None, :]
  # Past the path a slot is copied onto itself: destinations stay distinct, nothing kept moves.
  src_BxD = jnp.where(path_BxD >= 0, root_slot_B[:, None] + path_BxD, dst_BxD)
  return cache.copy_slots(src_BxD, dst_BxD).rollback(root_slot_B + num_accepted_B + 1)


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


def path_hidden(hidden_BxNxnxD, path_BxD: jax.Array):
  """The target's states at the root and the kept path's nodes, [B, D + 1, n, D] (rows past the
  path read the root: junk the pending count never reaches); None passes through (a token
  drafter reads no states)."""
  if hidden_BxNxnxD is None:
    return None
  nodes_BxD1 = jnp.concatenate([jnp.zeros_like(path_BxD[:, :1]), jnp.maximum(path_BxD, 0)], 1)
  return jnp.take_along_axis(hidden_BxNxnxD, nodes_BxD1[:, :, None, None], axis=1)


def _path_rows(probs_BxNxV: jax.Array, nodes_BxD1: jax.Array) -> jax.Array:
  """The rows [B, D + 1, V] of the path's nodes (root first; -1 past the path reads the root)."""
  return jnp.take_along_axis(probs_BxNxV, jnp.maximum(nodes_BxD1, 0)[:, :, None], axis=1)


def commit_tree(state: st.DecodeState, verdict: verify.TreeVerdict, p_BxNxV: jax.Array,
                q_BxNxV: jax.Array, bonus_q_BxV: jax.Array, eos_id: int, max_decode_len: int,
                pending_B: jax.Array | None = None) -> st.DecodeState:
  """Writes the kept path and the next token for active rows, rolls both caches back to them
  (path entries already gathered by `commit_path`), counts what was written (`speculative.count`:
  drafted = D per call, one path's offer; a kept pruned child, `verdict.pruned_B`, is an accepted
  draft written as the next token). pending_B: the draft has not seen the last kept node (its
  next first call feeds it); None: the static tree's rule, pending exactly when the path reached
  depth D (its draft fed every node above). Where pending, alpha's columns stop at that node."""
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


def never_pending(drafter, state: st.DecodeState):
  """`commit_tree`'s pending_B for a drafter fed every kept node again (all False), else None
  (the tree's own rule)."""
  return jnp.zeros_like(state.done_B) if drafter.feeds_verified else None


def observe_tree(decoder, params, state: st.DecodeState, new: st.DecodeState, verdict,
                 hidden) -> st.DecodeState:
  """After a tree's commit: its counters (`tree_stats`) and the drafter's view of the kept path
  (a feature drafter's pending entries: the target's states at the root and the path)."""
  kept_B = new.counters.accepted_B - state.counters.accepted_B
  new = new.replace(stats=tree_stats(state.stats, verdict, ~state.done_B, kept_B))
  return decoder.drafter.observe(decoder, params.draft, state, new,
                                 path_hidden(hidden, verdict.path_BxD), state.draft_carry)
