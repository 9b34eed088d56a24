"""The chain with a feature-level draft (`Chain` and `decoding/drafter.py`'s `FeatureDrafter`):
greedy speculative = greedy autoregressive, T5 and decoder-only, batch > 1 with ragged prompts.

Why: at temperature 0 the acceptance rule keeps a drafted token exactly when it is the target's
argmax, so any difference points at the verify-with-states call, the pending entries fed after
each verify, the draft cache's rollback or the commit. A small vocabulary makes a random draft
agree often enough that full and partial acceptances both occur.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import feature_entries, start
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.drafter import FeatureDrafter, TokenDrafter
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model
from specdec_jax.testing import ragged_prompts, tiny_feature_pair
from specdec_jax.testing import chi_square_gof, exact_joint, sharp_t5_feature_pair

GREEDY = SamplingConfig(temperature=0.0)
INPUTS = {
    "t5": np.array([[5, 6, 7, 1, 0], [3, 4, 1, 0, 0], [4, 4, 4, 4, 1], [7, 1, 0, 0, 0]]),
    "decoder": np.array([[5, 6, 7, 2, 0], [3, 4, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]]),
}


def _pair(kind, vocab):
  return tiny_feature_pair(kind, vocab)


@pytest.mark.parametrize("kind,vocab", [
    ("t5", 64), ("decoder", 8),
    # The other two combinations add no path the two above miss (full vs tiny vocab, each kind
    # once); run with the slow suite to keep the fast one inside CI's budget.
    pytest.param("t5", 8, marks=pytest.mark.slow), pytest.param("decoder", 64, marks=pytest.mark.slow)])
def test_greedy_feature_chain_equals_autoregressive(kind, vocab):
  target, tp, draft, dp = _pair(kind, vocab)
  inputs = jnp.asarray(np.minimum(INPUTS[kind], vocab - 1), jnp.int32)
  ar = Decoder(target, sampling=GREEDY, max_decode_len=12).generate(Params(tp), inputs)
  for gamma in (1, 3):
    spec = Decoder(target, draft, Chain(gamma), GREEDY,
                   max_decode_len=12).generate(Params(tp, dp), inputs)
    np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN))
    np.testing.assert_array_equal(np.asarray(spec.lengths_B), np.asarray(ar.lengths_B))
    c = spec.counters
    assert int(np.sum(c.emitted_B)) == int(np.sum(ar.lengths_B))
    if vocab == 8 and gamma == 3:  # a random draft over 8 tokens is kept now and then
      assert int(np.sum(c.accepted_B)) > 0


def test_drafters_refuse_the_other_kind_of_draft():
  """`FeatureDrafter` with a token draft, `TokenDrafter` with a feature-level one: each refused
  by name when the Decoder is built, not when the program is traced."""
  target = Model(get_preset("t5_test_target"))
  with pytest.raises(TypeError, match="feature-level draft"):
    Decoder(target, Model(get_preset("t5_test_draft")), Chain(2), GREEDY, max_decode_len=4,
            drafter=FeatureDrafter())
  target, _, draft, _ = tiny_feature_pair("t5", 64)
  with pytest.raises(TypeError, match="is a feature-level draft"):
    Decoder(target, draft, Chain(2), GREEDY, max_decode_len=4, drafter=TokenDrafter())
  assert isinstance(Decoder(target, draft, Chain(2), GREEDY).drafter, FeatureDrafter)


def test_decoder_only_draft_starts_from_the_prompt_states():
  """`feature_entries.prime_carry` (via `start.init_state`): the first iteration's q is the draft's
  teacher-forced over the whole prompt at its last entry (h_{n-2}, t_{n-1}), as training saw
  it, for ragged rows; a one-token prompt keeps the start entry (zero feature, its token).
  Fails if the prompt's entries are not fed, are fed one slot off, or the wrong one pends."""
  target, tp, draft, dp = tiny_feature_pair("decoder", 64)
  lengths = [5, 2, 4, 1]
  _, prompts = ragged_prompts(lengths, extra=0)
  inputs = jnp.asarray(prompts)
  decoder = Decoder(target, draft, Chain(2), GREEDY, max_decode_len=8)
  state = start.init_state(decoder, Params(tp, dp), inputs, jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(state.draft_carry.count_B), [1, 1, 1, 0])
  got_BxV, _, _ = feature_entries.feature_first_call(draft, dp, state, state.draft_carry)
  _, hidden = target.forward_with_hidden(tp, inputs, inputs, draft.feature_layers)
  want, _ = draft.forward(dp, inputs, inputs[:, 1:], draft.fuse(dp, hidden[:, :-1]))
  alone, _ = draft.forward(dp, inputs, inputs[:, :1], jnp.zeros((4, 1, draft.width)))
  for b, n in enumerate(lengths):
    ref = want[b, n - 2] if n >= 2 else alone[b, 0]
    np.testing.assert_allclose(np.asarray(got_BxV[b]), np.asarray(ref), rtol=1e-4, atol=1e-4)


# ---- exactness at temperature > 0: the sampled joint equals the target's ---------------------
V, NUM_TOKENS, NUM_SAMPLES = 6, 3, 100_000
PROMPT = np.array([3, 5, 2, 1], np.int32)


def test_speculative_sampling_with_feature_draft_is_exact():
  target, tp, draft, dp = sharp_t5_feature_pair(V)
  sampling = SamplingConfig(temperature=1.0)
  inputs = jnp.asarray(np.broadcast_to(PROMPT, (NUM_SAMPLES, len(PROMPT))))
  out = Decoder(target, draft, Chain(2), sampling,
                max_decode_len=NUM_TOKENS).generate(Params(tp, dp), inputs, jax.random.key(0))
  assert np.all(np.asarray(out.lengths_B) == NUM_TOKENS)
  accepted, drafted = np.sum(out.counters.accepted_B), np.sum(out.counters.drafted_B)
  assert 0 < accepted < drafted  # both branches of the rule are exercised
  flat = np.ravel_multi_index(np.asarray(out.tokens_BxN[:, :NUM_TOKENS]).T, (V,) * NUM_TOKENS)
  counts = np.bincount(flat, minlength=V ** NUM_TOKENS)
  stat, dof, pvalue = chi_square_gof(
      counts, exact_joint(target, tp, PROMPT, NUM_TOKENS, sampling).ravel())
  assert pvalue > 1e-3, f"chi2={stat:.1f} dof={dof} p={pvalue:.2e}"
