"""Block verification (`acceptance.block`): exact output law, optimality, greedy, sampling.

Why these tests: a wrong residual or weight in a verification rule shifts the output distribution
by a little and nothing crashes. So the rule's output law is computed EXACTLY by enumerating every
draft block on a small vocabulary with context-dependent p and q (including degenerate rows:
p == q, zeros in q, one-hot rows) and compared with the target's law; sampling is then checked
against those exact probabilities, and the whole loop against the target model elsewhere.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specdec_jax.decoding import acceptance as acc


# ---- an exact reference: context-dependent p and q on a small vocabulary -------------------------
class TreeModels:
  """Random next-token tables p(.|prefix) and q(.|prefix) for every prefix up to a length."""

  def __init__(self, vocab: int, depth: int, seed: int, degenerate: bool = True):
    rng = np.random.default_rng(seed)
    self.vocab, self.depth = vocab, depth
    self.p, self.q = {}, {}
    for k in range(depth + 1):
      for prefix in itertools.product(range(vocab), repeat=k):
        p = rng.dirichlet(np.full(vocab, 0.5))
        q = rng.dirichlet(np.full(vocab, 0.5))
        kind = rng.integers(5) if degenerate else 0
        if kind == 1:
          q = p.copy()  # p == q: every residual is empty
        elif kind == 2:
          q[rng.integers(vocab)] = 0.0  # the draft never proposes one token
          q /= q.sum()
        elif kind == 3:
          p = np.eye(vocab)[rng.integers(vocab)]  # a one-hot target
        self.p[prefix], self.q[prefix] = p, q

  def target_joint(self, length: int) -> np.ndarray:
    out = np.zeros([self.vocab] * length)
    for s in itertools.product(range(self.vocab), repeat=length):
      out[s] = np.prod([self.p[s[:j]][s[j]] for j in range(length)])
    return out

  def blocks(self, gamma: int):
    """Every draft block, its probability under q, and the rule's inputs [N, ...] (float32)."""
    xs = list(itertools.product(range(self.vocab), repeat=gamma))
    weight = np.array([np.prod([self.q[x[:j]][x[j]] for j in range(gamma)]) for x in xs])
    q = np.array([[self.q[x[:j]] for j in range(gamma)] for x in xs], np.float32)
    p = np.array([[self.p[x[:j]] for j in range(gamma + 1)] for x in xs], np.float32)
    return xs, weight, np.array(xs, np.int32), q, p


def output_law(models: TreeModels, gamma: int, stop_BxG1, next_BxG1xV) -> np.ndarray:
  """Law of the first gamma + 1 tokens: one verification, then plain target sampling to fill."""
  xs, weight, *_ = models.blocks(gamma)
  v = models.vocab
  out = np.zeros([v] * (gamma + 1))
  for b, x in enumerate(xs):
    for tau in range(gamma + 1):
      w = weight[b] * stop_BxG1[b, tau]
      if w == 0.0:
        continue
      for y in range(v):
        head = tuple(x[:tau]) + (y,)
        wy = w * next_BxG1xV[b, tau, y]
        for tail in itertools.product(range(v), repeat=gamma - tau):
          s = head + tail
          out[s] += wy * np.prod([models.p[s[:j]][s[j]] for j in range(tau + 1, gamma + 1)])
  return out


def tokenwise_law(x_BxG, q_BxGxV, p_BxG1xV):
  """Exact stop probabilities and next-token laws of token-wise verification (reference)."""
  gamma = x_BxG.shape[1]
  px = np.take_along_axis(p_BxG1xV[:, :gamma], x_BxG[..., None], -1)[..., 0]
  qx = np.take_along_axis(q_BxGxV, x_BxG[..., None], -1)[..., 0]
  beta = np.minimum(1.0, px / np.maximum(qx, 1e-30))
  reach = np.concatenate([np.ones_like(beta[:, :1]), np.cumprod(beta, axis=1)], axis=1)
  stop = reach * np.concatenate([1.0 - beta, np.ones_like(beta[:, :1])], axis=1)
  q_pad = np.concatenate([q_BxGxV, np.zeros_like(q_BxGxV[:, :1])], axis=1)
  r = np.maximum(p_BxG1xV - q_pad, 0.0)
  mass = r.sum(-1, keepdims=True)
  nxt = np.where(mass > acc.RESIDUAL_EPS, r / np.maximum(mass, 1e-30), p_BxG1xV)
  return stop, nxt


