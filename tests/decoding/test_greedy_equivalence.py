"""Greedy speculative output must equal greedy autoregressive output, token for token.

Why: at temperature 0 both p and q are one-hot argmax distributions, so the acceptance rule keeps
a draft token exactly when it is the target's argmax and the correction is the target's argmax.
Any difference points at the cache rollback, the draft catch-up after a full accept, the buffer
commit or EOS/length handling; users of other engines hit exactly these (PEERS.md, items 3, 6).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.testing import AlwaysWrong, EosAt, tiny_pair

GREEDY = SamplingConfig(temperature=0.0)
MAX_LEN = 14
INPUTS = {
    "t5": np.array([[5, 6, 7, 1, 0], [8, 9, 1, 0, 0], [4, 4, 4, 4, 1], [7, 1, 0, 0, 0]]),
    "decoder": np.array([[5, 6, 7, 2, 0], [8, 9, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]]),
}
INPUTS["llama"] = INPUTS["decoder"]  # rotary, grouped-query, the draft's head tied


def _ar(model, params, inputs, *, sampling, max_decode_len):
  return Decoder(model, sampling=sampling, max_decode_len=max_decode_len).generate(
      Params(params), inputs)


def _spec(target, tp, draft, dp, inputs, *, gamma, sampling, max_decode_len):
  return Decoder(target, draft, Chain(gamma), sampling, max_decode_len=max_decode_len).generate(
      Params(tp, dp), inputs)


def _assert_same(spec, ar):
  np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(spec.lengths_B), np.asarray(ar.lengths_B))


@pytest.fixture(scope="module", params=["t5", "decoder", "llama"])
def setup(request):
  target, tp, draft, dp = tiny_pair(request.param)
  inputs = jnp.asarray(INPUTS[request.param], jnp.int32)
  ar = _ar(target, tp, inputs, sampling=GREEDY, max_decode_len=MAX_LEN)
  return target, tp, draft, dp, inputs, ar


def test_identical_draft_accepts_everything(setup):
  target, tp, _, _, inputs, ar = setup
  spec = _spec(target, tp, target, tp, inputs, gamma=3, sampling=GREEDY,
               max_decode_len=MAX_LEN)
  _assert_same(spec, ar)
  c = spec.counters
  assert np.all(np.asarray(c.accepted_B) == np.asarray(c.drafted_B))
  # 14 tokens at 4 per target call (3 accepted + bonus) take 4 iterations.
  assert int(c.iterations) == 4
  np.testing.assert_allclose(np.asarray(c.beta_sum_B / c.beta_count_B), 1.0)


@pytest.mark.parametrize("gamma", [1, 4])
def test_random_draft(setup, gamma):
  target, tp, draft, dp, inputs, ar = setup
  spec = _spec(target, tp, draft, dp, inputs, gamma=gamma, sampling=GREEDY,
               max_decode_len=MAX_LEN)
  _assert_same(spec, ar)


def test_always_wrong_draft_emits_one_token_per_call(setup):
  target, tp, _, _, inputs, ar = setup
  wrong = AlwaysWrong(target)
  spec = _spec(target, tp, wrong, tp, inputs, gamma=3, sampling=GREEDY,
               max_decode_len=MAX_LEN)
  _assert_same(spec, ar)
  assert int(np.asarray(spec.counters.accepted_B).sum()) == 0
  assert int(spec.counters.iterations) == MAX_LEN


def test_batch_with_different_acceptance_per_example():
  """Rows 0 and 2 draft with the target itself, rows 1 and 3 with an always-wrong draft: the
  per-example cache indices then diverge every iteration."""
  target, tp, _, _ = tiny_pair("decoder")
  inputs = jnp.asarray(INPUTS["decoder"], jnp.int32)
  ar = _ar(target, tp, inputs, sampling=GREEDY, max_decode_len=MAX_LEN)
  mixed = _RowMixed(target)
  spec = _spec(target, tp, mixed, tp, inputs, gamma=3, sampling=GREEDY,
               max_decode_len=MAX_LEN)
  _assert_same(spec, ar)
  acc = np.asarray(spec.counters.accepted_B)
  assert acc[0] > 0 and acc[2] > 0 and acc[1] == 0 and acc[3] == 0


def test_eos_inside_a_block_ends_the_example_there():
  """EOS forced at different generated positions per row lands inside verification blocks."""
  target, tp, _, _ = tiny_pair("t5")
  slots = (5, 2, 9, 13)  # T5 decoder slot j+1 holds generated token j
  eos_target = EosAt(target, slots=slots)
  inputs = jnp.asarray(INPUTS["t5"], jnp.int32)
  ar = _ar(eos_target, tp, inputs, sampling=GREEDY, max_decode_len=MAX_LEN)
  np.testing.assert_array_equal(np.asarray(ar.lengths_B), np.minimum(np.array(slots) + 1, MAX_LEN))
  spec = _spec(eos_target, tp, eos_target, tp, inputs, gamma=4, sampling=GREEDY,
               max_decode_len=MAX_LEN)
  _assert_same(spec, ar)
  toks = np.asarray(spec.tokens_BxN)
  for b, n in enumerate(np.asarray(spec.lengths_B)):
    assert toks[b, n - 1] == 1 or n == MAX_LEN
    assert np.all(toks[b, n:] == 0)  # finished examples stop writing


class _RowMixed(AlwaysWrong):
  """Identical to the base model on even rows, negated on odd rows."""

  def extend(self, params, cache, tokens_BxT):
    logits, cache = self.base.extend(params, cache, tokens_BxT)
    odd_B = (jnp.arange(logits.shape[0]) % 2) == 1
    return jnp.where(odd_B[:, None, None], -logits, logits), cache
