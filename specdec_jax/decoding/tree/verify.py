"""Tree verifiers: given a drafted tree and both models' processed distributions at every node,
which root-to-node path to keep and which token to emit after it.

Contract (as `acceptance.tokenwise` / `.block`, batched, jittable with `tree` static):
  verifier(key, tree, node_tokens_BxN, draft_probs_BxNxV, target_probs_BxNxV) -> TreeVerdict
- tree: a static `shape.Tree`, or a `Walk` (per-row children tables: a dynamic tree); every
  verifier passes it on to `descend`, so each serves both.
- node_tokens_BxN int32: each node's token; column 0 is the root (the last committed token,
  fed first by the verify call), never read.
- draft_probs_BxNxV: at node n, the draft's processed q from which n's children were drawn
  WITHOUT replacement, in rank order (`sample_without_replacement`); leaves' rows are not read.
- target_probs_BxNxV: at node n, the target's processed p of the token after the path to n.
Float32 arithmetic whatever the models ran in; p and q are processed identically beforehand.
"""
from __future__ import annotations

from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.decoding import acceptance as acc
from specdec_jax.decoding.sampling import argmax, inverse_cdf, sample
from specdec_jax.decoding.tree.shape import Tree


@flax.struct.dataclass
class TreeVerdict:
  """What a tree verifier decided, per row (D = tree.max_depth).

  num_accepted_B: drafted tokens kept, the depth of the last kept node (0: none).
  path_BxD: column d holds the kept node at depth d + 1; -1 past num_accepted_B.
  tokens_BxD: the kept tokens, 0 past num_accepted_B.
  last_node_B: the last kept node (0, the root, if none): the next token follows it, and its
    cache slot is where the path ends.
  next_token_B: the token emitted after the kept path (a correction sampled from the residual
    of the last node's siblings, or a bonus sample of p at the last node).
  rank_BxD: the sibling rank of the kept node at depth d + 1 (for acceptance by depth and rank);
    -1 past num_accepted_B (+ 1 where pruned_B).
  tried_BxD: siblings tested at depth d + 1 (the kept one included; 0 where not reached).
  pruned_B: the walk kept a drawn child that is not a node (a dynamic tree pruned it): that
    child's token is next_token_B and rank_BxD holds its rank at depth num_accepted_B + 1, so it
    counts as an accepted draft token (never set for a static tree).
  """

  num_accepted_B: jax.Array
  path_BxD: jax.Array
  tokens_BxD: jax.Array
  last_node_B: jax.Array
  next_token_B: jax.Array
  rank_BxD: jax.Array
  tried_BxD: jax.Array
  pruned_B: jax.Array


@flax.struct.dataclass
class Walk:
  """What `descend` walks, per row: every node's drawn children in rank order.

  children_BxNxK: the node id of node n's rank-r child, -1 where that child is not a node
    (pruned) or was never drawn. tokens_BxNxK: the child's token (read where drawn).
  drawn_BxNxK: node n drew a rank-r child (a static tree: exactly the children it has; a dynamic
    tree: all k children of a node the draft expanded, none of any other node).
  max_depth: D, static: the walk's steps.
  Why a table rather than a `Tree`: a dynamic tree's shape is chosen on device per row, and its
  expanded nodes keep drawn children the node budget pruned, which the verifier must still try
  (`tree.dynamic`: exactness).
  """

  children_BxNxK: jax.Array
  tokens_BxNxK: jax.Array
  drawn_BxNxK: jax.Array
  max_depth: int = flax.struct.field(pytree_node=False)

  @classmethod
  def of_tree(cls, tree: Tree, node_tokens_BxN: jax.Array) -> "Walk":
    """A static tree's table, the same for every row (nothing pruned)."""
    batch = node_tokens_BxN.shape[0]
    kids_NxK = jnp.asarray(tree.children_NxK)
    tokens_BxNK = jnp.take(node_tokens_BxN, jnp.maximum(kids_NxK, 0).reshape(-1), axis=1)
    return cls(jnp.broadcast_to(kids_NxK, (batch,) + kids_NxK.shape),
               tokens_BxNK.reshape((batch,) + kids_NxK.shape),
               jnp.broadcast_to(kids_NxK >= 0, (batch,) + kids_NxK.shape), tree.max_depth)


