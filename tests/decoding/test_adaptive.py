"""Adaptive draft length (HF's +2 / -1 schedule, confidence stop) inside the on-device loop.

Why these tests: a block length that varies per example and per iteration touches everything the
fixed loop gets right by construction (which positions are proposed, which the draft has seen,
where both caches roll back to), and the stop rule must depend only on the draft, or the output
would no longer follow the target. So: greedy output equals autoregressive output token for token
(real KV-cache models and a bigram pair), 100k samples follow the exact target law for both
acceptance rules, and the block lengths actually vary.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import adaptive as ad
from specdec_jax.models import model_free as dr
from specdec_jax.models import ngram
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig, process_logits
from specdec_jax.testing import chi_square_gof, tiny_pair

GREEDY = SamplingConfig(temperature=0.0)
V = 6
NUM_TOKENS = 3
NUM_SAMPLES = 100_000
PROMPT = np.array([3, 5, 2], np.int32)


def bigram_pair(v=V, seed=0):
  """Target and draft as dense random bigram tables behind the seam (cheap, exact law known)."""
  rng = np.random.default_rng(seed)
  cfg = dict(kind="decoder", vocab_size=v, eos_id=-1)
  mats = [rng.dirichlet(np.full(v, 0.4), size=v) for _ in range(2)]
  params = [{k: jnp.asarray(x) for k, x in ngram.dense_bigram_params(m).items()} for m in mats]
  return dr.BigramDraft(**cfg), params[0], dr.BigramDraft(**cfg), params[1], mats[0]


def _ar(model, params, inputs, *, sampling, max_decode_len):
  return Decoder(model, sampling=sampling, max_decode_len=max_decode_len).generate(
      Params(params), inputs)


def _adaptive(target, tp, draft, dp, inputs, *, cfg, sampling, max_decode_len, rng=None,
              rule="tokenwise"):
  """(result, the adaptive statistics) of the adaptive scheme's decode."""
  res = Decoder(target, draft, cfg, sampling, rule=rule, max_decode_len=max_decode_len).generate(
      Params(tp, dp), inputs, rng)
  return res, res.stats


def exact_bigram_joint(matrix, last_token, num_tokens, sampling):
  rows = np.asarray(process_logits(jnp.log(jnp.asarray(matrix, jnp.float32)), sampling),
                    np.float64)
  joint = rows[last_token]
  for _ in range(num_tokens - 1):
    joint = np.einsum("...a,ab->...ab", joint, rows)
  return joint


def test_config_validation_and_buckets():
  assert ad.AdaptiveConfig(gamma_max=8).buckets == (1, 2, 4, 8)
  assert ad.AdaptiveConfig(gamma_max=6).buckets == (1, 2, 4, 6)
  for bad in (dict(gamma_max=0), dict(gamma_max=4, gamma_init=5), dict(schedule="x"),
              dict(confidence_threshold=1.5), dict(gamma_max=4, verify_buckets=(1, 2))):
    with pytest.raises(ValueError):
      ad.AdaptiveConfig(**bad)


def test_heuristic_schedule():
  cfg = ad.AdaptiveConfig(gamma_max=6)
  sched = jnp.asarray([3, 3, 1, 6, 5])
  n = jnp.asarray([3, 1, 0, 6, 0])
  active = jnp.asarray([True, True, True, True, False])
  np.testing.assert_array_equal(ad.next_schedule(sched, n, active, cfg), [5, 2, 1, 6, 5])
  const = ad.AdaptiveConfig(gamma_max=6, schedule="constant")
  np.testing.assert_array_equal(ad.next_schedule(sched, n, active, const), sched)


