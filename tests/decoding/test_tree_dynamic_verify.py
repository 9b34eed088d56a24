"""A dynamic tree's verification reproduces the target's law; skipping pruned siblings does not.

Why: EAGLE-2 prunes candidates by their own draft scores. `tree.dynamic` keeps recursive
rejection exact by trying ALL drawn children of every visited node, pruned ones included (a kept
pruned child ends the walk as the next token). This test shows both halves on synthetic
context-dependent tables (vocabulary 6, p(.|prefix) and q(.|prefix) for every prefix, processed
by `sampling.process_logits`), no models: the beam expansion of `DynamicTree(depth=2, width=2,
branch=3, nodes=4)` (3 + 6 candidates, 3 verified: the rerank prunes in every row) is drawn as
the scheme draws it, `dynamic.layout` builds the node and walk tables, `recursive_rejection`
verifies, the target fills the rest of three tokens; their joint law is chi-square tested against
the exact product of the target's rows (as test_tree_distribution.py). A verifier that tries only
the verified children (pruned ones skipped: the tempting shortcut) must fail at the same size, as
must the checker's `sibling_residual_from_p` on the per-row walk. Seeds fixed (1e-3 is the
false-alarm rate with a fresh seed).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.sampling import SamplingConfig, process_logits, sample
from specdec_jax.decoding.tree import DynamicTree
from specdec_jax.decoding.tree import dynamic
from specdec_jax.decoding.tree import verify as tv
from specdec_jax.testing import chi_square_gof, faulty_tree_verifier, sibling_residual_from_p

V = 6
LENGTH = 3  # tokens compared: depth 1, depth 2 and what follows
NUM_SAMPLES = 200_000
SPEC = DynamicTree(depth=2, width=2, branch=3, nodes=4)
CONFIGS = {
    "t1": SamplingConfig(temperature=1.0),
    "t0.7_topk2": SamplingConfig(temperature=0.7, top_k=2),
    "topp0.8": SamplingConfig(temperature=1.0, top_p=0.8),
}


def _tables(seed, sampling):
  """Processed target and draft rows for every prefix of 0..LENGTH-1 tokens: [V^k, V] each; the
  draft is the target plus noise (overlapping supports)."""
  rng = np.random.default_rng(seed)
  target = [1.5 * rng.normal(size=(V ** k, V)) for k in range(LENGTH)]
  draft = [t + 1.5 * rng.normal(size=t.shape) for t in target]
  return [[process_logits(jnp.asarray(t, jnp.float32), sampling) for t in ts]
          for ts in (target, draft)]


def _expand(key, q_BxLxV, k):
  """Children without replacement and their clipped log q (`dynamic.expand` at T > 0)."""
  b, l, v = q_BxLxV.shape
  kids_BxLxK = tv.sample_without_replacement(key, q_BxLxV.reshape(b * l, v), k).reshape(b, l, k)
  return kids_BxLxK, jnp.minimum(jnp.take_along_axis(jnp.log(q_BxLxV), kids_BxLxK, axis=-1), 0.0)


def draft_dynamic(key, q_tables, batch):
  """The scheme's beam expansion for depth 2 on the tables: `dynamic.Drafted`."""
  k, width = SPEC.branch, SPEC.width
  k1, k2 = jax.random.split(key)
  q_root_Bx1xV = jnp.broadcast_to(q_tables[0][0], (batch, 1, V))
  kids_Bx1xK, logq_Bx1xK = _expand(k1, q_root_Bx1xV, k)
  tokens1_BxK, scores1_BxK = kids_Bx1xK[:, 0], logq_Bx1xK[:, 0]
  beam_BxW = jax.lax.top_k(scores1_BxK, width)[1].astype(jnp.int32)
  q_beam_BxWxV = q_tables[1][jnp.take_along_axis(tokens1_BxK, beam_BxW, axis=1)]
  kids_BxWxK, logq_BxWxK = _expand(k2, q_beam_BxWxV, k)
  scores2_BxWxK = jnp.take_along_axis(scores1_BxK, beam_BxW, axis=1)[:, :, None] + logq_BxWxK
  return dynamic.Drafted(
      jnp.concatenate([tokens1_BxK, kids_BxWxK.reshape(batch, -1)], axis=1),
      jnp.concatenate([scores1_BxK, scores2_BxWxK.reshape(batch, -1)], axis=1),
      jnp.concatenate([jnp.full((batch, 1), -1, jnp.int32), beam_BxW], axis=1),
      jnp.concatenate([q_root_Bx1xV, q_beam_BxWxV], axis=1))


def _flat(prefix_BxK):
  idx = jnp.zeros(prefix_BxK.shape[:1], jnp.int32)
  for j in range(prefix_BxK.shape[1]):
    idx = idx * V + prefix_BxK[:, j]
  return idx


def node_rows(tables, lay):
  """Each node's row (the distribution after its path) [B, N, V]: a depth-2 node's path is its
  depth-1 ancestor (the visible mask) and itself."""
  depth_BxN, tok_BxN = lay.depths_BxN, lay.tokens_BxN
  above_BxNxN = lay.visible_BxNxN & (depth_BxN[:, None, :] == 1)
  first_BxN = jnp.sum(jnp.where(above_BxNxN, tok_BxN[:, None, :], 0), axis=2)
  row1_BxN = tables[1][jnp.clip(tok_BxN, 0, V - 1)]
  row2_BxN = tables[2][first_BxN * V + jnp.clip(tok_BxN, 0, V - 1)]
  root_BxNxV = jnp.broadcast_to(tables[0][0], row1_BxN.shape)
  return jnp.where((depth_BxN == 0)[:, :, None], root_BxNxV,
                   jnp.where((depth_BxN == 1)[:, :, None], row1_BxN, row2_BxN))