def block_law(x_BxG, q_BxGxV, p_BxG1xV):
  stop, nxt = _block_law_jit(jnp.asarray(x_BxG), jnp.asarray(q_BxGxV), jnp.asarray(p_BxG1xV))
  return np.asarray(stop, np.float64), np.asarray(nxt, np.float64)


@jax.jit
def _block_law_jit(x, q, p):
  h, _, nxt = acc.block_distributions(x, q, p)
  return acc.stop_probabilities(h), nxt


# ---- tests -----------------------------------------------------------------------------------------
def test_paper_toy_example():
  """Sun et al.'s example: q = (2/3, 1/3), p = (1/3, 2/3), gamma 2: 10/9 token-wise, 11/9 block."""
  p = np.array([1 / 3, 2 / 3], np.float32)
  q = np.array([2 / 3, 1 / 3], np.float32)
  xs = np.array(list(itertools.product(range(2), repeat=2)), np.int32)
  weight = np.prod(q[xs], axis=1)
  qq = np.broadcast_to(q, (4, 2, 2)).copy()
  pp = np.broadcast_to(p, (4, 3, 2)).copy()
  i3 = np.arange(3)
  e_token = weight @ (tokenwise_law(xs, qq, pp)[0] @ i3)
  e_block = weight @ (block_law(xs, qq, pp)[0] @ i3)
  assert e_token == pytest.approx(10 / 9, abs=1e-6)
  assert e_block == pytest.approx(11 / 9, abs=1e-6)


@pytest.mark.parametrize("gamma,seed", [(1, 0), (2, 1), (3, 2), (3, 3)])
def test_block_output_law_is_the_target(gamma, seed):
  """One block verification + target sampling gives exactly the target's joint law."""
  models = TreeModels(vocab=3, depth=gamma, seed=seed)
  _, _, x, q, p = models.blocks(gamma)
  want = models.target_joint(gamma + 1)
  got_token = output_law(models, gamma, *tokenwise_law(x, q, p))  # checks the harness itself
  np.testing.assert_allclose(got_token, want, atol=2e-6)
  got_block = output_law(models, gamma, *block_law(x, q, p))
  np.testing.assert_allclose(got_block, want, atol=2e-6)


def test_block_accepts_at_least_as_many_as_tokenwise():
  """Exact expected accepted length over x ~ q: block >= token-wise on random p/q, every gamma."""
  gains = []
  for seed in range(12):
    gamma = 1 + seed % 4
    models = TreeModels(vocab=3, depth=gamma, seed=100 + seed, degenerate=seed % 2 == 0)
    _, weight, x, q, p = models.blocks(gamma)
    i = np.arange(gamma + 1)
    e_token = weight @ (tokenwise_law(x, q, p)[0] @ i)
    e_block = weight @ (block_law(x, q, p)[0] @ i)
    assert e_block >= e_token - 1e-6, (seed, e_block, e_token)
    gains.append(e_block - e_token)
    if gamma == 1:  # a block of one token is token-wise verification
      assert e_block == pytest.approx(e_token, abs=1e-6)
  assert max(gains) > 0.01  # and it does help somewhere


def test_block_greedy_equals_tokenwise():
  """One-hot p and q: both rules accept the longest agreeing prefix and emit p's argmax."""
  rng = np.random.default_rng(0)
  b, g, v = 64, 4, 5
  x = rng.integers(v, size=(b, g)).astype(np.int32)
  q = jax.nn.one_hot(x, v)
  agree = rng.random((b, g + 1)) < 0.7
  p_tok = np.where(agree[:, :g], x, (x + 1) % v)
  p_tok = np.concatenate([p_tok, rng.integers(v, size=(b, 1))], axis=1).astype(np.int32)
  p = jax.nn.one_hot(p_tok, v)
  key = jax.random.key(3)
  n_t, y_t = jax.jit(acc.tokenwise)(key, jnp.asarray(x), q, p)
  n_b, y_b = jax.jit(acc.block)(key, jnp.asarray(x), q, p)
  np.testing.assert_array_equal(n_b, n_t)
  np.testing.assert_array_equal(y_b, y_t)
  np.testing.assert_array_equal(y_b, p_tok[np.arange(b), np.asarray(n_b)])


