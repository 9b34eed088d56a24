"""Trees at temperature 0 as token ids: the general tree path's paths, tokens, counters and state,
bit for bit, without its vocabulary-wide rows.

Why: at temperature 0 every row the general path carries is one-hot (q at an expanded node is
the draft's argmax, p the target's), so the greedy verifier compares each child's token with the
target's argmax at its parent, beta = sum_x min(p, q) at a path node is 1 where the argmaxes
agree and 0 elsewhere, and the row kept for a pending draft is one-hot at the next token. [B, N]
argmax tables instead of [B, N, V] rows drop the one-hot rows, the walk's row gathers and the
min(p, q) sums: the glue the chain's token-id path removes (`speculative`), larger here as a
tree drafts more nodes per target call than a chain.

Taken by `scheme.TreeScheme` (any drafter) when `uses_token_path`: temperature 0 and a named
verifier ('auto' or 'greedy'). A verifier passed as a function keeps the general path (the
tests compare the two paths that way, with `verify.greedy` itself).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from specdec_jax.decoding import state as st
from specdec_jax.decoding.sampling import SamplingConfig, argmax
from specdec_jax.decoding.speculative import greedy_bonus_beta
from specdec_jax.decoding.tree.shape import Tree
from specdec_jax.decoding.tree.verify import TreeVerdict, Walk

TOKEN_PATH_VERIFIERS = ("auto", "greedy")


def uses_token_path(verifier: Any, sampling: SamplingConfig) -> bool:
  """Whether a tree scheme's iteration carries token ids (see the module docstring)."""
  return (sampling.greedy and isinstance(verifier, str)
          and verifier in TOKEN_PATH_VERIFIERS)


def logits_argmax(logits_BxNxV: jax.Array) -> jax.Array:
  """The token `process_logits` puts its one-hot at, temperature 0: int32 [B, N]."""
  return argmax(logits_BxNxV.astype(jnp.float32))


def _at(table_BxN: jax.Array, node_B: jax.Array) -> jax.Array:
  return jnp.take_along_axis(table_BxN, node_B[:, None], axis=1)[:, 0]


def _at_node(table_BxNxK: jax.Array, node_B: jax.Array) -> jax.Array:
  return jnp.take_along_axis(table_BxNxK, node_B[:, None, None], axis=1)[:, 0]


def argmax_walk(tree: Tree | Walk, node_tokens_BxN: jax.Array, target_BxN: jax.Array
                ) -> TreeVerdict:
  """`verify.greedy`'s verdict from the target's argmax at each node (int32 [B, N]): at each
  depth the first drawn child (rank order) whose token is the target's argmax there is kept (a
  kept pruned child ends the walk); `tried` counts the drawn children tested up to it. The next
  token is the target's argmax at the last kept node in every case (also after a kept pruned
  child, whose token is that argmax)."""
  walk = tree if isinstance(tree, Walk) else Walk.of_tree(tree, node_tokens_BxN)
  node_B = jnp.zeros(node_tokens_BxN.shape[:1], jnp.int32)
  alive_B = jnp.ones(node_B.shape, jnp.bool_)
  pruned_B = jnp.zeros_like(alive_B)
  cols = {name: [] for name in ("path", "tokens", "rank", "tried")}
  for _ in range(walk.max_depth):  # D is small and static
    kids_BxK, x_BxK = _at_node(walk.children_BxNxK, node_B), _at_node(walk.tokens_BxNxK, node_B)
    live_BxK = _at_node(walk.drawn_BxNxK, node_B) & alive_B[:, None]
    match_BxK = live_BxK & (x_BxK == _at(target_BxN, node_B)[:, None])
    kept_B = jnp.any(match_BxK, axis=1)
    first_B = jnp.argmax(match_BxK, axis=1).astype(jnp.int32)  # the first match (if any)
    before_BxK = jnp.cumsum(match_BxK, axis=1) - match_BxK  # matches at lower ranks
    chosen_B = jnp.where(kept_B, _at(kids_BxK, first_B), -1)
    token_B = jnp.where(kept_B, _at(x_BxK, first_B), 0)
    moved_B = kept_B & (chosen_B >= 0)
    cols["path"].append(jnp.where(moved_B, chosen_B, -1))
    cols["tokens"].append(jnp.where(moved_B, token_B, 0))
    cols["rank"].append(jnp.where(kept_B, first_B, -1))
    cols["tried"].append(jnp.sum(live_BxK & (before_BxK == 0), axis=1))
    pruned_B = pruned_B | (kept_B & ~moved_B)
    node_B, alive_B = jnp.where(moved_B, chosen_B, node_B), moved_B
  out = {k: jnp.stack(v, axis=1).astype(jnp.int32) for k, v in cols.items()}
  return TreeVerdict(
      num_accepted_B=jnp.sum(out["path"] >= 0, axis=1, dtype=jnp.int32),
      path_BxD=out["path"], tokens_BxD=out["tokens"], last_node_B=node_B,
      next_token_B=_at(target_BxN, node_B), rank_BxD=out["rank"], tried_BxD=out["tried"],
      pruned_B=pruned_B)


def path_beta(state: st.DecodeState, verdict: TreeVerdict, target_BxN: jax.Array,
              draft_BxN: jax.Array, bonus_draft_B: jax.Array | None) -> jax.Array:
  """`commit.row_beta`'s beta_BxD1 from argmax tables: column 0 at the previous call's bonus
  position (`speculative.greedy_bonus_beta`), column d + 1 at the root and the path's nodes by
  depth d (past the path the root): 1 where the draft's argmax (`draft_BxN`, -1 at nodes it did
  not expand, whose q rows are zero) is the target's."""
  depth = verdict.path_BxD.shape[1]
  nodes_BxD = jnp.concatenate([jnp.zeros_like(verdict.path_BxD[:, :1]),
                               jnp.maximum(verdict.path_BxD[:, :depth - 1], 0)], axis=1)
  agree_BxD = (jnp.take_along_axis(draft_BxN, nodes_BxD, axis=1)
               == jnp.take_along_axis(target_BxN, nodes_BxD, axis=1))
  return jnp.concatenate([greedy_bonus_beta(state, bonus_draft_B)[:, None],
                          agree_BxD.astype(jnp.float32)], axis=1)


def next_row(verdict: TreeVerdict, vocab: int) -> jax.Array:
  """The target's processed row at the last kept node (kept for a pending draft): one-hot at the
  next token, which is the target's argmax there."""
  return jax.nn.one_hot(verdict.next_token_B, vocab, dtype=jnp.float32)
