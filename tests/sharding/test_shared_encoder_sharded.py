"""A shared-encoder draft on a mesh decodes exactly what it decodes on one device.

Why: on a mesh the target's encoder output is sharded by the target's rules and the draft reads
it under its own (fewer chips); the Encoded handed across must reach the draft's prefill intact.
"""
import functools

import jax
import numpy as np
import pytest

from sharding_tiny import MAX_LEN, tiny_inputs, tiny_models
from specdec_jax import sharding as sh
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model


@functools.lru_cache(maxsize=None)
def _models():
  target, tp, _, _ = tiny_models()
  draft = Model(get_preset("t5_test_shared_draft", num_heads=8, head_dim=2, eos_id=63,
                           source_dim=target.config.emb_dim))
  return target, tp, draft, draft.init(jax.random.key(3))


@pytest.mark.parametrize("temperature", [pytest.param(0.0, marks=pytest.mark.slow), 1.0])
def test_shared_encoder_draft_sharded_equals_unsharded(temperature):
  t, tp, d, dp = _models()
  inputs, rng = tiny_inputs(), jax.random.key(1)
  sampling = SamplingConfig(temperature=temperature)
  ref = jax.device_get(Decoder(t, d, Chain(3), sampling, max_decode_len=MAX_LEN).generate(
      Params(tp, dp), inputs, rng))
  p = sh.shard_models(t, tp, d, dp, mesh_config=sh.MeshConfig(2, 2, 2), batch_size=len(inputs))
  decoder = Decoder(p.target, p.draft, Chain(3), sampling, max_decode_len=MAX_LEN, mesh=p.mesh)
  got = jax.device_get(decoder.generate(Params(p.target_params, p.draft_params), inputs, rng))
  np.testing.assert_array_equal(got.tokens_BxN, ref.tokens_BxN)
  np.testing.assert_array_equal(got.lengths_B, ref.lengths_B)
  np.testing.assert_array_equal(got.counters.accepted_B, ref.counters.accepted_B)
