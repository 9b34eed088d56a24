"""Replicated key/value heads (specdec_jax/models/gqa.py): the same model, more kv heads.

Why: a grouped-query target split over more chips than it has kv heads (Llama-3.1 70B, 8 kv
heads, over Chen et al.'s 16 chips) holds each kv head on several chips. The replicated model
must compute the same logits (or every sharded run would silently decode another model), and the
replication must be what lets the 70B shapes split 16 ways at 1/16 of the bytes per chip.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import sharding as sh
from specdec_jax.models import gqa
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("r", [2, 4])
def test_replicated_model_computes_the_same_logits(r, scan_layers):
  config = get_preset("llama_test_target", num_heads=8, num_kv_heads=2, head_dim=4,
                      qkv_bias=True, scan_layers=scan_layers)
  model = Model(config)
  params = jax.tree.map(lambda x: x + 0.05, model.init(jax.random.key(3)))  # nonzero biases
  new_config, new_params = gqa.replicate_kv_heads(config, params, r)
  assert new_config.kv_heads == 2 * r
  tokens = jnp.asarray([[5, 9, 3, 7, 2, 11], [4, 4, 8, 1, 6, 3]], jnp.int32)
  want = model.forward(params, tokens[:, :0], tokens)
  got = Model(new_config).forward(new_params, tokens[:, :0], tokens)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
  # Cached decode too (the cache now holds 2r heads).
  cache = Model(new_config).prefill(new_params, tokens[:, :3], 16)
  step, _ = Model(new_config).extend(new_params, cache, tokens[:, 2:6])
  np.testing.assert_allclose(np.asarray(step), np.asarray(want[:, 2:6]), rtol=1e-5, atol=1e-5)


def test_a_wrong_copy_order_would_change_the_logits():
  """The copies must be adjacent (head g's r copies side by side): tiling the heads instead
  (g0 g1 g0 g1) gives query heads another group's keys. Guards `_repeat_heads`' layout."""
  config = get_preset("llama_test_target", num_heads=8, num_kv_heads=2, head_dim=4)
  model = Model(config)
  params = model.init(jax.random.key(3))
  new_config, good = gqa.replicate_kv_heads(config, params, 2)
  tiled = jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.tile(x, (1, 2)) if any(getattr(k, "key", None) in ("key", "value")
                                                 for k in path) else x, params)
  tokens = jnp.asarray([[5, 9, 3, 7, 2, 11]], jnp.int32)
  want = model.forward(params, tokens[:, :0], tokens)
  bad = Model(new_config).forward(tiled, tokens[:, :0], tokens)
  assert not np.allclose(np.asarray(bad), np.asarray(want), atol=1e-3)


def test_replication_needed():
  c70 = get_preset("llama3_1_70b")  # 64 query heads over 8 kv heads
  assert [gqa.replication_for(c70, n) for n in (1, 4, 8, 16, 32, 64)] == [1, 1, 1, 2, 4, 8]
  assert gqa.replication_for(c70, 48) == 1  # 64 query heads do not split 48 ways: validate names it
  assert gqa.replication_for(get_preset("t5_test_target"), 8) == 1  # MHA: heads split already
  with pytest.raises(ValueError, match="must divide the query heads per kv head"):
    gqa.replicated_config(c70, 16)


def test_llama3_70b_over_16_chips_from_shapes():
  """Chen et al.'s 16 chips, one model axis of 16 (model_outer 8 x model_inner 2): the kv heads
  held twice, each chip 1/16 of the weights, the copied k/v kernels included."""
  rules = sh.MeshConfig(1, 8, 2).rules_for("target")
  mesh = jax.sharding.AbstractMesh((1, 8, 2), ("data", "model_outer", "model_inner"))
  model = sh.with_rules(Model(get_preset("llama3_1_70b", scan_layers=True, dtype="bfloat16")),
                        rules)
  with pytest.raises(ValueError, match="the key/value heads"):
    sh.validate(mesh, model, rules, name="llama3_1_70b")  # 8 kv heads do not split 16 ways
  assert sh.kv_replication(mesh, model, rules) == 2
  fitted = dataclasses.replace(model, config=gqa.replicated_config(model.config, 2))
  sh.validate(mesh, fitted, rules, name="llama3_1_70b")
  shapes = fitted.param_shapes()
  per_chip = sum(int(np.prod(s.shard_shape(x.shape))) for s, x in
                 zip(jax.tree.leaves(sh.param_shardings(fitted, mesh)), jax.tree.leaves(shapes)))
  assert fitted.config.num_params() - model.config.num_params() == 80 * 2 * 8192 * 8 * 128
  assert per_chip <= 1.001 * fitted.config.num_params() / 16