def test_masked_positions_act_as_a_shorter_block():
  """q rows set to 0 from position g on (adaptive gamma) give exactly block verification with g."""
  models = TreeModels(vocab=3, depth=4, seed=7)
  _, _, x, q, p = models.blocks(4)
  for g in (1, 2, 3):
    qm = q.copy()
    qm[:, g:] = 0.0
    stop_m, next_m = block_law(x, qm, p)
    stop_g, next_g = block_law(x[:, :g], q[:, :g], p[:, :g + 1])
    np.testing.assert_allclose(stop_m[:, g + 1:], 0.0, atol=0)
    np.testing.assert_allclose(stop_m[:, :g + 1], stop_g, atol=1e-6)
    np.testing.assert_allclose(next_m[:, :g + 1], next_g, atol=1e-6)


def test_block_sampler_matches_its_probabilities():
  """The sampled (accepted count, next token) pairs follow the exact law (chi-square, 200k)."""
  models = TreeModels(vocab=3, depth=3, seed=11, degenerate=False)
  _, _, x, q, p = models.blocks(3)
  row = 13  # one fixed draft block, repeated
  n = 200_000
  xb, qb, pb = (jnp.asarray(np.repeat(a[row:row + 1], n, axis=0)) for a in (x, q, p))
  n_B, y_B = jax.jit(acc.block)(jax.random.key(0), xb, qb, pb)
  stop, nxt = block_law(x[row:row + 1], q[row:row + 1], p[row:row + 1])
  probs = (stop[0][:, None] * nxt[0]).ravel()
  counts = np.bincount(np.asarray(n_B) * 3 + np.asarray(y_B), minlength=probs.size)
  keep = probs * n >= 5
  assert counts[~keep].sum() <= 5  # near-impossible cells stay near empty
  stat = np.sum((counts[keep] - n * probs[keep]) ** 2 / (n * probs[keep]))
  assert stats.chi2.sf(stat, keep.sum() - 1) > 1e-3


# ---- the whole loop with rule='block' --------------------------------------------------------------
V = 6
NUM_TOKENS = 3
NUM_SAMPLES = 100_000
PROMPT = np.array([3, 5, 2], np.int32)


def bigram_pair(v=V, seed=0):
  """A context-dependent target and draft through the same seam at almost no cost: dense bigram
  tables (random sharp rows), so the exact law of any continuation is a product of table rows."""
  from specdec_jax.models import model_free as dr
  from specdec_jax.models import ngram
  rng = np.random.default_rng(seed)
  cfg = dict(kind="decoder", vocab_size=v, eos_id=-1)
  mats = [rng.dirichlet(np.full(v, 0.4), size=v) for _ in range(2)]
  params = [{k: jnp.asarray(x) for k, x in ngram.dense_bigram_params(m).items()} for m in mats]
  return dr.BigramDraft(**cfg), params[0], dr.BigramDraft(**cfg), params[1], mats[0]


def exact_bigram_joint(matrix, last_token, num_tokens, sampling):
  """Exact law of the next `num_tokens` tokens of the processed bigram target -> [V] * k."""
  from specdec_jax.decoding.sampling import process_logits
  rows = np.asarray(process_logits(jnp.log(jnp.asarray(matrix, jnp.float32)), sampling),
                    np.float64)
  joint = rows[last_token]
  for _ in range(num_tokens - 1):
    joint = np.einsum("...a,ab->...ab", joint, rows)
  return joint


@pytest.fixture(scope="module")
def sharp_models():
  return bigram_pair()


def _loop_counts(models, sampling, rule, gamma=3, seed=0):
  from specdec_jax.decoding.decoder import Decoder, Params
  from specdec_jax.decoding.speculative import Chain
  target, tp, draft, dp, _ = models
  inputs = jnp.asarray(np.broadcast_to(PROMPT, (NUM_SAMPLES, len(PROMPT))))
  decoder = Decoder(target, draft, Chain(gamma), sampling, rule=rule, max_decode_len=NUM_TOKENS)
  out = decoder.generate(Params(tp, dp), inputs, jax.random.key(seed))
  assert np.all(np.asarray(out.lengths_B) == NUM_TOKENS)
  flat = np.ravel_multi_index(np.asarray(out.tokens_BxN[:, :NUM_TOKENS]).T, (V,) * NUM_TOKENS)
  return np.bincount(flat, minlength=V ** NUM_TOKENS), out.counters


