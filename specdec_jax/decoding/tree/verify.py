"""Tree verifiers: given a drafted tree and both models' processed distributions at every node,
which root-to-node path to keep and which token to emit after it.

Contract (the style of `acceptance.tokenwise` / `.block`, batched, jittable with `tree` static):
  verifier(key, tree, node_tokens_BxN, draft_probs_BxNxV, target_probs_BxNxV) -> TreeVerdict
- node_tokens_BxN int32: the token of each node (`shape.Tree` order); column 0 is the root, the
  last committed token, which the verify call feeds first; verifiers never read it.
- draft_probs_BxNxV float: at node n, the draft's processed q from which n's children were
  drawn WITHOUT replacement, in rank order (Gumbel-top-k: `sample_without_replacement`). Rows of
  leaves are never read.
- target_probs_BxNxV float: at node n, the target's processed p of the token after the path to n.
All arithmetic is float32 whatever the models ran in; p and q are processed identically
(temperature, top-k, top-p: `sampling.process_logits`) before they come here.

`recursive_rejection` is exact at any temperature: the emitted tokens follow the target's law.
`greedy` keeps the longest path whose every token is the target's argmax (temperature 0).
"""
from __future__ import annotations

from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.decoding import acceptance as acc
from specdec_jax.decoding.sampling import sample
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
    -1 past num_accepted_B.
  tried_BxD: siblings tested at depth d + 1 (the kept one included; 0 where not reached).
  """

  num_accepted_B: jax.Array
  path_BxD: jax.Array
  tokens_BxD: jax.Array
  last_node_B: jax.Array
  next_token_B: jax.Array
  rank_BxD: jax.Array
  tried_BxD: jax.Array


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
  A sibling whose token has no q mass left (the draft's support, after top-k / top-p, is
  smaller than the node's branching: Gumbel-top-k then fills with q = 0 tokens) was never
  drawn: invalid, skipped, state unchanged. `p_node` (the node's own p) is unused here: it is
  the hook of the checker's `sibling_residual_from_p` fault.
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
  accept_B = x_B == jnp.argmax(p_node_BxV, axis=-1).astype(x_B.dtype)
  return accept_B, jnp.ones_like(accept_B), p_cur_BxV, q_left_BxV


def _try_siblings(kids_BxK, x_BxK, alive_B, p_node_BxV, q_node_BxV, u_BxK,
                  sibling: SiblingRule):
  """Tests a node's children (kids_BxK, -1 = none; their tokens x_BxK) in rank order until one
  is kept: (kept child, kept?, its rank or -1, siblings tested, the distribution after the last
  rejection)."""
  p_cur, q_left = p_node_BxV, q_node_BxV
  kept_B = jnp.zeros_like(alive_B)
  chosen_B = rank_B = jnp.full_like(kids_BxK[:, 0], -1)
  tried_B = jnp.zeros_like(chosen_B)
  for r in range(kids_BxK.shape[1]):  # K is small and static
    kid_B = kids_BxK[:, r]
    live_B = alive_B & ~kept_B & (kid_B >= 0)
    ok_B, valid_B, p_new, q_new = sibling(u_BxK[:, r], x_BxK[:, r], p_node_BxV, p_cur, q_left)
    p_cur = jnp.where(live_B[:, None], p_new, p_cur)
    q_left = jnp.where(live_B[:, None], q_new, q_left)
    ok_B = ok_B & valid_B & live_B
    chosen_B = jnp.where(ok_B, kid_B, chosen_B)
    rank_B = jnp.where(ok_B, r, rank_B)
    tried_B = tried_B + (valid_B & live_B).astype(tried_B.dtype)
    kept_B = kept_B | ok_B
  return chosen_B, kept_B, rank_B, tried_B, p_cur


def descend(key: jax.Array | None, tree: Tree, node_tokens_BxN: jax.Array,
            draft_probs_BxNxV: jax.Array, target_probs_BxNxV: jax.Array, sibling: SiblingRule
            ) -> tuple[TreeVerdict, jax.Array]:
  """The walk every tree verifier shares: from the root, depth by depth, test the current
  node's children with `sibling` (one rule for a whole tree) and move to the kept one; stop at
  the first node where none is kept, or at a leaf. Returns the verdict with next_token_B unset
  (-1) and the distribution the next token is drawn from: the running residual where the walk
  stopped at a rejection, p at the last node where it reached a leaf (the bonus). `key` draws
  the uniforms of the sibling tests; None gives zeros (a rule that ignores them: greedy)."""
  p = target_probs_BxNxV.astype(jnp.float32)
  q = draft_probs_BxNxV.astype(jnp.float32)
  batch, depth = node_tokens_BxN.shape[0], tree.max_depth
  shape_BxDxK = (batch, depth, tree.max_branching)
  u_BxDxK = (jnp.zeros(shape_BxDxK, jnp.float32) if key is None
             else jax.random.uniform(key, shape_BxDxK, jnp.float32))
  children_NxK = jnp.asarray(tree.children_NxK)
  node_B = jnp.zeros((batch,), jnp.int32)
  alive_B = jnp.ones((batch,), jnp.bool_)
  final_BxV = jnp.zeros_like(p[:, 0])
  cols = {name: [] for name in ("path", "tokens", "rank", "tried")}
  for d in range(depth):  # D is small and static
    kids_BxK = children_NxK[node_B]
    x_BxK = jnp.take_along_axis(node_tokens_BxN, jnp.maximum(kids_BxK, 0), axis=1)
    chosen_B, kept_B, rank_B, tried_B, p_cur = _try_siblings(
        kids_BxK, x_BxK, alive_B, _row(p, node_B), _row(q, node_B), u_BxDxK[:, d], sibling)
    final_BxV = jnp.where((alive_B & ~kept_B)[:, None], p_cur, final_BxV)
    cols["path"].append(chosen_B)
    cols["tokens"].append(jnp.where(kept_B, jnp.take_along_axis(
        node_tokens_BxN, jnp.maximum(chosen_B, 0)[:, None], axis=1)[:, 0], 0))
    cols["rank"].append(rank_B)
    cols["tried"].append(tried_B)
    node_B, alive_B = jnp.where(kept_B, chosen_B, node_B), kept_B
  final_BxV = jnp.where(alive_B[:, None], _row(p, node_B), final_BxV)
  out = {k: jnp.stack(v, axis=1).astype(jnp.int32) for k, v in cols.items()}
  verdict = TreeVerdict(
      num_accepted_B=jnp.sum(out["path"] >= 0, axis=1, dtype=jnp.int32),
      path_BxD=out["path"], tokens_BxD=out["tokens"], last_node_B=node_B,
      next_token_B=jnp.full_like(node_B, -1), rank_BxD=out["rank"], tried_BxD=out["tried"])
  return verdict, final_BxV


def recursive_rejection(key: jax.Array, tree: Tree, node_tokens_BxN: jax.Array,
                        draft_probs_BxNxV: jax.Array, target_probs_BxNxV: jax.Array
                        ) -> TreeVerdict:
  """Exact tree verification at any temperature (multi-draft speculative sampling).

  At each node on the way down, its children (drawn from q without replacement, in rank order)
  are tried in turn by `rejection_sibling` against the running residual; the first kept child
  continues to its own children. Where none is kept, the next token is a sample of the last
  residual; at a leaf, a bonus sample of p. On a chain (`Tree.chain`) this is exactly token-wise
  verification (`acceptance.tokenwise`) in law. Greedy p and q (one-hot) are handled, but a
  greedy draft proposes its top-k, not draws from a one-hot q: use `greedy` at temperature 0.
  """
  k_walk, k_next = jax.random.split(key)
  verdict, final_BxV = descend(k_walk, tree, node_tokens_BxN, draft_probs_BxNxV,
                               target_probs_BxNxV, rejection_sibling)
  return verdict.replace(next_token_B=sample(k_next, final_BxV))


def greedy(key: jax.Array, tree: Tree, node_tokens_BxN: jax.Array, draft_probs_BxNxV,
           target_probs_BxNxV: jax.Array) -> TreeVerdict:
  """Temperature 0: the longest root-to-node path whose every token is the target's argmax
  after its parent, then the target's argmax after that path. `key` and `draft_probs_BxNxV`
  are unused (may be None): the signature is the tree verifiers' contract, so a scheme picks a
  verifier by name. Siblings are compared in rank order; the first match is kept."""
  del key, draft_probs_BxNxV
  p = target_probs_BxNxV.astype(jnp.float32)
  verdict, final_BxV = descend(None, tree, node_tokens_BxN, p, p, argmax_sibling)
  return verdict.replace(next_token_B=jnp.argmax(final_BxV, axis=-1).astype(jnp.int32))


def sample_without_replacement(key: jax.Array, probs_BxV: jax.Array, k: int) -> jax.Array:
  """k distinct tokens per row, in the order of sequential draws without replacement from
  probs (Gumbel-top-k: the top k of log p + Gumbel noise), int32 [B, k]: how a node's children
  are drafted for `recursive_rejection`. Where fewer than k tokens have mass the rest are
  tokens of probability 0, which the verifier skips."""
  gumbel_BxV = jax.random.gumbel(key, probs_BxV.shape, jnp.float32)
  scores_BxV = jnp.log(probs_BxV.astype(jnp.float32)) + gumbel_BxV
  return jax.lax.top_k(scores_BxV, k)[1].astype(jnp.int32)


TREE_VERIFIERS = {"greedy": greedy, "recursive_rejection": recursive_rejection}


def get_verifier(name: str):
  if name not in TREE_VERIFIERS:
    raise ValueError(f"unknown tree verifier {name!r}; known: {sorted(TREE_VERIFIERS)}")
  return TREE_VERIFIERS[name]
