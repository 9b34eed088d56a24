"""Verifying DETERMINISTIC siblings (prompt-lookup branches): the point-mass rules for
`verify.descend`.

Why not `verify.recursive_rejection`: it assumes a node's children were drawn from the draft's q
without replacement. Lookup branches are fixed tokens chosen from the history: each is a draft
with a point-mass q = delta(x), and recursive rejection with q_i = delta(x_i) is the point-mass
rule: at a node, with p_1 = p, try the offered children x_1..x_m in rank order; keep x_i with
probability p_i(x_i); on rejection p_{i+1} = p_i with x_i zeroed, renormalised
(= norm(max(0, p_i - delta(x_i)))); if none is kept, the next token is a sample of p_{m+1}; at a
leaf, a bonus sample of its p.

Exact (by induction from the last sibling): step i emits x_i with probability p_i(x_i) and
otherwise whatever the later steps emit, which by induction follows p_{i+1}; so step i emits
p_i(x_i) delta(x_i) + (1 - p_i(x_i)) p_{i+1} = p_i, and the node emits p_1 = p. A kept x_i
continues at its own node, whose p is the target's law given x_i. The candidates may depend on
anything decoded before the node (the history) but not on this verification's draws; duplicates
are harmless (a rejected x_i has p_{i+1}(x_i) = 0).

Contract (`verify`'s, with `draft_probs_BxNxV` = `offered_BxNxV` of `lookup.node_arrays`): row n
is 1 at the tokens of node n's VALID children, 0 elsewhere; a child whose token is not offered
(an invalid node, or a token already tried there) is skipped. The sum of p over the offered
tokens is the node's acceptance probability, which the counters' beta (sum_x min(p, q)) reads.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.decoding import acceptance as acc
from specdec_jax.decoding.sampling import argmax, sample
from specdec_jax.decoding.tree import verify
from specdec_jax.decoding.tree.shape import Tree


def _at(probs_BxV: jax.Array, x_B: jax.Array) -> jax.Array:
  return jnp.take_along_axis(probs_BxV, x_B[:, None], axis=1)[:, 0]


def point_mass_sibling(u_B, x_B, p_node_BxV, p_cur_BxV, offered_BxV):
  """One deterministic sibling (`verify.SiblingRule`): keep x w.p. p_cur(x) (u < p_cur(x):
  `acceptance.accept_test` against q(x) = 1); on rejection p_cur loses x and is renormalised
  (`acceptance.residual` against delta(x)) and x leaves the offered set."""
  del p_node_BxV
  valid_B = _at(offered_BxV, x_B) > 0.0
  accept_B = valid_B & acc.accept_test(u_B, _at(p_cur_BxV, x_B), jnp.ones_like(u_B))
  reject_B = valid_B & ~accept_B
  hit_BxV = jax.nn.one_hot(x_B, p_cur_BxV.shape[-1], dtype=jnp.bool_)
  off_BxV = acc.residual(p_cur_BxV, jnp.where(hit_BxV, 1.0, 0.0))
  p_next_BxV = jnp.where(reject_B[:, None], off_BxV, p_cur_BxV)
  offered_next_BxV = jnp.where(reject_B[:, None] & hit_BxV, 0.0, offered_BxV)
  return accept_B, valid_B, p_next_BxV, offered_next_BxV


def greedy_offered_sibling(u_B, x_B, p_node_BxV, p_cur_BxV, offered_BxV):
  """Temperature 0: keep an offered x exactly when it is the target's argmax at the node."""
  del u_B
  valid_B = _at(offered_BxV, x_B) > 0.0
  accept_B = valid_B & (x_B == argmax(p_node_BxV).astype(x_B.dtype))
  return accept_B, valid_B, p_cur_BxV, offered_BxV


def point_mass(key: jax.Array, tree: Tree, node_tokens_BxN: jax.Array,
               offered_BxNxV: jax.Array, target_probs_BxNxV: jax.Array) -> verify.TreeVerdict:
  """Exact verification of deterministic siblings at any temperature (module docstring)."""
  k_walk, k_next = jax.random.split(key)
  verdict, final_BxV = verify.descend(k_walk, tree, node_tokens_BxN, offered_BxNxV,
                                      target_probs_BxNxV, point_mass_sibling)
  return verdict.replace(next_token_B=sample(k_next, final_BxV))


def greedy(key: jax.Array, tree: Tree, node_tokens_BxN: jax.Array, offered_BxNxV: jax.Array,
           target_probs_BxNxV: jax.Array) -> verify.TreeVerdict:
  """Temperature 0: the longest path of offered target argmaxes, then the argmax after it
  (`verify.greedy`, skipping invalid nodes). `key` is unused."""
  del key
  verdict, final_BxV = verify.descend(None, tree, node_tokens_BxN, offered_BxNxV,
                                      target_probs_BxNxV, greedy_offered_sibling)
  return verdict.replace(next_token_B=argmax(final_BxV))


LOOKUP_VERIFIERS = {"greedy": greedy, "point_mass": point_mass}