# (u_B, x_B, p_node_BxV, p_cur_BxV, q_left_BxV) -> (accept_B, valid_B, p_cur_BxV, q_left_BxV)
SiblingRule = Callable[..., tuple[jax.Array, jax.Array, jax.Array, jax.Array]]


def _row(probs_BxNxV: jax.Array, node_B: jax.Array) -> jax.Array:
  return jnp.take_along_axis(probs_BxNxV, node_B[:, None, None], axis=1)[:, 0]


def _at(probs_BxV: jax.Array, x_B: jax.Array) -> jax.Array:
  return jnp.take_along_axis(probs_BxV, x_B[:, None], axis=1)[:, 0]


def rejection_sibling(u_B, x_B, p_node_BxV, p_cur_BxV, q_left_BxV):
  """One sibling of recursive rejection sampling without replacement (SpecInfer's multi-step
  speculative sampling; Jeon et al. 2024, "Recursive Speculative Decoding").

  State at a node after siblings x_1..x_{i-1} were rejected: p_cur = p_i, the running residual
  (p_1 = p), and q_left = q with x_1..x_{i-1} zeroed, so x_i ~ q_i = q_left / sum(q_left) (draws
  without replacement). Test r < p_i(x_i) / q_i(x_i) (`acceptance.accept_test`); on rejection
  p_{i+1} = norm(max(0, p_i - q_i)) and x_i leaves q. Why it is exact (induction from the last
  sibling): x_i is emitted with probability min(p_i, q_i)(x_i), a rejection has probability
  sum max(0, p_i - q_i), and the rest emits p_{i+1} whatever q_{i+1} is; so the node emits p_i.
  p_{i+1}(x_i) = 0 (a rejected x_i had p_i < q_i), so removing x_i from q loses nothing.
  A sibling whose token has no q mass left (the draft's support, after top-k / top-p, is smaller
  than the node's branching: the draws fill with q = 0 tokens) was never drawn: invalid, skipped,
  state unchanged. `p_node` (the node's own p) is unused: the exactness checker's faults use it.
  """
  del p_node_BxV
  mass_B = jnp.sum(q_left_BxV, axis=-1)
  q_x_B = _at(q_left_BxV, x_B)
  valid_B = q_x_B > 0.0
  q_i_BxV = q_left_BxV / jnp.maximum(mass_B, 1e-30)[:, None]
  accept_B = valid_B & acc.accept_test(u_B, _at(p_cur_BxV, x_B), _at(q_i_BxV, x_B))
  reject_B = valid_B & ~accept_B
  p_next_BxV = jnp.where(reject_B[:, None], acc.residual(p_cur_BxV, q_i_BxV), p_cur_BxV)
  tried_BxV = jax.nn.one_hot(x_B, q_left_BxV.shape[-1], dtype=jnp.bool_)
  q_next_BxV = jnp.where(reject_B[:, None] & tried_BxV, 0.0, q_left_BxV)
  return accept_B, valid_B, p_next_BxV, q_next_BxV


def argmax_sibling(u_B, x_B, p_node_BxV, p_cur_BxV, q_left_BxV):
  """Greedy: keep x exactly when it is the target's argmax at the node; nothing else changes."""
  del u_B
  accept_B = x_B == argmax(p_node_BxV).astype(x_B.dtype)
  return accept_B, jnp.ones_like(accept_B), p_cur_BxV, q_left_BxV


