"""Tree verifiers (`decoding.tree.verify`): greedy against brute force, recursive rejection
sampling against an exact reference law, and that law against the target's.

Why these tests: a wrong sibling residual shifts the output law a little and nothing crashes. So
(1) a NumPy reference computes the EXACT law of one verification of a given drafted tree (where
the walk stops and which token follows), written from the algorithm's definition, loop by loop;
(2) every draft tree a small vocabulary allows is enumerated with its probability under
drafting without replacement, and the resulting law of the first D + 1 emitted tokens must equal
the target's joint law to float precision (with degenerate rows: p == q, zeros in q, one-hot p,
and a draft support smaller than the branching); (3) the JAX verifier's samples must follow the
reference law (chi-square). The faulty rule (`sibling_residual_from_p`) is shown biased exactly.
The whole sampled pipeline at T > 0 with top-k / top-p is tested in test_tree_distribution.py.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specdec_jax.decoding import acceptance as acc
from specdec_jax.decoding.tree import Tree
from specdec_jax.decoding.tree import verify as tv
from specdec_jax.testing import chi_square_gof, faulty_tree_verifier, sibling_residual_from_p


# ---- the NumPy reference: the exact law of one verification -----------------------------------
def _residual(p, q):
  r = np.maximum(p - q, 0.0)
  return r / r.sum() if r.sum() > acc.RESIDUAL_EPS else p


def reference_law(tree, tokens_N, q_NxV, p_NxV, fault=False):
  """law[n, y]: probability that the walk keeps the path to node n and then emits y.

  fault=True: the `sibling_residual_from_p` bug (a sibling after a rejection is tested against
  the node's p, not the running residual; the residual chain itself is kept)."""
  law = np.zeros(p_NxV.shape)

  def visit(n, reach):
    p_cur, q_left = p_NxV[n].astype(np.float64), q_NxV[n].astype(np.float64).copy()
    for kid in tree.children_NxK[n]:
      x = tokens_N[kid]
      if kid < 0 or q_left[x] <= 0.0:
        continue
      q_i = q_left / q_left.sum()
      p_test = p_NxV[n] if fault else p_cur
      a = 0.0 if p_test[x] <= 0.0 else min(1.0, p_test[x] / q_i[x])
      if a > 0.0:
        visit(kid, reach * a)
      reach *= 1.0 - a
      p_cur, q_left[x] = _residual(p_cur, q_i), 0.0
    law[n] += reach * p_cur

  visit(0, 1.0)
  return law


def ordered_draws(q, k):
  """Every ordered draw of k tokens without replacement from q, with its probability. Once q's
  support is used up, the remaining slots take the smallest unused tokens (what follows is
  skipped by the verifier, so any fill gives the same law)."""
  out = []
  for xs in itertools.permutations(range(len(q)), k):
    w, used = 1.0, set()
    for x in xs:
      left = 1.0 - sum(q[u] for u in used)
      if left > 1e-12:
        w *= q[x] / left
      else:
        w *= float(x == min(set(range(len(q))) - used))
      used.add(x)
    if w > 0.0:
      out.append((xs, w))
  return out


class Tables:
  """Random processed p(.|prefix), q(.|prefix) for every prefix up to `depth` tokens."""

  def __init__(self, vocab, depth, seed, degenerate=True, q_top=None):
    rng = np.random.default_rng(seed)
    self.vocab, self.p, self.q = vocab, {}, {}
    for k in range(depth + 1):
      for prefix in itertools.product(range(vocab), repeat=k):
        p, q = rng.dirichlet(np.full(vocab, 0.5)), rng.dirichlet(np.full(vocab, 0.5))
        kind = rng.integers(5) if degenerate else 0
        if kind == 1:
          q = p.copy()
        elif kind == 2:
          q[rng.integers(vocab)] = 0.0
        elif kind == 3:
          p = np.eye(vocab)[rng.integers(vocab)]
        if q_top is not None:  # the draft's top-k: a support smaller than the branching
          q = np.where(q >= np.sort(q)[-q_top], q, 0.0)
        self.p[prefix], self.q[prefix] = p / p.sum(), q / q.sum()

  def target_joint(self, length):
    out = np.zeros([self.vocab] * length)
    for s in itertools.product(range(self.vocab), repeat=length):
      out[s] = np.prod([self.p[s[:j]][s[j]] for j in range(length)])
    return out

  def instance(self, tree, draws):
    """tokens_N, q_NxV, p_NxV of a drafted tree (node prefixes from the tree's paths)."""
    tokens = np.zeros(tree.num_nodes, np.int64)
    for n, x in draws.items():
      tokens[n] = x
    prefix = [tuple(int(tokens[m]) for m in tree.path_to(n)[1:]) for n in range(tree.num_nodes)]
    return (tokens, np.array([self.q[s] for s in prefix]), np.array([self.p[s] for s in prefix]),
            prefix)


def enumerated_output_law(tables, branching, fault=False):
  """Exact law of the first D + 1 emitted tokens: every draft tree of `branching` (depth 2)
  weighted by its drafting probability, one verification, then target sampling to fill."""
  tree = Tree.from_branching(branching)
  v, length = tables.vocab, len(branching) + 1
  out = np.zeros([v] * length)
  kids = tree.children_NxK
  for root_xs, w_root in ordered_draws(tables.q[()], branching[0]):
    per_child = [ordered_draws(tables.q[(x,)], branching[1]) for x in root_xs]
    for combo in itertools.product(*per_child):
      draws = {int(kids[0, i]): x for i, x in enumerate(root_xs)}
      w = w_root
      for i, (xs, wc) in enumerate(combo):
        w *= wc
        draws.update({int(kids[kids[0, i], j]): x for j, x in enumerate(xs)})
      tokens, q, p, prefix = tables.instance(tree, draws)
      law = reference_law(tree, tokens, q, p, fault)
      for n, y in zip(*np.nonzero(law)):
        _fill(out, tables, prefix[n] + (int(y),), w * law[n, y])
  return out


def _fill(out, tables, head, weight):
  for tail in itertools.product(range(tables.vocab), repeat=out.ndim - len(head)):
    s = head + tail
    out[s] += weight * np.prod([tables.p[s[:j]][s[j]] for j in range(len(head), len(s))])


# ---- the reference law is exact; the faulty one is not ------------------------------------------
@pytest.mark.parametrize("vocab,branching,seed,q_top", [
    (3, (3, 2), 0, None), (4, (2, 2), 1, None), (4, (3, 2), 2, 2), (3, (2, 1), 3, None)])
def test_reference_law_is_the_target(vocab, branching, seed, q_top):
  """Drafting without replacement + recursive rejection + target fill = the target, exactly."""
  tables = Tables(vocab, len(branching), seed, q_top=q_top)
  got = enumerated_output_law(tables, branching)
  np.testing.assert_allclose(got, tables.target_joint(len(branching) + 1), atol=1e-9)


def test_faulty_reference_law_is_biased():
  """Testing the next sibling against p instead of the residual shifts the law (TV > 0.01)."""
  tables = Tables(4, 2, seed=5, degenerate=False)
  want = tables.target_joint(3)
  got = enumerated_output_law(tables, (3, 1), fault=True)
  assert got.sum() == pytest.approx(1.0, abs=1e-9)
  assert 0.5 * np.abs(got - want).sum() > 0.01


def test_chain_reference_law_is_tokenwise():
  """On a chain, the tree law equals token-wise verification's (Leviathan's stop law)."""
  rng = np.random.default_rng(3)
  tree, v = Tree.chain(3), 5
  tokens = rng.integers(v, size=4)
  q = rng.dirichlet(np.ones(v), size=4)
  p = rng.dirichlet(np.ones(v), size=4)
  law = reference_law(tree, tokens, q, p)
  reach = 1.0
  for i in range(4):
    beta = 1.0 if i == 3 else min(1.0, p[i, tokens[i + 1]] / q[i, tokens[i + 1]])
    nxt = p[i] if i == 3 else _residual(p[i], q[i])
    np.testing.assert_allclose(law[i], reach * (1.0 - beta if i < 3 else 1.0) * nxt, atol=1e-12)
    reach *= beta


# ---- the JAX verifier follows the reference law -------------------------------------------------
def _degenerate_instance(tree, v, seed):
  """One drafted tree with every corner at once: the root's q has support 2 < its 3 children
  (the third child is a q = 0 token, skipped), node 1's p == q, node 2's p is one-hot on its
  second child's token (the first is rejected for sure, the second then kept for sure), node
  4's p is 0 at its first child's token (with depth 3); elsewhere random p and q, children
  drawn from q."""
  rng = np.random.default_rng(seed)
  n = tree.num_nodes
  p = rng.dirichlet(np.full(v, 2.0), size=n)
  q = rng.dirichlet(np.full(v, 2.0), size=n)
  tokens = np.zeros(n, np.int64)
  for node in range(n):
    kids = [k for k in tree.children_NxK[node] if k >= 0]
    tokens[kids] = rng.choice(v, size=len(kids), replace=False, p=q[node])
  q[0] = [0.6, 0.4, 0.0, 0.0, 0.0]
  p[0] = [0.3, 0.45, 0.1, 0.1, 0.05]
  tokens[tree.children_NxK[0]] = [0, 1, 3]
  q[1] = p[1]
  p[2] = np.eye(v)[tokens[tree.children_NxK[2, 1]]]
  if tree.children_NxK[4, 0] >= 0:
    p[4, tokens[tree.children_NxK[4, 0]]] = 0.0
    p[4] /= p[4].sum()
  return tokens.astype(np.int32), q.astype(np.float32), p.astype(np.float32)


@pytest.mark.parametrize("branching,seed", [((3, 2), 0), ((3, 2, 2), 1)])
def test_sampler_matches_reference_law(branching, seed):
  """200k verifications of one drafted tree: (last node, next token) follows the exact law."""
  tree, v, b = Tree.from_branching(branching), 5, 200_000
  tokens, q, p = _degenerate_instance(tree, v, seed)
  law = reference_law(tree, tokens, q.astype(np.float64), p.astype(np.float64))
  rep = lambda a: jnp.asarray(np.broadcast_to(a, (b, *a.shape)))  # noqa: E731
  verdict = jax.jit(tv.recursive_rejection, static_argnums=1)(
      jax.random.key(seed), tree, rep(tokens), rep(q), rep(p))
  counts = np.bincount(np.asarray(verdict.last_node_B) * v + np.asarray(verdict.next_token_B),
                       minlength=law.size)
  _, dof, pvalue = chi_square_gof(counts, law)
  assert dof >= 8 and pvalue > 1e-3, (dof, pvalue)
  _check_verdict(tree, tokens, verdict)


def test_sampler_with_the_faulty_rule_misses_the_reference_law():
  """The same check has power: the `sibling_residual_from_p` rule is rejected outright."""
  tree, v, b = Tree.from_branching((3, 2)), 5, 200_000
  tokens, q, p = _degenerate_instance(tree, v, 0)
  law = reference_law(tree, tokens, q.astype(np.float64), p.astype(np.float64))
  rep = lambda a: jnp.asarray(np.broadcast_to(a, (b, *a.shape)))  # noqa: E731
  verdict = jax.jit(faulty_tree_verifier(sibling_residual_from_p), static_argnums=1)(
      jax.random.key(0), tree, rep(tokens), rep(q), rep(p))
  counts = np.bincount(np.asarray(verdict.last_node_B) * v + np.asarray(verdict.next_token_B),
                       minlength=law.size)
  assert chi_square_gof(counts, law)[2] < 1e-12
  faulty_law = reference_law(tree, tokens, q.astype(np.float64), p.astype(np.float64), fault=True)
  assert chi_square_gof(counts, faulty_law)[2] > 1e-3  # and it is the fault the reference models


def _check_verdict(tree, tokens_N, verdict):
  """Every field agrees with the path it describes."""
  path, n = np.asarray(verdict.path_BxD), np.asarray(verdict.num_accepted_B)
  last = np.asarray(verdict.last_node_B)
  d_D = np.arange(tree.max_depth)
  assert np.all((path >= 0) == (d_D[None, :] < n[:, None]))
  np.testing.assert_array_equal(tree.depths_N[last], n)
  for b in np.unique(last):  # each distinct end node once
    row = int(np.flatnonzero(last == b)[0])
    want = tree.path_to(int(b))[1:]
    np.testing.assert_array_equal(path[row, :len(want)], want)
    np.testing.assert_array_equal(np.asarray(verdict.tokens_BxD)[row, :len(want)],
                                  tokens_N[list(want)])
    np.testing.assert_array_equal(np.asarray(verdict.rank_BxD)[row, :len(want)],
                                  tree.ranks_N[list(want)])
  rank, tried = np.asarray(verdict.rank_BxD), np.asarray(verdict.tried_BxD)
  assert np.all(np.where(rank >= 0, tried >= rank + 1, True))
  assert np.all(np.where(d_D[None, :] > n[:, None], tried == 0, True))


def test_chain_tree_matches_tokenwise_in_law():
  """A chain tree through the JAX verifier and `acceptance.tokenwise`: same (n, next) law."""
  rng = np.random.default_rng(7)
  g, v, b = 3, 4, 100_000
  tokens = rng.integers(v, size=g + 1).astype(np.int32)
  q = rng.dirichlet(np.ones(v), size=g + 1).astype(np.float32)
  p = rng.dirichlet(np.ones(v), size=g + 1).astype(np.float32)
  rep = lambda a: jnp.asarray(np.broadcast_to(a, (b, *a.shape)))  # noqa: E731
  verdict = jax.jit(tv.recursive_rejection, static_argnums=1)(
      jax.random.key(1), Tree.chain(g), rep(tokens), rep(q), rep(p))
  n_B, y_B = jax.jit(acc.tokenwise)(jax.random.key(2), rep(tokens[1:]), rep(q[:g]), rep(p))
  a = np.bincount(np.asarray(verdict.num_accepted_B) * v + np.asarray(verdict.next_token_B),
                  minlength=(g + 1) * v)
  c = np.bincount(np.asarray(n_B) * v + np.asarray(y_B), minlength=(g + 1) * v)
  keep = (a + c) > 0
  assert stats.chi2_contingency(np.stack([a[keep], c[keep]]))[1] > 1e-3


def test_sample_without_replacement_law():
  """Sequential draws without replacement give ordered pairs with P(x1, x2) = q(x1) q(x2) /
  (1 - q(x1)), the law Gumbel-top-k gave."""
  q = np.array([0.4, 0.3, 0.2, 0.1, 0.0], np.float32)
  b = 100_000
  xs = np.asarray(jax.jit(tv.sample_without_replacement, static_argnums=2)(
      jax.random.key(0), jnp.asarray(np.broadcast_to(q, (b, 5))), 3))
  assert np.all(xs[:, 0] != xs[:, 1]) and np.all(xs[:, 1] != xs[:, 2])
  assert np.all(np.where(xs[:, 2] == 4, True, q[xs[:, 2]] > 0))
  qd = q.astype(np.float64)
  law = np.array([[qd[i] * qd[j] / (1 - qd[i]) if i != j else 0.0 for j in range(5)]
                  for i in range(5)])
  counts = np.bincount(xs[:, 0] * 5 + xs[:, 1], minlength=25)
  assert chi_square_gof(counts, law)[2] > 1e-3


# ---- greedy -------------------------------------------------------------------------------------
def _brute_greedy(tree, tokens_N, argmax_N):
  """The deepest node whose whole path matches the target's argmax (siblings are distinct)."""
  best = 0
  for node in range(1, tree.num_nodes):
    path = tree.path_to(node)
    if all(tokens_N[c] == argmax_N[par] for par, c in zip(path[:-1], path[1:])):
      best = node if tree.depths_N[node] > tree.depths_N[best] else best
  return best


@pytest.mark.parametrize("parents", [Tree.from_branching((3, 2)).parents,
                                     Tree.from_branching((4, 2, 1)).parents,
                                     (-1, 0, 0, 1, 1, 1, 2, 4)])
def test_greedy_against_brute_force(parents):
  tree, v, b = Tree(parents), 7, 512
  rng = np.random.default_rng(len(parents))
  tokens = np.zeros((b, tree.num_nodes), np.int32)
  for node in range(tree.num_nodes):  # distinct tokens among siblings, as a top-k draft gives
    kids = [k for k in tree.children_NxK[node] if k >= 0]
    for row in range(b):
      tokens[row, kids] = rng.permutation(v)[:len(kids)]
  # The target agrees with some child often: its argmax is a random child's token 70% of the time.
  argmax = rng.integers(v, size=(b, tree.num_nodes))
  for node in range(tree.num_nodes):
    kids = [k for k in tree.children_NxK[node] if k >= 0]
    if kids:
      pick = rng.choice(kids, size=b)
      argmax[:, node] = np.where(rng.random(b) < 0.7, tokens[np.arange(b), pick], argmax[:, node])
  logits = rng.normal(size=(b, tree.num_nodes, v))
  logits[np.arange(b)[:, None], np.arange(tree.num_nodes)[None, :], argmax] = 10.0
  p = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)  # not one-hot: argmax is read
  verdict = jax.jit(tv.greedy, static_argnums=1)(None, tree, jnp.asarray(tokens), None, p)
  want_last = np.array([_brute_greedy(tree, tokens[r], argmax[r]) for r in range(b)])
  np.testing.assert_array_equal(verdict.last_node_B, want_last)
  np.testing.assert_array_equal(verdict.next_token_B, argmax[np.arange(b), want_last])
  assert 0 < np.mean(np.asarray(verdict.num_accepted_B) == tree.max_depth) < 1
  _check_verdict(tree, tokens[0], jax.tree.map(lambda x: x[:1], verdict))


