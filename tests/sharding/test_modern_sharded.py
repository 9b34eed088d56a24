"""The modern decoder family on a mesh decodes exactly what it decodes on one device.

Why: rotary tables, grouped key/value heads (the cache and the k/v kernels kv_heads wide,
sharded over the same model axes as the query heads), q/k/v biases and a tied head reading a
vocab-sharded embedding are new sharded arrays; the draft sits on fewer chips than the target.
"""
import functools

import jax
import numpy as np
import pytest

from sharding_tiny import MAX_LEN, tiny_inputs
from specdec_jax import sharding as sh
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model


@functools.lru_cache(maxsize=None)
def _models():
  """Target: 8 query heads over 4 key/value heads (model axes 2 x 2); draft: 4 over 2, tied,
  with q/k/v biases (model_inner 2)."""
  target = Model(get_preset("llama_test_target", num_heads=8, num_kv_heads=4, head_dim=4,
                            eos_id=63, num_decoder_layers=1))
  draft = Model(get_preset("llama_test_draft", num_heads=4, num_kv_heads=2, head_dim=4,
                           eos_id=63, qkv_bias=True))
  k1, k2 = jax.random.split(jax.random.key(5))
  dp = draft.init(k2)
  dp = jax.tree.map(lambda x: x + 0.1, dp)  # nonzero biases
  return target, target.init(k1), draft, dp


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_modern_pair_sharded_equals_unsharded(temperature):
  t, tp, d, dp = _models()
  inputs, rng = tiny_inputs(), jax.random.key(1)
  sampling = SamplingConfig(temperature=temperature)
  ref = jax.device_get(Decoder(t, d, Chain(3), sampling, max_decode_len=MAX_LEN).generate(
      Params(tp, dp), inputs, rng))
  p = sh.shard_models(t, tp, d, dp, mesh_config=sh.MeshConfig(2, 2, 2), batch_size=len(inputs))
  kv = p.target_params["decoder"]["layers_0"]["self_attention"]["key"]["kernel"]
  assert kv.sharding.spec[1] == ("model_outer", "model_inner")  # kv heads split 4 ways
  decoder = Decoder(p.target, p.draft, Chain(3), sampling, max_decode_len=MAX_LEN, mesh=p.mesh)
  got = jax.device_get(decoder.generate(Params(p.target_params, p.draft_params), inputs, rng))
  np.testing.assert_array_equal(got.tokens_BxN, ref.tokens_BxN)
  np.testing.assert_array_equal(got.lengths_B, ref.lengths_B)
  np.testing.assert_array_equal(got.counters.accepted_B, ref.counters.accepted_B)


def test_kv_heads_fewer_than_the_model_chips_are_replicated():
  """Target 8 query heads over 2 kv heads on 4 model chips, draft 4 over 1 on 2: each kv head is
  held twice (models/gqa.py) and the pair decodes what it decodes on one device."""
  target = Model(get_preset("llama_test_target", num_heads=8, num_kv_heads=2, head_dim=4,
                            eos_id=63, num_decoder_layers=1))
  draft = Model(get_preset("llama_test_draft", num_heads=4, num_kv_heads=1, head_dim=4,
                           eos_id=63))
  k1, k2 = jax.random.split(jax.random.key(7))
  tp, dp = target.init(k1), draft.init(k2)
  inputs, rng = tiny_inputs(), jax.random.key(1)
  sampling = SamplingConfig(temperature=1.0)
  ref = jax.device_get(Decoder(target, draft, Chain(3), sampling, max_decode_len=MAX_LEN)
                       .generate(Params(tp, dp), inputs, rng))
  p = sh.shard_models(target, tp, draft, dp, mesh_config=sh.MeshConfig(2, 2, 2),
                      batch_size=len(inputs))
  assert (p.target.config.kv_heads, p.draft.config.kv_heads) == (4, 2)
  kv = p.target_params["decoder"]["layers_0"]["self_attention"]["key"]["kernel"]
  assert kv.shape[1] == 4 * 4 and kv.sharding.spec[1] == ("model_outer", "model_inner")
  decoder = Decoder(p.target, p.draft, Chain(3), sampling, max_decode_len=MAX_LEN, mesh=p.mesh)
  got = jax.device_get(decoder.generate(Params(p.target_params, p.draft_params), inputs, rng))
  np.testing.assert_array_equal(got.tokens_BxN, ref.tokens_BxN)
  np.testing.assert_array_equal(got.counters.accepted_B, ref.counters.accepted_B)


def test_query_heads_the_model_axes_do_not_divide_are_named():
  target = Model(get_preset("llama_test_target", num_heads=6, num_kv_heads=2))
  with pytest.raises(ValueError, match=r"size 4 .*'heads' = 6"):
    sh.shard_models(target, None, mesh_config=sh.MeshConfig(2, 2, 2))


@pytest.mark.parametrize("preset,layout", [("llama3_1_70b", (1, 2, 4)), ("llama3_2_1b", (1, 1, 8))])
def test_llama3_presets_on_8_devices_from_shapes(preset, layout):
  """Llama 3.1 70B over 8 model chips (its 8 key/value heads one per chip) and the 1B draft,
  from shapes only: each chip holds 1/8 of the bytes up to the norm scales. (16 chips:
  tests/models/test_gqa.py, with the kv heads replicated.)"""
  import numpy as np
  config = sh.MeshConfig(*layout)
  m = sh.with_rules(Model(get_preset(preset, scan_layers=True, dtype="bfloat16")),
                    config.rules_for("target"))
  mesh = sh.make_mesh(config)
  sh.validate(mesh, m, m.axis_rules, name=preset)
  shapes = m.param_shapes()
  per_chip = sum(int(np.prod(s.shard_shape(x.shape))) for s, x in
                 zip(jax.tree.leaves(sh.param_shardings(m, mesh)), jax.tree.leaves(shapes)))
  total = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  assert total == m.config.num_params()
  assert per_chip <= 1.001 * total / 8
