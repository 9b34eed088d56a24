"""The point-mass verifiers of deterministic siblings (`decoding.tree.lookup_verify`).

Why: lookup branches are fixed tokens, not draws from a q, so `recursive_rejection` does not
apply; `point_mass` tries them in rank order against the running residual (p with every rejected
sibling removed). Its law is known exactly: a kept sibling x_i is emitted with probability p(x_i)
and then the walk at its node emits that node's p; a token no sibling offers is emitted with
probability p(y) as the correction. The JAX verifier's samples of (first token, second token if
the first was kept) must follow that law (chi-square, seeds fixed), with an invalid root child
(never kept) and an invalid node below a valid one. A faulty rule that leaves a rejected sibling in
the residual must fail the same test. The greedy verifier keeps the longest path of offered
argmaxes, skipping an invalid node even where its token is the argmax.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import acceptance as acc
from specdec_jax.decoding.tree import lookup_verify as lv
from specdec_jax.decoding.tree import verify
from specdec_jax.decoding.tree.lookup import lookup_tree, node_arrays
from specdec_jax.testing import chi_square_gof

V = 8
NUM_SAMPLES = 200_000
TREE = lookup_tree(3, 2)  # nodes: 1 -> 2 (branch 0), 3 -> 4 (branch 1), 5 -> 6 (branch 2)
BRANCH_TOKENS = np.array([[2, 3], [5, 3], [7, 1]], np.int32)
BRANCH_VALID = np.array([[True, True], [True, False], [False, False]])


def _inputs(batch, seed=0):
  rng = np.random.default_rng(seed)
  p_NxV = rng.dirichlet(np.full(V, 0.7), size=TREE.num_nodes).astype(np.float32)
  tokens, offered = node_arrays(jnp.full((batch,), 4, jnp.int32),
                                jnp.broadcast_to(BRANCH_TOKENS, (batch, 3, 2)),
                                jnp.broadcast_to(BRANCH_VALID, (batch, 3, 2)), V)
  return tokens, offered, jnp.broadcast_to(p_NxV, (batch,) + p_NxV.shape), p_NxV


def exact_law(p_NxV):
  """Probability of each outcome: ('first', y) (y emitted, nothing kept) for y no valid root child
  offers, ('kept', node, z) (the child at `node` kept, then z emitted at its node)."""
  law = {}
  offered_root = {1: 2, 3: 5}  # valid root children: node -> token
  for y in range(V):
    if y not in offered_root.values():
      law[("first", y)] = p_NxV[0, y]
  for node, x in offered_root.items():
    for z in range(V):
      law[("kept", node, z)] = p_NxV[0, x] * p_NxV[node, z]
  return law


def _outcomes(verdict):
  n = np.asarray(verdict.num_accepted_B)
  path = np.asarray(verdict.path_BxD)
  toks = np.asarray(verdict.tokens_BxD)
  nxt = np.asarray(verdict.next_token_B)
  second = np.where(n >= 2, toks[:, 1], nxt)
  return [("first", int(y)) if k == 0 else ("kept", int(node), int(z))
          for k, y, node, z in zip(n, nxt, path[:, 0], second)]


def _pvalue(verifier, seed=0):
  tokens, offered, p, p_NxV = _inputs(NUM_SAMPLES)
  verdict = jax.jit(verifier, static_argnums=1)(jax.random.key(seed), TREE, tokens, offered, p)
  assert not np.any(np.asarray(verdict.path_BxD)[:, 0] == 5)  # the invalid branch is never kept
  law = exact_law(p_NxV.astype(np.float64))
  keys = sorted(law, key=str)
  index = {k: i for i, k in enumerate(keys)}
  got = _outcomes(verdict)
  if not all(g in index for g in got):  # an outcome of probability 0 (a rejected sibling again)
    return 0.0
  counts = np.bincount([index[g] for g in got], minlength=len(keys))
  probs = np.array([law[k] for k in keys])
  return chi_square_gof(counts, probs / probs.sum())[2]


def test_point_mass_follows_the_exact_law():
  pvalue = _pvalue(lv.point_mass)
  assert pvalue > 1e-3, f"p={pvalue:.2e}"


def _sibling_kept_in_residual(u_B, x_B, p_node_BxV, p_cur_BxV, offered_BxV):
  """The fault: a rejected sibling stays in the running distribution (p_cur unchanged)."""
  accept_B, valid_B, _, offered_next = lv.point_mass_sibling(u_B, x_B, p_node_BxV, p_cur_BxV,
                                                            offered_BxV)
  return accept_B, valid_B, p_cur_BxV, offered_next


def test_sibling_left_in_the_residual_is_detected():
  def faulty(key, tree, tokens, offered, p):
    k_walk, k_next = jax.random.split(key)
    verdict, final = verify.descend(k_walk, tree, tokens, offered, p, _sibling_kept_in_residual)
    return verdict.replace(next_token_B=jax.random.categorical(k_next, jnp.log(final)))
  assert _pvalue(faulty) < 1e-6


def test_point_mass_sibling_is_rejection_with_a_one_hot_q():
  """The rule is `acceptance.residual` against delta(x): p with x removed, renormalised."""
  p = jnp.asarray([[0.5, 0.3, 0.2]])
  _, _, p_next, offered = lv.point_mass_sibling(jnp.asarray([0.9]), jnp.asarray([0]), p, p,
                                                jnp.asarray([[1.0, 1.0, 0.0]]))
  np.testing.assert_allclose(np.asarray(p_next), [[0.0, 0.6, 0.4]], rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(offered), [[0.0, 1.0, 0.0]])
  np.testing.assert_allclose(np.asarray(acc.residual(p, jnp.asarray([[1.0, 0, 0]]))), p_next)


@pytest.mark.parametrize("argmax_root, argmax_3, want", [
    (5, 3, (1, [3, -1], 3)),   # rank 1 kept; its child (token 3, the argmax) is invalid: skipped
    (2, 0, (2, [1, 2], 6)),    # branch 0 kept whole; the bonus is node 2's argmax
    (7, 0, (0, [-1, -1], 7)),  # the invalid branch's token is the root's argmax: nothing kept
])
def test_greedy_keeps_offered_argmaxes_only(argmax_root, argmax_3, want):
  tokens, offered, _, _ = _inputs(1)
  p = np.full((1, TREE.num_nodes, V), 0.01, np.float32)
  for node, top in ((0, argmax_root), (1, 3), (2, 6), (3, argmax_3), (4, 3)):
    p[0, node, top] = 1.0
  verdict = lv.greedy(None, TREE, tokens, offered, jnp.asarray(p))
  n, path, nxt = want
  assert int(verdict.num_accepted_B[0]) == n
  np.testing.assert_array_equal(np.asarray(verdict.path_BxD)[0], path)
  assert int(verdict.next_token_B[0]) == nxt
