"""Tree speculative sampling must reproduce the target's processed distribution exactly.

Why: the promise of `tree.verify.recursive_rejection` is the promise of the whole method. Here
the full pipeline of one tree iteration runs in JAX on context-dependent random tables (a small
vocabulary, p(.|prefix) and q(.|prefix) for every prefix, processed by the repository's own
`sampling.process_logits` with temperature, top-k and top-p): draft a (3, 2) tree from q without
replacement (sequential draws), verify it, then fill the rest of the first three tokens from the
target. The joint law of those three tokens (every depth of the tree and the bonus) is tested
against the exact product of the target's processed rows by a chi-square goodness-of-fit test
(`testing.chi_square_gof`, as the chain's test_distribution.py does). Seeds are fixed, so the
test is deterministic; 1e-3 is the false-alarm rate it would have with a fresh seed. The faults
`sibling_residual_from_p` (the next sibling tested against p, not the residual) and
`sibling_q_keeps_tried` (a rejected token left in q) must fail it at the same sample size. With
top-k 2 the draft's support is smaller than the root's three children, so the verifier's
skipping of q = 0 draws is exercised too.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.sampling import SamplingConfig, process_logits, sample
from specdec_jax.decoding.tree import Tree
from specdec_jax.decoding.tree import verify as tv
from specdec_jax.testing import (chi_square_gof, faulty_tree_verifier, sibling_q_keeps_tried,
                                 sibling_residual_from_p)

V = 6
LENGTH = 3  # tokens compared: depth 1, depth 2 and the bonus of a depth-2 tree
NUM_SAMPLES = 200_000
TREE = Tree.from_branching((3, 2))
CONFIGS = {
    "t1": SamplingConfig(temperature=1.0),
    "t0.7_topk2": SamplingConfig(temperature=0.7, top_k=2),
    "topp0.8": SamplingConfig(temperature=1.0, top_p=0.8),
    "t1.3_topk4_topp0.9": SamplingConfig(temperature=1.3, top_k=4, top_p=0.9),
}


def _logit_tables(seed):
  """Raw logits of target and draft for every prefix of 0..LENGTH-1 tokens: [V^k, V] each. The
  draft is the target plus noise, so their supports overlap after top-k / top-p (a draft
  disjoint from the target rejects every child and tests nothing of the tree)."""
  rng = np.random.default_rng(seed)
  target = [1.5 * rng.normal(size=(V ** k, V)) for k in range(LENGTH)]
  draft = [t + 1.5 * rng.normal(size=t.shape) for t in target]
  return [[jnp.asarray(t, jnp.float32) for t in ts] for ts in (target, draft)]


def _processed(tables, sampling):
  return [process_logits(t, sampling) for t in tables]


def exact_joint(p_tables):
  """The target's law of the first LENGTH tokens, [V] * LENGTH, float64."""
  rows = [np.asarray(t, np.float64) for t in p_tables]
  joint = rows[0][0]
  for k in range(1, LENGTH):
    joint = joint[..., None] * rows[k].reshape((V,) * k + (V,))
  return joint


def _flat(prefix_BxK):
  """Row of a prefix in a [V^k, V] table."""
  idx = jnp.zeros(prefix_BxK.shape[:1], jnp.int32)
  for j in range(prefix_BxK.shape[1]):
    idx = idx * V + prefix_BxK[:, j]
  return idx


def draft_tree(key, q_tables, tree, batch):
  """Node tokens [B, N] and each node's prefix (the path's tokens) as a table row [B, N]:
  every node with children draws them from q at its prefix without replacement, rank order."""
  tokens = [jnp.zeros((batch,), jnp.int32) for _ in range(tree.num_nodes)]
  for node in range(tree.num_nodes):
    kids = [int(k) for k in tree.children_NxK[node] if k >= 0]
    if kids:
      path = tree.path_to(node)[1:]
      prefix_BxK = jnp.stack([tokens[m] for m in path], axis=1) if path else None
      row_B = _flat(prefix_BxK) if path else jnp.zeros((batch,), jnp.int32)
      q_BxV = q_tables[len(path)][row_B]
      xs = tv.sample_without_replacement(jax.random.fold_in(key, node), q_BxV, len(kids))
      for r, kid in enumerate(kids):
        tokens[kid] = xs[:, r]
  return jnp.stack(tokens, axis=1)


def node_rows(tables, tree, tokens_BxN):
  """Each node's table row (the distribution after its path) -> [B, N, V]."""
  out = []
  for node in range(tree.num_nodes):
    path = list(tree.path_to(node)[1:])
    row_B = (_flat(tokens_BxN[:, path]) if path
             else jnp.zeros(tokens_BxN.shape[:1], jnp.int32))
    out.append(tables[len(path)][row_B])
  return jnp.stack(out, axis=1)


