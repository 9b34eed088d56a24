"""After a partial accept, both caches equal caches built from the accepted prefix alone.

Why: rollback only moves each example's index back; the rejected draft tokens' keys/values stay in
the slots past it and are overwritten later. This is exact only if every slot below the index
holds what a clean decode of the accepted tokens would have written (for the target, and for the
draft, which is one token behind after a full accept). The test runs real iterations with a
random draft (so examples accept different, partial counts) and rebuilds both caches per example
from the committed tokens alone.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.testing import tiny_pair

GAMMA = 4
MAX_LEN = 12
INPUTS = {
    "t5": np.array([[5, 6, 7, 1, 0], [8, 9, 1, 0, 0], [4, 4, 4, 4, 1], [7, 1, 0, 0, 0]]),
    "decoder": np.array([[5, 6, 7, 2, 0], [8, 9, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]]),
}


def _reference_caches(model, params, inputs, fed_lists, cache_len):
  """Per example: prefill, then feed that example's tokens one T=1 call at a time, then set the
  index to the number fed. Slots past an example's own tokens get padding, then lie past its
  index, where nothing is compared (and attention never looks)."""
  extend = jax.jit(model.extend)
  cache = jax.jit(model.prefill, static_argnums=2)(params, inputs, cache_len)
  start_B = cache.index_B
  longest = max(len(f) for f in fed_lists)
  padded = np.zeros((len(fed_lists), max(longest, 1)), np.int32)
  for b, fed in enumerate(fed_lists):
    padded[b, :len(fed)] = fed
  for j in range(longest):
    _, cache = extend(params, cache, jnp.asarray(padded[:, j:j + 1]))
  return cache.rollback(start_B + jnp.asarray([len(f) for f in fed_lists], jnp.int32))


def _assert_prefix_equal(got, ref, b, what):
  index = int(got.index_B[b])
  assert index == int(ref.index_B[b]), f"{what}: index {index} != {int(ref.index_B[b])}"
  for layer, (lg, lr) in enumerate(zip(got.self_kv, ref.self_kv)):
    for name, xg, xr in zip("kv", lg.slots(), lr.slots()):  # [B, S, H, K]
      np.testing.assert_allclose(np.asarray(xg[b, :index]), np.asarray(xr[b, :index]),
                                 rtol=1e-5, atol=1e-5, err_msg=f"{what} layer {layer} {name}")


@pytest.mark.parametrize("kind,temperature,same_draft", [
    ("t5", 0.0, False),       # partial accepts, greedy
    ("decoder", 1.0, False),  # partial accepts, sampled (residual corrections)
    ("decoder", 0.0, True),   # draft = target: every token accepted, the draft lags one token
])
def test_caches_equal_rebuilt_from_accepted_prefix(kind, temperature, same_draft):
  target, tp, draft, dp = tiny_pair(kind, seed=3)
  if same_draft:
    draft, dp = target, tp
  inputs = jnp.asarray(INPUTS[kind], jnp.int32)
  sampling = SamplingConfig(temperature=temperature)
  decoder = Decoder(target, draft, Chain(GAMMA), sampling, rule="tokenwise",
                    max_decode_len=MAX_LEN)
  params = Params(tp, dp)
  step = jax.jit(lambda s: decoder.iteration(params, s))
  state = decoder.init(params, inputs, jax.random.key(7))
  saw_partial, saw_pending = False, False
  for _ in range(3):
    before, active = np.asarray(state.counters.accepted_B), ~np.asarray(state.done_B)
    state = step(state)
    accepted = np.asarray(state.counters.accepted_B) - before
    # A row that was already done accepts nothing and rolls nothing back: not a partial accept.
    saw_partial |= bool(np.any(active & (accepted < GAMMA)))
    pending = np.asarray(state.draft_pending_B)
    saw_pending |= bool(pending.any())
    tokens, num = np.asarray(state.tokens_BxL), np.asarray(state.num_B)
    # Buffer slot 0 is the start token; the newest committed token has not been fed yet, and
    # after a full accept the draft has not seen the one before it either (draft_pending).
    fed_target = [tokens[b, :num[b] - 1] for b in range(len(num))]
    fed_draft = [tokens[b, :num[b] - 1 - pending[b]] for b in range(len(num))]
    t_ref = _reference_caches(target, tp, inputs, fed_target, state.target_cache.length)
    d_ref = _reference_caches(draft, dp, inputs, fed_draft, state.draft_cache.length)
    for b in range(inputs.shape[0]):
      if not bool(state.done_B[b]):  # a finished row keeps its caches as they were at the end
        _assert_prefix_equal(state.target_cache, t_ref, b, f"target, example {b}")
        _assert_prefix_equal(state.draft_cache, d_ref, b, f"draft, example {b}")
  if same_draft:
    assert saw_pending, "no full accept: the draft catch-up went untested"
  else:
    assert saw_partial, "no partial accept happened: the test would not exercise rollback"