def one_iteration(key, p_tables, q_tables, verifier, batch):
  """Expand, rerank, verify, fill: the first LENGTH emitted tokens [B, LENGTH], and the share
  of rows whose walk ended on a kept pruned child."""
  k_draft, k_verify, k_fill = jax.random.split(key, 3)
  lay = dynamic.layout(SPEC, draft_dynamic(k_draft, q_tables, batch),
                       jnp.zeros((batch,), jnp.int32))
  verdict = verifier(k_verify, lay.walk, lay.tokens_BxN, lay.q_BxNxV, node_rows(p_tables, lay))
  n_B = verdict.num_accepted_B
  emitted = []
  for j in range(LENGTH):
    kept = verdict.tokens_BxD[:, j] if j < SPEC.depth else jnp.zeros_like(n_B)
    fresh = jnp.zeros_like(n_B)
    if j > 0:  # past the verified tokens: the target, at the emitted prefix
      fresh = sample(jax.random.fold_in(k_fill, j), p_tables[j][_flat(jnp.stack(emitted, 1))])
    emitted.append(jnp.where(j < n_B, kept, jnp.where(j == n_B, verdict.next_token_B, fresh)))
  return jnp.stack(emitted, axis=1), jnp.mean(verdict.pruned_B)


def skip_pruned(key, walk, node_tokens_BxN, draft_probs_BxNxV, target_probs_BxNxV):
  """The fault: only the verified children are tried (a pruned child is treated as never
  drawn), so whether a sibling is tried depends on its own score."""
  walk = walk.replace(drawn_BxNxK=walk.children_BxNxK >= 0)
  return tv.recursive_rejection(key, walk, node_tokens_BxN, draft_probs_BxNxV,
                                target_probs_BxNxV)


def _pvalue(sampling, verifier, seed=1):
  p_tables, q_tables = _tables(seed, sampling)
  # The tables go in as arguments, not constants: XLA would fold the draws' running sums over
  # the constant root rows at compile time (seconds per [NUM_SAMPLES, V] sum).
  run = jax.jit(lambda k, p, q: one_iteration(k, p, q, verifier, NUM_SAMPLES))
  tokens_BxL, pruned = run(jax.random.key(seed + 100), p_tables, q_tables)
  flat = np.ravel_multi_index(np.asarray(tokens_BxL).T, (V,) * LENGTH)
  counts = np.bincount(flat, minlength=V ** LENGTH)
  rows = [np.asarray(t, np.float64) for t in p_tables]
  probs = (rows[0][0][:, None, None] * rows[1].reshape(V, V, 1)
           * rows[2].reshape(V, V, V)).ravel()
  stat, dof, pvalue = chi_square_gof(counts, probs)
  return pvalue, float(pruned), f"chi2={stat:.1f} dof={dof} p={pvalue:.3g}"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_dynamic_tree_matches_exact_target_distribution(name):
  pvalue, pruned, msg = _pvalue(CONFIGS[name], tv.recursive_rejection)
  assert pvalue > 1e-3, f"{name}: {msg}"
  assert pruned > 0.02, f"{name}: walks ending on a pruned child: {pruned:.3f}"


@pytest.mark.parametrize("name", ["t1", "topp0.8"])
def test_skipping_pruned_siblings_is_biased(name):
  pvalue, _, msg = _pvalue(CONFIGS[name], skip_pruned)
  assert pvalue < 1e-6, f"{name}: {msg}"


def test_sibling_residual_from_p_is_detected_on_the_walk():
  pvalue, _, msg = _pvalue(CONFIGS["t1"], faulty_tree_verifier(sibling_residual_from_p))
  assert pvalue < 1e-6, msg


def test_greedy_walk_emits_the_target_argmax():
  """T = 0: the dynamic walk's greedy verifier emits the target's greedy tokens, whether they
  are verified nodes, a kept pruned child (the next token) or the correction."""
  p_tables, _ = _tables(3, SamplingConfig(temperature=0.0))
  _, q_soft = _tables(7, SamplingConfig(temperature=1.0))  # a draft unrelated to the target
  batch = 512
  lay = dynamic.layout(SPEC, draft_dynamic(jax.random.key(5), q_soft, batch),
                       jnp.zeros((batch,), jnp.int32))
  verdict = jax.jit(tv.greedy)(None, lay.walk, lay.tokens_BxN, None, node_rows(p_tables, lay))
  rows = [np.asarray(t) for t in p_tables]
  want = [int(np.argmax(rows[0][0]))]
  want.append(int(np.argmax(rows[1][want[0]])))
  want.append(int(np.argmax(rows[2][want[0] * V + want[1]])))
  n_B, tokens = np.asarray(verdict.num_accepted_B), np.asarray(verdict.tokens_BxD)
  nxt = np.asarray(verdict.next_token_B)
  for row in range(batch):
    n = int(n_B[row])
    np.testing.assert_array_equal(tokens[row, :n], want[:n])
    assert nxt[row] == want[n]
  pruned = np.asarray(verdict.pruned_B)
  assert pruned.any() and (~pruned & (n_B == 0)).any() and (n_B > 0).any(), np.bincount(n_B)
