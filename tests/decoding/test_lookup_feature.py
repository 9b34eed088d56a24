"""Prompt lookup where it matches, the feature draft elsewhere (`decoding/lookup_feature.py`'s
`LookupFeatureDrafter` with `Chain(lookup_gamma)`).

Why: the drafter switches between two drafts inside the one loop and lets the feature draft fall
behind while the lookup drafts, so the tests hold each piece that could silently go wrong: greedy
speculative = greedy autoregressive (T5 and decoder-only, batch > 1, ragged prompts, both
branches taken, catch-up over several calls); after lookup iterations the draft's first q equals
the teacher-forced draft's over the whole verified stream (a catch-up one entry off, a feature
logged at the wrong slot or an entry fed twice changes it); the sampled joint at T > 0 with top-k
equals the target's (chi-square), with both branches drawn; the refusals name the problem.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import lookup_feature, start
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.drafter import FeatureDrafter
from specdec_jax.decoding.lookup_feature import LookupFeatureDrafter
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.decoding.tree import TreeScheme
from specdec_jax.kernels import cache_write
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.feature_draft import FeatureDraft
from specdec_jax.models.feature_draft_config import FeatureDraftConfig
from specdec_jax.models import packed
from specdec_jax.models.model import Model
from specdec_jax.testing import (sharp_t5_feature_pair, teacher_forced_draft_logits,
                                 tiny_feature_pair, vmapped_law_pvalue)

GREEDY = SamplingConfig(temperature=0.0)
INPUTS = {
    "t5": np.array([[5, 6, 7, 1, 0], [3, 4, 1, 0, 0], [4, 4, 4, 4, 1], [7, 1, 0, 0, 0]]),
    "decoder": np.array([[5, 6, 7, 2, 0], [3, 4, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]]),
}


@pytest.mark.parametrize("kind", ["t5", "decoder"])
@pytest.mark.parametrize("lookup_ngram", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_greedy_lookup_feature_equals_autoregressive(kind, lookup_ngram):
  target, tp, draft, dp = tiny_feature_pair(kind, 8)
  inputs = jnp.asarray(INPUTS[kind], jnp.int32)
  ar = Decoder(target, sampling=GREEDY, max_decode_len=24).generate(Params(tp), inputs)
  used = []
  for batch in (inputs, inputs[2:3]):  # batch > 1 (the batch drafts with one of the two) and 1
    want = ar.tokens_BxN if batch.shape[0] == 4 else ar.tokens_BxN[2:3]
    drafter = LookupFeatureDrafter(draft_gamma=2, lookup_ngram=lookup_ngram, catchup_width=2)
    spec = Decoder(target, draft, Chain(3), GREEDY, max_decode_len=24,
                   drafter=drafter).generate(Params(tp, dp), batch)
    np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(want))
    assert int(np.sum(spec.counters.emitted_B)) == int(np.sum(spec.lengths_B))
    np.testing.assert_array_equal(np.asarray(spec.lengths_B),
                                  np.asarray(ar.lengths_B)[:batch.shape[0]] if batch.shape[0] == 4
                                  else np.asarray(ar.lengths_B)[2:3])
    used.append((int(np.max(spec.draft_stats["lookups_B"])),
                 int(np.max(spec.counters.target_calls_B))))
  lookups, calls = used[1]  # batch 1: its own choice every iteration
  assert 0 < lookups < calls, used  # both drafts drafted


def test_draft_catches_up_on_lookup_iterations():
  """Iterations drafted by the lookup leave the draft behind; its first q afterwards equals the
  teacher-forced draft's at the last verified entry, for rows with different lengths."""
  target = Model(get_preset("decoder_test_target", vocab_size=8, eos_id=-1))  # no row ends
  tp = target.init(jax.random.key(0))
  draft = FeatureDraft(FeatureDraftConfig.for_target(target.config, emb_dim=16, num_heads=2,
                                                     mlp_dim=32, eos_id=-1))
  dp = draft.with_target_pieces(draft.init(jax.random.key(1)), tp)
  inputs = jnp.asarray([[5, 6, 5, 6, 5], [3, 4, 3, 2, 3]], jnp.int32)
  drafter = LookupFeatureDrafter(draft_gamma=2, lookup_ngram=1, catchup_width=2)
  decoder = Decoder(target, draft, Chain(3), GREEDY, max_decode_len=20, drafter=drafter)
  params = Params(tp, dp)
  state = start.init_state(decoder, params, inputs, jax.random.key(0))
  step = jax.jit(lambda s: decoder.scheme.iteration(decoder, params, s))
  for _ in range(12):  # until a row is more than one catch-up call behind
    state = step(state)
    count_B = state.draft_carry.count_B
    if int(np.min(count_B)) > 3 and int(np.max(count_B)) > 5:
      break
  assert not np.any(np.asarray(state.done_B))
  assert int(np.max(state.draft_carry.count_B)) > 5, state.draft_carry.count_B
  got_BxV, _, _ = lookup_feature.first_call(draft, dp, state, state.draft_carry, 2, 2)
  for b in range(2):
    n = int(state.num_B[b])
    stream = np.asarray(state.tokens_BxL[b, 1:n])
    want = teacher_forced_draft_logits(target, tp, draft, dp, np.asarray(inputs[b]),
                                       stream)
    np.testing.assert_allclose(np.asarray(got_BxV[b]), want, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not cache_write.available(), reason="the kernel library is not built")