def _try_siblings(kids_BxK, x_BxK, drawn_BxK, alive_B, p_node_BxV, q_node_BxV, u_BxK,
                  sibling: SiblingRule):
  """Tests a node's drawn children (kids_BxK: node ids, -1 = pruned; their tokens x_BxK) in rank
  order until one is kept: (kept child's id, its token, kept?, its rank or -1, siblings tested,
  the distribution after the last rejection)."""
  p_cur, q_left = p_node_BxV, q_node_BxV
  kept_B = jnp.zeros_like(alive_B)
  chosen_B = rank_B = jnp.full_like(kids_BxK[:, 0], -1)
  token_B = tried_B = jnp.zeros_like(chosen_B)
  for r in range(kids_BxK.shape[1]):  # K is small and static
    live_B = alive_B & ~kept_B & drawn_BxK[:, r]
    ok_B, valid_B, p_new, q_new = sibling(u_BxK[:, r], x_BxK[:, r], p_node_BxV, p_cur, q_left)
    p_cur = jnp.where(live_B[:, None], p_new, p_cur)
    q_left = jnp.where(live_B[:, None], q_new, q_left)
    ok_B = ok_B & valid_B & live_B
    chosen_B = jnp.where(ok_B, kids_BxK[:, r], chosen_B)
    token_B = jnp.where(ok_B, x_BxK[:, r], token_B)
    rank_B = jnp.where(ok_B, r, rank_B)
    tried_B = tried_B + (valid_B & live_B).astype(tried_B.dtype)
    kept_B = kept_B | ok_B
  return chosen_B, token_B, kept_B, rank_B, tried_B, p_cur


def _at_node(table_BxNxK: jax.Array, node_B: jax.Array) -> jax.Array:
  return jnp.take_along_axis(table_BxNxK, node_B[:, None, None], axis=1)[:, 0]


def descend(key: jax.Array | None, tree: Tree | Walk, node_tokens_BxN: jax.Array,
            draft_probs_BxNxV: jax.Array, target_probs_BxNxV: jax.Array, sibling: SiblingRule
            ) -> tuple[TreeVerdict, jax.Array]:
  """The walk every tree verifier shares: from the root, depth by depth, test the current node's
  drawn children with `sibling` and move to the kept one; stop where none is kept, at a node that
  drew none, or at a kept child that is not a node (pruned). Returns the verdict with
  next_token_B unset (-1) and the distribution the next token is drawn from: the running
  residual after a rejection, p at a node that drew no children (the bonus), one-hot at a kept
  pruned child's token (so `sample` / `argmax` of it emits that token). `key` draws the sibling
  tests' uniforms; None gives zeros (a rule that ignores them: greedy)."""
  walk = tree if isinstance(tree, Walk) else Walk.of_tree(tree, node_tokens_BxN)
  p = target_probs_BxNxV.astype(jnp.float32)
  q = draft_probs_BxNxV.astype(jnp.float32)
  shape_BxDxK = (node_tokens_BxN.shape[0], walk.max_depth, walk.children_BxNxK.shape[2])
  u_BxDxK = (jnp.zeros(shape_BxDxK, jnp.float32) if key is None
             else jax.random.uniform(key, shape_BxDxK, jnp.float32))
  node_B = jnp.zeros(shape_BxDxK[:1], jnp.int32)
  alive_B = jnp.ones(shape_BxDxK[:1], jnp.bool_)
  pruned_B = jnp.zeros_like(alive_B)
  final_BxV = jnp.zeros_like(p[:, 0])
  cols = {name: [] for name in ("path", "tokens", "rank", "tried")}
  for d in range(walk.max_depth):  # D is small and static
    chosen_B, token_B, kept_B, rank_B, tried_B, p_cur = _try_siblings(
        _at_node(walk.children_BxNxK, node_B), _at_node(walk.tokens_BxNxK, node_B),
        _at_node(walk.drawn_BxNxK, node_B), alive_B, _row(p, node_B), _row(q, node_B),
        u_BxDxK[:, d], sibling)
    moved_B = kept_B & (chosen_B >= 0)
    stop_B = kept_B & ~moved_B  # a pruned child kept: its token is the next one
    final_BxV = jnp.where((alive_B & ~kept_B)[:, None], p_cur, final_BxV)
    final_BxV = jnp.where(stop_B[:, None], jax.nn.one_hot(token_B, p.shape[-1]), final_BxV)
    cols["path"].append(jnp.where(moved_B, chosen_B, -1))
    cols["tokens"].append(jnp.where(moved_B, token_B, 0))
    cols["rank"].append(rank_B)
    cols["tried"].append(tried_B)
    node_B, alive_B = jnp.where(moved_B, chosen_B, node_B), moved_B
    pruned_B = pruned_B | stop_B
  final_BxV = jnp.where(alive_B[:, None], _row(p, node_B), final_BxV)
  out = {k: jnp.stack(v, axis=1).astype(jnp.int32) for k, v in cols.items()}
  verdict = TreeVerdict(
      num_accepted_B=jnp.sum(out["path"] >= 0, axis=1, dtype=jnp.int32),
      path_BxD=out["path"], tokens_BxD=out["tokens"], last_node_B=node_B,
      next_token_B=jnp.full_like(node_B, -1), rank_BxD=out["rank"], tried_BxD=out["tried"],
      pruned_B=pruned_B)
  return verdict, final_BxV


