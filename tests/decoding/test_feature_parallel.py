"""The parallel feature chain (`FeatureDrafter(parallel=True)`, `decoding/drafter.py`): one draft
call proposes the whole block; greedy speculative = greedy autoregressive, T5 and decoder-only,
batch 4 with ragged prompts.

Why: the block's tokens are drawn from per-position marginals read at mask entries placed after
each row's own number of pending entries; an off-by-one there, in the draft cache's rollback or
in the proposal's bookkeeping would change outputs. A random draft over 8 tokens is kept often
enough for full and partial acceptances to occur.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.drafter import FeatureDrafter
from specdec_jax.decoding.feature_entries import block_entries
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.decoding.tree import TreeScheme
from specdec_jax.testing import tiny_feature_pair

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
def test_greedy_parallel_feature_chain_equals_autoregressive(kind, vocab):
  target, tp, draft, dp = _pair(kind, vocab)
  inputs = jnp.asarray(np.minimum(INPUTS[kind], vocab - 1), jnp.int32)
  ar = Decoder(target, sampling=GREEDY, max_decode_len=12).generate(Params(tp), inputs)
  for gamma in (1, 3):
    spec = Decoder(target, draft, Chain(gamma), GREEDY, max_decode_len=12,
                   drafter=FeatureDrafter(parallel=True)).generate(Params(tp, dp), inputs)
    np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN))
    np.testing.assert_array_equal(np.asarray(spec.lengths_B), np.asarray(ar.lengths_B))
    assert int(np.sum(spec.counters.emitted_B)) == int(np.sum(ar.lengths_B))
    if vocab == 8 and gamma == 3:
      assert int(np.sum(spec.counters.accepted_B)) > 0


def test_block_entries_put_the_masks_after_each_rows_pending_entries():
  from specdec_jax.decoding import state as st  # pylint: disable=import-outside-toplevel
  from specdec_jax.decoding.feature_entries import FeatureCarry  # pylint: disable=import-outside-toplevel
  tokens = jnp.asarray([[9, 5, 6, 7, 0, 0, 0, 0], [9, 3, 0, 0, 0, 0, 0, 0]], jnp.int32)
  state = st.DecodeState.__new__(st.DecodeState)
  object.__setattr__(state, "tokens_BxL", tokens)
  object.__setattr__(state, "num_B", jnp.asarray([4, 2], jnp.int32))
  carry = FeatureCarry(jnp.ones((2, 4, 2), jnp.float32), jnp.asarray([3, 0], jnp.int32))
  toks, g, first = block_entries(state, carry, gamma=3, mask_id=99)
  assert toks.tolist() == [[5, 6, 7, 99, 99, 99], [3, 99, 99, 99, 99, 99]]
  assert first.tolist() == [2, 0]
  assert g[0, :3].sum() == 6 and g[0, 3:].sum() == 0 and g[1, 1:].sum() == 0


def test_the_parallel_block_is_a_chains_only():
  """A tree drafts level by level from each parent's output: the one-call block cannot draft it,
  so the pair is refused by name when the Decoder is built."""
  target, _, draft, _ = _pair("decoder", 8)
  with pytest.raises(ValueError, match="parallel"):
    Decoder(target, draft, TreeScheme((2, 1)), GREEDY, max_decode_len=4,
            drafter=FeatureDrafter(parallel=True))