@pytest.mark.parametrize("max_decode_len", [8, 16])
def test_catch_up_near_the_buffer_end_fits_the_packed_drafts_cache(max_decode_len):
  """A catch-up call feeds `catchup_width` entries from the oldest pending one, past the
  verification slack near the buffer's end; the kernels' in-place cache write (a packed draft,
  as `draft_panels` runs it) refuses a block past the cache's end, so the draft's cache must be
  sized for it (`cache_slack`; HumanEval's run failed there: slots 978..993 of 991)."""
  target = Model(get_preset("decoder_test_target", vocab_size=8, eos_id=-1))  # no row ends
  tp = target.init(jax.random.key(0))
  draft = FeatureDraft(FeatureDraftConfig.for_target(target.config, emb_dim=16, num_heads=2,
                                                     mlp_dim=32, eos_id=-1))
  dp = draft.with_target_pieces(draft.init(jax.random.key(1)), tp)
  pdraft, pdp = packed.for_backend(draft, dp, "kernel", role="draft")
  inputs = jnp.asarray([[5, 6, 5, 6, 5], [3, 4, 3, 2, 3]], jnp.int32)
  ar = Decoder(target, sampling=GREEDY, max_decode_len=max_decode_len).generate(Params(tp), inputs)
  spec = Decoder(target, pdraft, Chain(3), GREEDY, max_decode_len=max_decode_len,
                 drafter=LookupFeatureDrafter(draft_gamma=2, lookup_ngram=2)
                 ).generate(Params(tp, pdp), inputs)
  np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN))
  lookups_B, calls_B = spec.draft_stats["lookups_B"], spec.counters.target_calls_B
  assert np.any(lookups_B > 0) and np.any(lookups_B < calls_B), (lookups_B, calls_B)  # both


# ---- exactness at temperature > 0: the sampled joint equals the target's ---------------------
V, NUM_TOKENS, NUM_SAMPLES = 6, 3, 60_000
PROMPT = np.array([3, 5, 2, 1], np.int32)


def test_speculative_sampling_with_lookup_or_draft_is_exact():
  """Each sample is its own batch-1 decode (vmapped), so each row chooses its own draft per
  iteration, as at batch 1; both choices occur among the samples."""
  models = sharp_t5_feature_pair(V)
  pvalue, out = vmapped_law_pvalue(models, SamplingConfig(temperature=1.0, top_k=5), Chain(2),
                                   PROMPT, NUM_TOKENS, NUM_SAMPLES,
                                   drafter=LookupFeatureDrafter(draft_gamma=2, lookup_ngram=1))
  lookups = np.asarray(out.draft_stats["lookups_B"])[:, 0]
  calls = np.asarray(out.counters.target_calls_B)[:, 0]
  assert 0.05 < np.mean(lookups > 0) and np.mean(lookups < calls) > 0.05  # both drafts used
  accepted, drafted = np.sum(out.counters.accepted_B), np.sum(out.counters.drafted_B)
  assert 0 < accepted < drafted
  assert pvalue > 1e-3, f"p={pvalue:.2e}"


def test_refusals_name_the_problem():
  target, tp, draft, dp = tiny_feature_pair("decoder", 8)
  with pytest.raises(ValueError, match="lookup_ngram"):
    LookupFeatureDrafter(draft_gamma=2, lookup_ngram=4)
  with pytest.raises(ValueError, match="draft_gamma must be"):
    LookupFeatureDrafter(draft_gamma=0)
  with pytest.raises(ValueError, match="parallel"):
    LookupFeatureDrafter(draft_gamma=2, parallel=True)
  with pytest.raises(ValueError, match="verify width .* >= draft_gamma"):
    Decoder(target, draft, Chain(3), GREEDY, max_decode_len=4,
            drafter=LookupFeatureDrafter(draft_gamma=4))
  with pytest.raises(ValueError, match="chain"):  # a tree is drafted level by level
    Decoder(target, draft, TreeScheme((2, 1)), GREEDY, max_decode_len=4,
            drafter=LookupFeatureDrafter(draft_gamma=2))
  token_draft = Model(get_preset("decoder_test_draft", vocab_size=8))
  with pytest.raises(TypeError, match="feature-level draft"):
    Decoder(target, token_draft, Chain(3), GREEDY, max_decode_len=4,
            drafter=LookupFeatureDrafter(draft_gamma=2))
  assert isinstance(LookupFeatureDrafter(), FeatureDrafter)  # a feature drafter's options
  del tp, dp