def _broken_block(key, draft_tokens, draft_probs, target_probs):
  """Block verification with a plausible bug: after a stop at tau the correction is sampled from
  the token-wise residual norm(max(0, p - q)) instead of norm(max(0, a_tau p - q))."""
  batch, gamma = draft_tokens.shape
  k_accept, k_next = jax.random.split(key)
  h_BxG, _, _ = acc.block_distributions(draft_tokens, draft_probs, target_probs)
  eta = jax.random.uniform(k_accept, (batch, gamma), jnp.float32)
  i_G = jnp.arange(1, gamma + 1, dtype=jnp.int32)
  n_B = jnp.max(jnp.where(eta < h_BxG, i_G[None, :], 0), axis=1).astype(jnp.int32)
  q_pad = jnp.concatenate([draft_probs, jnp.zeros_like(draft_probs[:, :1])], axis=1)
  p_n = jnp.take_along_axis(target_probs, n_B[:, None, None], axis=1)[:, 0]
  q_n = jnp.take_along_axis(q_pad, n_B[:, None, None], axis=1)[:, 0]
  from specdec_jax.decoding.sampling import sample
  return n_B, sample(k_next, acc.residual(p_n, q_n))


@pytest.mark.parametrize("sampling_kw", [
    dict(temperature=1.0), pytest.param(dict(temperature=0.7, top_k=4), marks=pytest.mark.slow)])
def test_block_loop_matches_exact_target_distribution(sharp_models, sampling_kw):
  """100k vectorised samples of the first 3 tokens through the on-device loop with
  rule='block' against the enumerated target law (chi-square; seeds fixed)."""
  from specdec_jax.decoding.sampling import SamplingConfig
  from specdec_jax.testing import chi_square_gof
  sampling = SamplingConfig(**sampling_kw)
  probs = exact_bigram_joint(sharp_models[4], PROMPT[-1], NUM_TOKENS, sampling).ravel()
  counts, counters = _loop_counts(sharp_models, sampling, "block")
  stat, dof, pvalue = chi_square_gof(counts, probs)
  tv = 0.5 * np.abs(counts / counts.sum() - probs).sum()
  assert pvalue > 1e-3, f"chi2={stat:.1f} dof={dof} p={pvalue:.2e} TV={tv:.4f}"
  assert int(np.asarray(counters.accepted_B).sum()) > 0


def test_broken_block_variant_is_detected(sharp_models, monkeypatch):
  from specdec_jax.decoding.sampling import SamplingConfig
  from specdec_jax.testing import chi_square_gof
  monkeypatch.setitem(acc.ACCEPTANCE_RULES, "broken_block", _broken_block)
  sampling = SamplingConfig(temperature=1.0)
  counts, _ = _loop_counts(sharp_models, sampling, "broken_block")
  _, _, pvalue = chi_square_gof(
      counts, exact_bigram_joint(sharp_models[4], PROMPT[-1], NUM_TOKENS, sampling))
  assert pvalue < 1e-6


@pytest.mark.parametrize("kind", ["bigram", pytest.param("decoder", marks=pytest.mark.slow),
                                  pytest.param("t5", marks=pytest.mark.slow)])
def test_block_greedy_loop_equals_tokenwise_and_autoregressive(kind):
  from specdec_jax.decoding.decoder import Decoder, Params
  from specdec_jax.decoding.sampling import SamplingConfig
  from specdec_jax.decoding.speculative import Chain
  from specdec_jax.testing import tiny_pair
  if kind == "bigram":
    target, tp, draft, dp, _ = bigram_pair(v=16, seed=3)
  else:
    target, tp, draft, dp = tiny_pair(kind)
  inputs = jnp.asarray([[5, 6, 7, 2, 0], [8, 9, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]]
                       if kind != "t5" else
                       [[5, 6, 7, 1, 0], [8, 9, 1, 0, 0], [4, 4, 4, 4, 1], [7, 1, 0, 0, 0]],
                       jnp.int32)
  greedy = SamplingConfig(temperature=0.0)
  ar = Decoder(target, sampling=greedy, max_decode_len=12).generate(Params(tp), inputs)
  outs = {rule: Decoder(target, draft, Chain(3), greedy, rule=rule, max_decode_len=12).generate(
              Params(tp, dp), inputs)
          for rule in ("tokenwise", "block")}
  for rule, out in outs.items():
    np.testing.assert_array_equal(np.asarray(out.tokens_BxN), np.asarray(ar.tokens_BxN), rule)
  np.testing.assert_array_equal(np.asarray(outs["block"].counters.accepted_B),
                                np.asarray(outs["tokenwise"].counters.accepted_B))
