"""Adaptive draft length with a feature-level draft (`AdaptiveConfig` with `FeatureDrafter`).

Why: the scheme varies the block per row and per iteration, verifies at a bucketed width and
feeds the draft the target's states of a variable number of written positions, so each piece
that could go wrong silently has a test: greedy speculative = greedy autoregressive (T5 and
decoder-only, ragged batch of 4 and batch 1, block lengths that do vary); after iterations of
different lengths the draft's first q equals the teacher-forced draft's over the whole verified
stream (a pending entry lost, fed twice or read from a padded state slot changes it); the
sampled joint at T > 0 with top-k equals the target's under both rules (chi-square), with rows
stopping early on the threshold.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import feature_entries, start
from specdec_jax.decoding.adaptive import AdaptiveConfig
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.drafter import FeatureDrafter, TokenDrafter
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.feature_draft import FeatureDraft
from specdec_jax.models.feature_draft_config import FeatureDraftConfig
from specdec_jax.models.model import Model
from specdec_jax.testing import (law_pvalue, sharp_t5_feature_pair,
                                 teacher_forced_draft_logits, tiny_feature_pair,
                                 vmapped_law_pvalue)

GREEDY = SamplingConfig(temperature=0.0)
INPUTS = {
    "t5": np.array([[5, 6, 7, 1, 0], [3, 4, 1, 0, 0], [4, 4, 4, 4, 1], [7, 1, 0, 0, 0]]),
    "decoder": np.array([[5, 6, 7, 2, 0], [3, 4, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]]),
}


@pytest.mark.parametrize("kind", [pytest.param("t5", marks=pytest.mark.slow), "decoder"])
def test_greedy_adaptive_feature_equals_autoregressive(kind):
  target, tp, draft, dp = tiny_feature_pair(kind, 8)
  inputs = jnp.asarray(INPUTS[kind], jnp.int32)
  ar = Decoder(target, sampling=GREEDY, max_decode_len=24).generate(Params(tp), inputs)
  scheme = AdaptiveConfig(gamma_max=4, gamma_init=2, confidence_threshold=0.3)
  for rows in (slice(2, 3), slice(0, 4)):  # batch 1 and batch > 1 (ragged)
    spec = Decoder(target, draft, scheme, GREEDY, max_decode_len=24).generate(
        Params(tp, dp), inputs[rows])
    np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN[rows]))
    np.testing.assert_array_equal(np.asarray(spec.lengths_B), np.asarray(ar.lengths_B[rows]))
    assert int(np.sum(spec.counters.emitted_B)) == int(np.sum(spec.lengths_B))
  hist = np.asarray(spec.stats.proposed_hist)  # the batch of 4
  assert np.count_nonzero(hist) >= 2, hist  # the block length did vary
  # alpha's positions are the proposed ones: after g_b accepted drafts the token at g_b is a
  # fresh draw from p (q = 0 there), not a drafted position (it once counted as beta 0)
  c = spec.counters
  assert 0 < np.sum(c.accepted_B) and np.all(np.asarray(c.beta_count_B)
                                             <= np.asarray(c.drafted_B)), c
  assert int(spec.stats.draft_calls) < 4 * int(np.max(spec.counters.target_calls_B))


def test_draft_state_after_blocks_of_different_lengths():
  """The draft's first q after several adaptive iterations equals the teacher-forced draft's
  at the last verified entry, for two rows whose blocks and accepted counts differ."""
  target = Model(get_preset("decoder_test_target", vocab_size=8, eos_id=-1))  # no row ends
  tp = target.init(jax.random.key(0))
  draft = FeatureDraft(FeatureDraftConfig.for_target(target.config, emb_dim=16, num_heads=2,
                                                     mlp_dim=32, eos_id=-1))
  dp = draft.with_target_pieces(draft.init(jax.random.key(1)), tp)
  inputs = jnp.asarray([[5, 6, 5, 6, 5], [3, 4, 3, 2, 3]], jnp.int32)
  scheme = AdaptiveConfig(gamma_max=4, gamma_init=3, confidence_threshold=0.3)
  decoder = Decoder(target, draft, scheme, GREEDY, max_decode_len=24)
  params = Params(tp, dp)
  state = start.init_state(decoder, params, inputs, jax.random.key(0))
  step = jax.jit(lambda s: scheme.iteration(decoder, params, s))
  for _ in range(6):
    state = step(state)
  assert not np.any(np.asarray(state.done_B))
  assert np.count_nonzero(np.asarray(state.stats.proposed_hist)) >= 2
  got_BxV, _, _ = feature_entries.feature_first_call(draft, dp, state, state.draft_carry)
  for b in range(2):
    stream = np.asarray(state.tokens_BxL[b, 1:int(state.num_B[b])])
    want = teacher_forced_draft_logits(target, tp, draft, dp, np.asarray(inputs[b]), stream)
    np.testing.assert_allclose(np.asarray(got_BxV[b]), want, rtol=1e-4, atol=1e-4)


# ---- exactness at temperature > 0: the sampled joint equals the target's ---------------------
V, NUM_TOKENS, NUM_SAMPLES = 6, 3, 60_000
PROMPT = np.array([3, 5, 2, 1], np.int32)


@pytest.mark.parametrize("rule,batched", [
    # the batched decode is the one with masked rows; the per-sample (vmapped) decode runs the
    # same scheme code at 3x the time, so it is the slow run's
    pytest.param("tokenwise", False, marks=pytest.mark.slow), ("tokenwise", True),
    pytest.param("block", False, marks=pytest.mark.slow),
    pytest.param("block", True, marks=pytest.mark.slow)])
def test_adaptive_feature_sampling_is_exact(rule, batched):
  """The threshold stops some blocks at one token, the schedule lets others reach three (both
  lengths occur). Each sample its own batch-1 decode (vmapped: every verify is as wide as the
  row's block), or all in one batch (rows with shorter blocks than the verify width: drafted
  tokens past g_b that the masked rule must never keep)."""
  models = sharp_t5_feature_pair(V)
  scheme = AdaptiveConfig(gamma_max=3, confidence_threshold=0.95)
  sampling = SamplingConfig(temperature=1.0, top_k=5)
  if batched:
    pvalue, out = law_pvalue(models, sampling, scheme, PROMPT, NUM_TOKENS, NUM_SAMPLES,
                             rule=rule)
  else:
    pvalue, out = vmapped_law_pvalue(models, sampling, scheme, PROMPT, NUM_TOKENS, NUM_SAMPLES,
                                     rule=rule)
  hist = np.asarray(out.stats.proposed_hist).reshape(-1, 4).sum(axis=0)
  assert hist[1] > 0.05 * hist.sum() and hist[3] > 0.05 * hist.sum(), hist
  accepted, drafted = np.sum(out.counters.accepted_B), np.sum(out.counters.drafted_B)
  assert 0 < accepted < drafted
  assert pvalue > 1e-3, f"p={pvalue:.2e}"


def test_refusals_name_the_problem():
  """The adaptive chain takes either drafter; a drafter of the other kind of draft is refused by
  name, and the feature-level draft's default is its `FeatureDrafter`, sized by gamma_max."""
  target, _, draft, _ = tiny_feature_pair("decoder", 8)
  token_draft = Model(get_preset("decoder_test_draft", vocab_size=8))
  with pytest.raises(TypeError, match="feature-level draft"):
    Decoder(target, token_draft, AdaptiveConfig(4), GREEDY, max_decode_len=4,
            drafter=FeatureDrafter())
  with pytest.raises(TypeError, match="is a feature-level draft"):
    Decoder(target, draft, AdaptiveConfig(4), GREEDY, max_decode_len=4, drafter=TokenDrafter())
  decoder = Decoder(target, draft, AdaptiveConfig(4), GREEDY, max_decode_len=4)
  assert isinstance(decoder.drafter, FeatureDrafter) and decoder.scheme.gamma == 4
