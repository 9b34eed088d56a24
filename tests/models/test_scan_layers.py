"""Scanned layers (`scan_layers=True`, `nn.scan`, T5X's stacked tree) compute what unrolled ones do.

Why: the two layouts are a speed/compile-time trade-off chosen in config (unrolled ran 2-5x faster
on CPU; scan compiles deep TPU models faster), so they must be interchangeable: the same weights
stacked on a leading `layers` axis give the same logits, the same cached decode and the same
greedy speculative output, and checkpoints convert between the layouts.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.checkpoints import load_checkpoint
from specdec_jax.checkpoints.tree import flatten, to_layout, unflatten
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model
from specdec_jax.sharding import MeshConfig, make_mesh, param_shardings, standard_rules

INPUTS = {"t5": [[5, 6, 7, 1, 0], [8, 9, 1, 0, 0]], "decoder": [[5, 6, 7, 2, 0], [8, 9, 3, 0, 0]]}


def _pair(kind, name):
  cfg = get_preset(f"{kind}_test_{name}")
  unrolled = Model(cfg)
  params = unrolled.init(jax.random.key(1 if name == "target" else 2))
  scanned = Model(cfg.replace(scan_layers=True))
  stacked = unflatten(to_layout(flatten(jax.device_get(params)), True))
  return unrolled, params, scanned, stacked


@pytest.mark.parametrize("kind", [pytest.param("t5", marks=pytest.mark.slow), "decoder"])
def test_scanned_equals_unrolled(kind):
  unrolled, params, scanned, stacked = _pair(kind, "target")
  shapes = flatten(scanned.param_shapes())
  assert {k: v.shape for k, v in shapes.items()} == {k: np.shape(v) for k, v in
                                                      flatten(stacked).items()}
  inputs = jnp.asarray(INPUTS[kind], jnp.int32)
  dec = jnp.asarray([[0, 3, 4, 5], [0, 6, 2, 2]], jnp.int32)
  np.testing.assert_allclose(scanned.forward(stacked, inputs, dec),
                             unrolled.forward(params, inputs, dec), rtol=1e-5, atol=1e-5)
  c_u, c_s = unrolled.prefill(params, inputs, 10), scanned.prefill(stacked, inputs, 10)
  for block in (dec[:, :1], dec[:, 1:4]):
    l_u, c_u = unrolled.extend(params, c_u, block)
    l_s, c_s = scanned.extend(stacked, c_s, block)
    np.testing.assert_allclose(l_s, l_u, rtol=1e-5, atol=1e-5)
  assert c_s.self_kv.k_BxHxKxS.shape[0] == unrolled.config.num_decoder_layers


def test_greedy_speculative_with_scanned_models_equals_unrolled():
  t_u, tp, t_s, tps = _pair("t5", "target")
  d_u, dp, d_s, dps = _pair("t5", "draft")
  inputs = jnp.asarray(INPUTS["t5"], jnp.int32)
  args = dict(scheme=Chain(3), sampling=SamplingConfig(), max_decode_len=10)
  a = Decoder(t_u, d_u, **args).generate(Params(tp, dp), inputs)
  b = Decoder(t_s, d_s, **args).generate(Params(tps, dps), inputs)
  np.testing.assert_array_equal(a.tokens_BxN, b.tokens_BxN)


def test_scanned_layout_loads_and_shards():
  cfg, stacked = load_checkpoint("t5_test_target", scan_layers=True, seed=4)
  _, flat = load_checkpoint("t5_test_target", scan_layers=False, seed=4)
  np.testing.assert_array_equal(stacked["decoder"]["layers"]["mlp"]["wo"]["kernel"][1],
                                flat["decoder"]["layers_1"]["mlp"]["wo"]["kernel"])
  model = Model(cfg)
  assert model.logical_axes()["decoder"]["layers"]["mlp"]["wo"]["kernel"][0] == "layers"
  mesh = make_mesh(MeshConfig(data=1, model_outer=1, model_inner=2), jax.devices()[:2])
  sh = param_shardings(model, mesh, standard_rules())
  spec = sh["decoder"]["layers"]["mlp"]["wo"]["kernel"].spec
  assert spec[0] is None  # the layer axis is never split; mlp/embed shard as unrolled


def test_valid_prefix_equal_reads_both_cache_layouts():
  from specdec_jax.models.kv_cache import valid_prefix_equal
  unrolled, params, scanned, stacked = _pair("decoder", "target")
  inputs = jnp.asarray(INPUTS["decoder"], jnp.int32)
  c_u, c_s = unrolled.prefill(params, inputs, 10), scanned.prefill(stacked, inputs, 10)
  # Across layouts: the same weights give the same valid prefix ...
  assert valid_prefix_equal(c_s, c_u, atol=1e-5) and valid_prefix_equal(c_u, c_s, atol=1e-5)
  # ... and a change in one valid slot of one layer of either layout is seen.
  k = c_s.self_kv.k_BxHxKxS  # [L, B, H, K, S]
  bad_s = c_s.replace(self_kv=c_s.self_kv.replace(k_BxHxKxS=k.at[1, 1, 0, 0, 0].add(1.0)))  # layer 1
  assert not valid_prefix_equal(bad_s, c_u, atol=1e-5)
  first = c_u.self_kv[0]
  bad_u = c_u.replace(self_kv=(first.replace(v_BxHxSxK=first.v_BxHxSxK.at[0, 1, 2, 3].add(1.0)),)
                      + tuple(c_u.self_kv[1:]))
  assert not valid_prefix_equal(c_s, bad_u, atol=1e-5)
  # Slots past an example's index are stale by design and never compared.
  past = c_s.replace(self_kv=c_s.self_kv.replace(k_BxHxKxS=k.at[..., 9].add(1.0)))  # slot 9
  assert valid_prefix_equal(past, c_u, atol=1e-5)