def recursive_rejection(key: jax.Array, tree: Tree, node_tokens_BxN: jax.Array,
                        draft_probs_BxNxV: jax.Array, target_probs_BxNxV: jax.Array
                        ) -> TreeVerdict:
  """Exact tree verification at any temperature (multi-draft speculative sampling): `descend`
  with `rejection_sibling`; the next token is a sample of the last residual, or at a leaf a bonus
  sample of p. On a chain it is token-wise verification in law. A greedy draft proposes its
  top-k, not draws from a one-hot q: use `greedy` at temperature 0."""
  k_walk, k_next = jax.random.split(key)
  verdict, final_BxV = descend(k_walk, tree, node_tokens_BxN, draft_probs_BxNxV,
                               target_probs_BxNxV, rejection_sibling)
  return verdict.replace(next_token_B=sample(k_next, final_BxV))


def greedy(key: jax.Array, tree: Tree, node_tokens_BxN: jax.Array, draft_probs_BxNxV,
           target_probs_BxNxV: jax.Array) -> TreeVerdict:
  """Temperature 0: the longest root-to-node path whose every token is the target's argmax after
  its parent (siblings in rank order, the first match kept), then the target's argmax after it.
  `key` and `draft_probs_BxNxV` are unused (may be None): the contract's signature."""
  del key, draft_probs_BxNxV
  p = target_probs_BxNxV.astype(jnp.float32)
  verdict, final_BxV = descend(None, tree, node_tokens_BxN, p, p, argmax_sibling)
  return verdict.replace(next_token_B=argmax(final_BxV))


def sample_without_replacement(key: jax.Array, probs_BxV: jax.Array, k: int) -> jax.Array:
  """k distinct tokens per row, int32 [B, k]: k sequential draws, each from probs with the tokens
  already drawn removed (`sampling.inverse_cdf`: 2k uniforms per row rather than Gumbel-top-k's
  V), how a node's children are drafted for `recursive_rejection`. Where fewer than k tokens have
  mass, the rest are the first tokens not yet drawn (probability 0: the verifier skips them)."""
  probs_BxV = probs_BxV.astype(jnp.float32)
  v = probs_BxV.shape[-1]
  keys = jax.random.split(key, k)
  drawn = [inverse_cdf(keys[0], probs_BxV)]
  taken_BxV = jax.nn.one_hot(drawn[0], v, dtype=bool)
  for key_j in keys[1:]:
    left_BxV = jnp.where(taken_BxV, 0.0, probs_BxV)
    x_B = jnp.where(jnp.any(left_BxV > 0, axis=-1), inverse_cdf(key_j, left_BxV),
                    argmax((~taken_BxV).astype(jnp.int32)))
    drawn.append(x_B)
    taken_BxV = taken_BxV | jax.nn.one_hot(x_B, v, dtype=bool)
  return jnp.stack(drawn, axis=-1).astype(jnp.int32)


TREE_VERIFIERS = {"greedy": greedy, "recursive_rejection": recursive_rejection}


def get_verifier(name: str):
  if name not in TREE_VERIFIERS:
    raise ValueError(f"unknown tree verifier {name!r}; known: {sorted(TREE_VERIFIERS)}")
  return TREE_VERIFIERS[name]