def one_iteration(key, p_tables, q_tables, verifier, batch):
  """Draft, verify, fill: the first LENGTH emitted tokens [B, LENGTH]."""
  k_draft, k_verify, k_fill = jax.random.split(key, 3)
  tokens_BxN = draft_tree(k_draft, q_tables, TREE, batch)
  verdict = verifier(k_verify, TREE, tokens_BxN, node_rows(q_tables, TREE, tokens_BxN),
                     node_rows(p_tables, TREE, tokens_BxN))
  n_B = verdict.num_accepted_B
  emitted = []
  for j in range(LENGTH):
    kept = verdict.tokens_BxD[:, j] if j < TREE.max_depth else jnp.zeros_like(n_B)
    fresh = jnp.zeros_like(n_B)
    if j > 0:  # past the verified tokens: the target, at the emitted prefix
      p_BxV = p_tables[j][_flat(jnp.stack(emitted, axis=1))]
      fresh = sample(jax.random.fold_in(k_fill, j), p_BxV)
    emitted.append(jnp.where(j < n_B, kept, jnp.where(j == n_B, verdict.next_token_B, fresh)))
  return jnp.stack(emitted, axis=1)


def _counts(tokens_BxL):
  flat = np.ravel_multi_index(np.asarray(tokens_BxL).T, (V,) * LENGTH)
  return np.bincount(flat, minlength=V ** LENGTH)


def _pvalue(sampling, verifier, seed=1):
  p_raw, q_raw = _logit_tables(seed)
  p_tables, q_tables = _processed(p_raw, sampling), _processed(q_raw, sampling)
  # The tables go in as arguments, not constants: XLA would fold the draws' running sums over
  # the constant root rows at compile time (seconds per [NUM_SAMPLES, V] sum).
  run = jax.jit(lambda k, p, q: one_iteration(k, p, q, verifier, NUM_SAMPLES))
  counts = _counts(run(jax.random.key(seed + 100), p_tables, q_tables))
  probs = exact_joint(p_tables).ravel()
  stat, dof, pvalue = chi_square_gof(counts, probs)
  tv_dist = 0.5 * np.abs(counts / counts.sum() - probs).sum()
  return pvalue, f"chi2={stat:.1f} dof={dof} p={pvalue:.3g} TV={tv_dist:.4f}"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tree_matches_exact_target_distribution(name):
  pvalue, msg = _pvalue(CONFIGS[name], tv.recursive_rejection)
  assert pvalue > 1e-3, f"{name}: {msg}"


FAULTS = {"sibling_residual_from_p": sibling_residual_from_p,
          "sibling_q_keeps_tried": sibling_q_keeps_tried}
_slow = pytest.mark.slow


@pytest.mark.parametrize("name,fault", [
    ("t1", "sibling_residual_from_p"), ("t0.7_topk2", "sibling_residual_from_p"),
    ("t1", "sibling_q_keeps_tried"), ("t0.7_topk2", "sibling_q_keeps_tried"),
    pytest.param("topp0.8", "sibling_residual_from_p", marks=_slow),
    pytest.param("t1.3_topk4_topp0.9", "sibling_residual_from_p", marks=_slow),
    pytest.param("t1.3_topk4_topp0.9", "sibling_q_keeps_tried", marks=_slow)])
def test_sibling_faults_are_detected(name, fault):
  """The faults are caught at this sample size: the check has power against sibling bugs.
  (Not sibling_q_keeps_tried at top-p 0.8: on these tables, wherever the draft's nucleus holds
  a second sibling, p <= q on that nucleus, so after a rejection the residual has no mass on
  the draft's tokens and every later sibling is rejected under either rule: the same law.)"""
  pvalue, msg = _pvalue(CONFIGS[name], faulty_tree_verifier(FAULTS[fault]))
  assert pvalue < 1e-6, f"{name} {fault}: {msg}"


def test_greedy_tree_equals_greedy_target():
  """T = 0: whatever tree was drafted, the greedy verifier emits a prefix of the target's
  greedy sequence, as long as the tree holds it (brute force over the drafted children)."""
  p_raw, q_raw = _logit_tables(3)
  rng = np.random.default_rng(4)  # a draft near the target, so every depth is kept somewhere
  q_raw = [p + jnp.asarray(3.0 * rng.normal(size=p.shape), jnp.float32) for p in p_raw]
  p_tables = _processed(p_raw, SamplingConfig(temperature=0.0))
  q_tables = _processed(q_raw, SamplingConfig(temperature=2.0))
  batch = 512
  tokens_BxN = draft_tree(jax.random.key(5), q_tables, TREE, batch)  # random trees per row
  verdict = jax.jit(tv.greedy, static_argnums=1)(None, TREE, tokens_BxN, None,
                                                 node_rows(p_tables, TREE, tokens_BxN))
  want = np.unravel_index(np.argmax(exact_joint(p_tables)), (V,) * LENGTH)
  tokens = np.asarray(tokens_BxN)
  n_B = np.asarray(verdict.num_accepted_B)
  for row in range(batch):
    node, n = 0, 0
    while n < TREE.max_depth:
      hits = [k for k in TREE.children_NxK[node] if k >= 0 and tokens[row, k] == want[n]]
      if not hits:
        break
      node, n = hits[0], n + 1
    assert n_B[row] == n
    np.testing.assert_array_equal(np.asarray(verdict.tokens_BxD)[row, :n], want[:n])
    assert int(verdict.next_token_B[row]) == want[n]
  assert np.bincount(n_B, minlength=3).min() >= 10, np.bincount(n_B)  # rows stop at every depth