def test_greedy_equals_recursive_rejection_on_one_hot_chains():
  """One-hot p and q on a chain: both tree verifiers and token-wise keep the same prefix."""
  rng = np.random.default_rng(0)
  b, g, v = 64, 4, 5
  x = rng.integers(v, size=(b, g)).astype(np.int32)
  tokens = np.concatenate([np.zeros((b, 1), np.int32), x], axis=1)
  q = jax.nn.one_hot(np.concatenate([x, x[:, :1]], axis=1), v)
  agree = rng.random((b, g)) < 0.7
  p_tok = np.concatenate([np.where(agree, x, (x + 1) % v), rng.integers(v, size=(b, 1))], axis=1)
  p = jax.nn.one_hot(p_tok, v)
  tree = Tree.chain(g)
  gv = jax.jit(tv.greedy, static_argnums=1)(None, tree, jnp.asarray(tokens), None, p)
  rv = jax.jit(tv.recursive_rejection, static_argnums=1)(jax.random.key(0), tree,
                                                         jnp.asarray(tokens), q, p)
  n_t, y_t = acc.tokenwise(jax.random.key(3), jnp.asarray(x), q[:, :g], p)
  for verdict in (gv, rv):
    np.testing.assert_array_equal(verdict.num_accepted_B, n_t)
    np.testing.assert_array_equal(verdict.next_token_B, y_t)


def test_get_verifier():
  assert tv.get_verifier("greedy") is tv.greedy
  with pytest.raises(ValueError, match="unknown tree verifier"):
    tv.get_verifier("nope")
