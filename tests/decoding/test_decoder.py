"""The Decoder: one description of a decode, the schemes as its only variable part.

Why: every decode (autoregressive, chain, adaptive, sharded, the calibration's capped decode) is
the same program around a different iteration. These tests pin what that buys: equal decoders
share one compiled program, a capped run is a prefix of the full run, a new scheme plugs in
without copying the loop, and a decoder that cannot work is refused when it is made.
"""
import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import state as st
from specdec_jax.decoding.adaptive import AdaptiveConfig
from specdec_jax.decoding.autoregressive import Autoregressive
from specdec_jax.decoding.decoder import Decoder, Params, decode_program
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.testing import tiny_pair

INPUTS = np.array([[5, 6, 1, 0], [7, 8, 9, 1]], np.int32)


@pytest.fixture(scope="module")
def pair():
  return tiny_pair("decoder")


def test_equal_decoders_share_one_compiled_program(pair):
  target, tp, draft, dp = pair
  before = decode_program._cache_size()
  for _ in range(2):  # two separately built, equal decoders
    Decoder(target, draft, Chain(3), max_decode_len=10).generate(Params(tp, dp), INPUTS)
  assert decode_program._cache_size() == before + 1


def test_capped_run_is_a_prefix_of_the_full_run(pair):
  target, tp, draft, dp = pair
  decoder = Decoder(target, draft, Chain(2), SamplingConfig(temperature=1.0), max_decode_len=12)
  rng = jax.random.key(3)
  full = decoder.generate(Params(tp, dp), INPUTS, rng)
  assert int(full.counters.iterations) > 2
  for cap in (0, 1, 2):
    part = decoder.generate(Params(tp, dp), INPUTS, rng, max_iterations=cap)
    assert int(part.counters.iterations) == cap
    for b in range(INPUTS.shape[0]):
      n = int(part.lengths_B[b])
      np.testing.assert_array_equal(part.tokens_BxN[b, :n], full.tokens_BxN[b, :n])
  uncapped = decoder.generate(Params(tp, dp), INPUTS, rng, max_iterations=10 ** 6)
  np.testing.assert_array_equal(uncapped.tokens_BxN, full.tokens_BxN)


@flax.struct.dataclass
class _Calls:
  iterations: jax.Array


@dataclasses.dataclass(frozen=True)
class CountingChain(Chain):
  """A scheme written outside the package: the chain, plus its own statistics."""

  def init_stats(self, batch):
    return _Calls(jnp.zeros((batch,), jnp.int32))

  def iteration(self, decoder, params, state):
    calls = state.stats.iterations + (~state.done_B).astype(jnp.int32)
    return super().iteration(decoder, params, state.replace(stats=None)).replace(
        stats=_Calls(calls))


@pytest.mark.parametrize("kind", ["t5", "decoder"])
def test_a_new_scheme_plugs_in_without_copying_the_loop(kind):
  target, tp, draft, dp = tiny_pair(kind)
  ar = Decoder(target, max_decode_len=10).generate(Params(tp), INPUTS)
  res = Decoder(target, draft, CountingChain(3), max_decode_len=10).generate(Params(tp, dp), INPUTS)
  np.testing.assert_array_equal(res.tokens_BxN, ar.tokens_BxN)
  np.testing.assert_array_equal(res.stats.iterations, res.counters.target_calls_B)


def test_pieces_compose_to_generate(pair):
  """init -> iteration until done -> finish equals generate (the pieces are the program)."""
  target, tp, draft, dp = pair
  decoder = Decoder(target, draft, AdaptiveConfig(gamma_max=4), max_decode_len=10)
  params = Params(tp, dp)
  rng = jax.random.key(0)
  state = decoder.init(params, jnp.asarray(INPUTS), rng)
  step = jax.jit(decoder.iteration)
  while not bool(jnp.all(state.done_B)):
    state = step(params, state)
  mine = decoder.finish(state)
  res = decoder.generate(params, INPUTS, rng)
  np.testing.assert_array_equal(mine.tokens_BxN, res.tokens_BxN)
  np.testing.assert_array_equal(mine.stats.proposed_hist, res.stats.proposed_hist)
  assert isinstance(res, st.DecodeResult)


def test_refused_when_made(pair):
  target, tp, draft, dp = pair
  with pytest.raises(ValueError, match="needs a draft"):
    Decoder(target, None, Chain(2))
  with pytest.raises(ValueError, match="target alone"):
    Decoder(target, draft, Autoregressive())
  with pytest.raises(ValueError, match="gamma"):
    Chain(0)
  with pytest.raises(ValueError, match="max_decode_len"):
    Decoder(target, max_decode_len=0)
  with pytest.raises(ValueError, match="rule"):
    Decoder(target, draft, Chain(2), rule="nonsense")
  with pytest.raises(ValueError, match="finite"):
    SamplingConfig(temperature=float("inf"))
