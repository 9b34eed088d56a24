"""Prompt lookup where it matches, a self-draft elsewhere, drafting in the target's cache
(`decoding/lookup_token.py`'s `LookupTokenDrafter`, `TokenDrafter(prompt_cache='shared')`).

Why: the draft has no cache of its own; it writes its drafts into the target's, which the verify
call then overwrites, and it skips whole iterations while the lookup drafts. So the tests hold
what could silently go wrong: greedy speculative = greedy autoregressive (batch > 1, ragged
prompts, both drafts used, the packed kernels' in-place cache writes near the buffer's end); the
draft's q after lookup iterations is the one the target's cache gives (nothing to catch up); the
sampled joint at T = 1 is the target's (chi-square), with both drafts drawn; the loop carries one
cache; the refusals name the problem.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import draft_schemes, start
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.drafter import TokenDrafter
from specdec_jax.decoding.lookup_token import LookupTokenDrafter
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.decoding.tree import TreeScheme
from specdec_jax.kernels import cache_write
from specdec_jax.models import packed
from specdec_jax.models.model import Model
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model_free import PromptLookupDraft
from specdec_jax.testing import tiny_pair, vmapped_law_pvalue

GREEDY = SamplingConfig(temperature=0.0)
INPUTS = np.array([[5, 6, 7, 5, 6, 0], [3, 4, 3, 4, 3, 4], [9, 9, 9, 0, 0, 0], [7, 0, 0, 0, 0, 0]],
                  np.int32)


def _self_pair(vocab_size=16, noise=0.05, seed=0):
  """(target, params, the same model, params perturbed): a self-draft whose q is not p. A small
  vocabulary, so outputs repeat n-grams and the lookup matches."""
  target = Model(get_preset("decoder_test_target", vocab_size=vocab_size, eos_id=-1))
  tp = target.init(jax.random.key(seed))
  leaves, tree = jax.tree_util.tree_flatten(tp)
  keys = jax.random.split(jax.random.key(seed + 7), len(leaves))
  dp = jax.tree_util.tree_unflatten(tree, [
      x + noise * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
      for x, k in zip(leaves, keys)])
  return target, tp, target, dp


@pytest.mark.parametrize("lookup_ngram", [1, 2])
def test_greedy_lookup_token_equals_autoregressive(lookup_ngram):
  target, tp, draft, dp = _self_pair()
  inputs = jnp.asarray(INPUTS)
  ar = Decoder(target, sampling=GREEDY, max_decode_len=24).generate(Params(tp), inputs)
  used = []
  for rows in (slice(0, 4), slice(1, 2)):  # batch > 1 (one draft side for all) and batch 1
    drafter = LookupTokenDrafter(draft_gamma=2, lookup_ngram=lookup_ngram)
    spec = Decoder(target, draft, Chain(3), GREEDY, max_decode_len=24,
                   drafter=drafter).generate(Params(tp, dp), inputs[rows])
    np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN[rows]))
    np.testing.assert_array_equal(np.asarray(spec.lengths_B), np.asarray(ar.lengths_B[rows]))
    assert int(np.sum(spec.counters.emitted_B)) == int(np.sum(spec.lengths_B))
    used.append((int(np.max(spec.draft_stats["lookups_B"])),
                 int(np.max(spec.counters.target_calls_B))))
  lookups, calls = used[1]
  assert 0 < lookups < calls, used  # both drafts drafted


def test_the_loop_carries_one_cache_and_the_draft_reads_the_targets():
  """Under 'shared' the state holds no draft cache; after iterations of both kinds the draft's
  first q is the one its own model gives on the target's cache of the whole verified stream
  (so nothing was left to catch up)."""
  target, tp, draft, dp = _self_pair()
  inputs = jnp.asarray(INPUTS[:2])
  decoder = Decoder(target, draft, Chain(3), GREEDY, max_decode_len=20,
                    drafter=LookupTokenDrafter(draft_gamma=2, lookup_ngram=1))
  params = Params(tp, dp)
  state = start.init_state(decoder, params, inputs, jax.random.key(0))
  assert state.draft_cache is None
  step = jax.jit(lambda s: decoder.scheme.iteration(decoder, params, s))
  for _ in range(4):
    state = step(state)
  assert state.draft_cache is None
  lookups_B = np.asarray(state.draft_carry.lookups_B)
  assert 0 < int(lookups_B[0]) < 4 or 0 < int(lookups_B[1]) < 4, lookups_B
  got_BxV, _, _, _ = decoder.drafter.first_call(decoder, dp, state)
  for b in range(2):
    n, plen = int(state.num_B[b]), int(np.sum(INPUTS[b] != 0))
    stream = np.concatenate([INPUTS[b, :plen], np.asarray(state.tokens_BxL[b, 1:n])])
    # The draft's call on the target's keys and values of every earlier position: the target's
    # prefill of the whole stream (which leaves its last token unfed, as a prompt's), then the
    # draft's extend over that token.
    cache = target.prefill(tp, jnp.asarray(stream[None, :]), len(stream) + 4)
    want, _ = draft.extend(dp, cache, jnp.asarray(stream[None, -1:]))
    np.testing.assert_allclose(np.asarray(got_BxV[b]), np.asarray(want[0, 0]), rtol=1e-4,
                               atol=1e-4)


@pytest.mark.skipif(not cache_write.available(), reason="the kernel library is not built")
@pytest.mark.parametrize("max_decode_len", [8, 16])
def test_packed_self_draft_in_the_targets_cache_equals_autoregressive(max_decode_len):
  """The kernels write the cache in place and refuse a block past its end: the int8 self-draft
  (as the SmolLM2 runs use it) drafting in the packed target's cache, to the buffer's end."""
  target, tp, _, _ = _self_pair()
  ptarget, ptp = packed.for_backend(target, tp, "kernel")
  pdraft, pdp = packed.for_backend(target, tp, "kernel", panels="int8", role="draft")
  inputs = jnp.asarray(INPUTS)
  ar = Decoder(ptarget, sampling=GREEDY, max_decode_len=max_decode_len).generate(
      Params(ptp), inputs)
  for drafter in (TokenDrafter("shared"), LookupTokenDrafter(draft_gamma=2, lookup_ngram=1)):
    spec = Decoder(ptarget, pdraft, Chain(3), GREEDY, max_decode_len=max_decode_len,
                   drafter=drafter).generate(Params(ptp, pdp), inputs)
    np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN))


def test_speculative_sampling_with_lookup_or_self_draft_is_exact():
  """Chi-square over every 3-token continuation (vocabulary 6), T = 1, each sample its own
  batch-1 decode (vmapped) so each chooses its draft per iteration; both choices occur."""
  cfg = get_preset("decoder_test_draft", vocab_size=6, emb_dim=16, num_decoder_layers=1,
                   eos_id=-1)
  target = Model(cfg)
  tp = jax.tree_util.tree_map(lambda x: 2.0 * x, target.init(jax.random.key(11)))
  dp = jax.tree_util.tree_map(lambda x, y: x + 0.5 * y, tp, target.init(jax.random.key(12)))
  pvalue, out = vmapped_law_pvalue((target, tp, target, dp), SamplingConfig(temperature=1.0),
                                   Chain(2), np.array([3, 5, 3, 5], np.int32), 3, 60_000,
                                   drafter=LookupTokenDrafter(draft_gamma=1, lookup_ngram=1))
  lookups = np.asarray(out.draft_stats["lookups_B"])[:, 0]
  calls = np.asarray(out.counters.target_calls_B)[:, 0]
  assert 0.05 < np.mean(lookups > 0) and np.mean(lookups < calls) > 0.05  # both drafts used
  accepted, drafted = np.sum(out.counters.accepted_B), np.sum(out.counters.drafted_B)
  assert 0.1 * drafted < accepted < 0.98 * drafted
  assert pvalue > 1e-3, f"p={pvalue:.2e}"


def test_refusals_name_the_problem():
  target, tp, draft, dp = _self_pair()
  with pytest.raises(ValueError, match="lookup_ngram"):
    LookupTokenDrafter(draft_gamma=2, lookup_ngram=4)
  with pytest.raises(ValueError, match="draft_gamma must be"):
    LookupTokenDrafter(draft_gamma=0)
  with pytest.raises(ValueError, match="'shared'"):
    LookupTokenDrafter(prompt_cache="own")
  with pytest.raises(ValueError, match="verify width .* >= draft_gamma"):
    Decoder(target, draft, Chain(3), GREEDY, max_decode_len=4,
            drafter=LookupTokenDrafter(draft_gamma=4))
  for drafter in (LookupTokenDrafter(draft_gamma=2), TokenDrafter("shared")):
    with pytest.raises(ValueError, match="drafts a chain in the target's cache"):
      Decoder(target, draft, TreeScheme((2, 1)), GREEDY, max_decode_len=4, drafter=drafter)
  small, _, other, _ = tiny_pair("decoder")  # another architecture: no cache of the target's
  with pytest.raises(ValueError, match="laid out as the target's"):
    Decoder(small, other, Chain(3), GREEDY, max_decode_len=4,
            drafter=LookupTokenDrafter(draft_gamma=2))
  del tp, dp


def test_plan_builds_it_for_a_model_token_draft_and_leaves_lookups_alone():
  target, _, draft, _ = _self_pair()
  assert draft_schemes.plan(draft, 3, lookup_gamma=5, lookup_ngram=3) == (
      Chain(5), LookupTokenDrafter(draft_gamma=3, lookup_ngram=3))
  assert draft_schemes.plan(draft, 3, prompt_cache="shared") == (Chain(3),
                                                                 TokenDrafter("shared"))
  lookup = PromptLookupDraft(vocab_size=16)
  assert draft_schemes.plan(lookup, 3, lookup_gamma=5) == (Chain(3), None)
  with pytest.raises(ValueError, match="prompt_cache 'shared'"):
    draft_schemes.plan(draft, 3, lookup_gamma=5, prompt_cache="own")
  del target