CONFIGS = {
    "heuristic": ad.AdaptiveConfig(gamma_max=4, gamma_init=2),
    "heuristic_confidence": ad.AdaptiveConfig(gamma_max=4, confidence_threshold=0.6),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_adaptive_equals_autoregressive_bigram(name):
  target, tp, draft, dp, _ = bigram_pair(v=16, seed=3)
  inputs = jnp.asarray([[5, 6, 7, 2, 0], [8, 9, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]],
                       jnp.int32)
  ar = _ar(target, tp, inputs, sampling=GREEDY, max_decode_len=20)
  out, stats = _adaptive(target, tp, draft, dp, inputs, cfg=CONFIGS[name], sampling=GREEDY,
                         max_decode_len=20)
  np.testing.assert_array_equal(np.asarray(out.tokens_BxN), np.asarray(ar.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(out.lengths_B), np.asarray(ar.lengths_B))
  c = out.counters
  assert np.all(np.asarray(c.accepted_B) <= np.asarray(c.drafted_B))
  assert int(np.asarray(stats.proposed_hist).sum()) > 0


@pytest.mark.parametrize("kind", ["decoder", pytest.param("t5", marks=pytest.mark.slow)])
def test_greedy_adaptive_equals_autoregressive_models(kind):
  """Real KV caches, a random draft, the schedule and a confidence stop: output = autoregressive,
  token for token."""
  target, tp, draft, dp = tiny_pair(kind)
  inputs = jnp.asarray([[5, 6, 7, 2, 0], [8, 9, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]]
                       if kind == "decoder" else
                       [[5, 6, 7, 1, 0], [8, 9, 1, 0, 0], [4, 4, 4, 4, 1], [7, 1, 0, 0, 0]],
                       jnp.int32)
  ar = _ar(target, tp, inputs, sampling=GREEDY, max_decode_len=14)
  cfg = ad.AdaptiveConfig(gamma_max=4, gamma_init=1, confidence_threshold=0.05)
  out, stats = _adaptive(target, tp, draft, dp, inputs, cfg=cfg, sampling=GREEDY,
                         max_decode_len=14)
  np.testing.assert_array_equal(np.asarray(out.tokens_BxN), np.asarray(ar.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(out.lengths_B), np.asarray(ar.lengths_B))
  c = out.counters
  assert np.all(np.asarray(c.accepted_B) <= np.asarray(c.drafted_B))
  # One proposed length per active example per target call.
  assert int(np.asarray(stats.proposed_hist).sum()) == int(np.asarray(c.target_calls_B).sum())


def test_a_rows_alpha_does_not_depend_on_its_batch():
  """alpha's counters of one row decoded alone equal its counters beside other rows (greedy: the
  same tokens and block lengths). Alone, a row whose g_b drafts were all accepted is left
  pending and position g_b is scored as next iteration's bonus; beside a longer block the draft
  computed q there in this iteration: either way it counts once, with the same q."""
  target, tp, _, _ = tiny_pair("decoder", 8)
  leaves, tree = jax.tree.flatten(tp)  # a draft close to the target: long accepted blocks
  keys = jax.random.split(jax.random.key(7), len(leaves))
  dp = jax.tree.unflatten(tree, [x + 0.3 * jax.random.normal(k, x.shape, x.dtype)
                                 for x, k in zip(leaves, keys)])
  inputs = jnp.asarray([[5, 6, 7, 2, 0], [3, 4, 3, 0, 0], [4, 4, 4, 4, 4], [7, 1, 0, 0, 0]],
                       jnp.int32)
  cfg = ad.AdaptiveConfig(gamma_max=4, gamma_init=2, confidence_threshold=0.3)
  batch, _ = _adaptive(target, tp, target, dp, inputs, cfg=cfg, sampling=GREEDY,
                       max_decode_len=24)
  for r in range(4):
    alone, _ = _adaptive(target, tp, target, dp, inputs[r:r + 1], cfg=cfg, sampling=GREEDY,
                         max_decode_len=24)
    np.testing.assert_array_equal(np.asarray(alone.tokens_BxN[0]),
                                  np.asarray(batch.tokens_BxN[r]))
    for name in ("beta_count_B", "drafted_B", "accepted_B"):
      assert int(getattr(alone.counters, name)[0]) == int(getattr(batch.counters, name)[r]), name
    np.testing.assert_allclose(float(alone.counters.beta_sum_B[0]),
                               float(batch.counters.beta_sum_B[r]), rtol=1e-5)


@pytest.mark.slow
def test_identical_draft_grows_the_schedule():
  """The target drafting for itself accepts everything: the schedule climbs 1 -> 3 -> 4 and the
  output still equals autoregressive decoding, with fewer target calls than a random draft."""
  target, tp, draft, dp = tiny_pair("decoder")
  inputs = jnp.asarray([[5, 6, 7, 2, 0], [8, 9, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]],
                       jnp.int32)
  ar = _ar(target, tp, inputs, sampling=GREEDY, max_decode_len=14)
  cfg = ad.AdaptiveConfig(gamma_max=4, gamma_init=1)
  same, stats_same = _adaptive(target, tp, target, tp, inputs, cfg=cfg, sampling=GREEDY,
                               max_decode_len=14)
  other, _ = _adaptive(target, tp, draft, dp, inputs, cfg=cfg, sampling=GREEDY,
                       max_decode_len=14)
  np.testing.assert_array_equal(np.asarray(same.tokens_BxN), np.asarray(ar.tokens_BxN))
  assert int(same.counters.iterations) < int(other.counters.iterations)
  assert int(np.asarray(stats_same.proposed_hist)[4]) > 0


@pytest.mark.parametrize("rule", ["tokenwise", "block"])
def test_adaptive_matches_exact_target_distribution(rule):
  """100k samples of the first 3 tokens, heuristic schedule + confidence stop, both rules."""
  target, tp, draft, dp, matrix = bigram_pair()
  sampling = SamplingConfig(temperature=1.0)
  cfg = ad.AdaptiveConfig(gamma_max=3, gamma_init=2, confidence_threshold=0.5)
  inputs = jnp.asarray(np.broadcast_to(PROMPT, (NUM_SAMPLES, len(PROMPT))))
  out, stats = _adaptive(target, tp, draft, dp, inputs, cfg=cfg, sampling=sampling,
                         max_decode_len=NUM_TOKENS, rng=jax.random.key(7), rule=rule)
  assert np.all(np.asarray(out.lengths_B) == NUM_TOKENS)
  hist = np.asarray(stats.proposed_hist)
  assert np.count_nonzero(hist[1:]) >= 2, hist  # block lengths really vary
  assert int(np.asarray(out.counters.accepted_B).sum()) > 0
  flat = np.ravel_multi_index(np.asarray(out.tokens_BxN[:, :NUM_TOKENS]).T, (V,) * NUM_TOKENS)
  counts = np.bincount(flat, minlength=V ** NUM_TOKENS)
  probs = exact_bigram_joint(matrix, PROMPT[-1], NUM_TOKENS, sampling).ravel()
  stat, dof, pvalue = chi_square_gof(counts, probs)
  assert pvalue > 1e-3, f"chi2={stat:.1f} dof={dof} p={pvalue:.2e}"
