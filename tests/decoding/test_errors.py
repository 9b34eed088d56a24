"""Bad input raises an error that names the problem, before anything is compiled."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model
from specdec_jax.testing import tiny_pair

INPUTS = jnp.asarray(np.array([[5, 6, 7, 2, 0], [8, 9, 3, 0, 0]]), jnp.int32)


@pytest.fixture(scope="module")
def pair():
  return tiny_pair("decoder")


def _spec(pair, **kw):
  target, tp, draft, dp = pair
  args = dict(gamma=3, sampling=SamplingConfig(temperature=1.0), max_decode_len=8)
  args.update(kw)
  gamma, sampling = args.pop("gamma"), args.pop("sampling")
  return Decoder(target, draft, Chain(gamma), sampling, **args).generate(Params(tp, dp), INPUTS)


@pytest.mark.parametrize("gamma", [0, -2, 2.5])
def test_gamma_below_one(pair, gamma):
  with pytest.raises(ValueError, match=r"gamma .* must be an integer >= 1, got"):
    _spec(pair, gamma=gamma)


@pytest.mark.parametrize("kw,match", [
    (dict(temperature=-0.5), r"temperature must be finite and >= 0 .* got -0.5"),
    (dict(temperature=float("nan")), r"temperature must be finite and >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\] .* got 0.0"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\] .* got 1.5"),
    (dict(top_k=-1), r"top_k must be an integer >= 0"),
])
def test_bad_sampling_settings(kw, match):
  with pytest.raises(ValueError, match=match):
    SamplingConfig(**kw)


def test_vocabulary_mismatch(pair):
  target, tp, _, _ = pair
  small = Model(get_preset("decoder_test_draft", vocab_size=32))
  with pytest.raises(ValueError, match=r"vocabularies differ in size: draft 32 vs target 64"):
    Decoder(target, small, Chain(2), SamplingConfig(), max_decode_len=4).generate(
        Params(tp, small.init(jax.random.key(0))), INPUTS)


def test_prompt_longer_than_cache(pair):
  target, tp, _, _ = pair
  with pytest.raises(ValueError, match=r"prompt of length 5 .* needs \d+ cache slots, but the "
                                       r"cache has 6"):
    _spec(pair, cache_len=6)
  with pytest.raises(ValueError, match=r"prompt of length 5 .* cache has 6"):
    Decoder(target, sampling=SamplingConfig(), max_decode_len=4, cache_len=6).generate(
        Params(tp), INPUTS)


def test_unknown_acceptance_rule(pair):
  with pytest.raises(ValueError, match=r"unknown acceptance rule 'tokenwize'.*tokenwise"):
    _spec(pair, rule="tokenwize")


def test_max_decode_len(pair):
  with pytest.raises(ValueError, match=r"max_decode_len must be an integer >= 1, got 0"):
    _spec(pair, max_decode_len=0)
