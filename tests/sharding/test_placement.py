"""Each device holds ~1/model-parallel of the target's parameter bytes (issue 3, check 2).

Measured from the arrays' `addressable_shards`, not computed from specs, so a rule that silently
replicates a big matrix (a typo in a logical name, a missing rule) shows up here. The only
replicated parameters under t5x's rules are the layer-norm scales (embed,), a few hundred bytes.
"""
import jax
import numpy as np
import pytest

from sharding_tiny import tiny_models
from specdec_jax import sharding as sh


def _total_bytes(tree):
  return sum(x.nbytes for x in jax.tree.leaves(tree))


def _replicated_bytes(model):
  """Bytes of params whose logical axes map to no mesh axis (norm scales)."""
  shapes, axes = model.param_shapes(), model.logical_axes()
  rules = dict(model.axis_rules)
  total = 0
  for s, a in zip(jax.tree.leaves(shapes), jax.tree.leaves(
      axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))):
    if all(rules.get(name) is None for name in a):
      total += int(np.prod(s.shape)) * s.dtype.itemsize
  return total


@pytest.mark.parametrize("shape", [(1, 1, 8), (2, 1, 4), (1, 4, 2), (2, 2, 2), (8, 1, 1)])
def test_per_device_param_bytes(shape):
  t, tp, d, dp = tiny_models()
  placed = sh.shard_models(t, tp, d, dp, mesh_config=sh.MeshConfig(*shape))
  _, outer, inner = shape
  for model, params, mp in ((placed.target, placed.target_params, outer * inner),
                            (placed.draft, placed.draft_params, inner)):
    total, rep = _total_bytes(params), _replicated_bytes(model)
    per_device = sh.per_device_bytes(params)
    assert len(per_device) == 8
    expected = (total - rep) / mp + rep  # exact: every sharded dim divides evenly
    for dev, nbytes in per_device.items():
      assert nbytes == pytest.approx(expected), (model.config, dev)
      assert nbytes <= 1.05 * total / mp + rep
    assert rep < 0.02 * total


def test_t5_small_on_8_devices_from_shapes():
  """A real size (T5 v1.1 small with 8 heads, 77M params) over 8 devices, from shapes only (no
  compile, no allocation): each device's shard is 1/8 of the bytes, up to the norm scales."""
  from specdec_jax.models.model_config import get_preset
  from specdec_jax.models.model import Model
  m = sh.with_rules(Model(get_preset("t5_1_1_small", num_heads=8)),
                    sh.MeshConfig(1, 2, 4).rules_for("target"))
  mesh = sh.make_mesh(sh.MeshConfig(1, 2, 4))
  shardings = sh.param_shardings(m, mesh)
  shapes = m.param_shapes()
  per_dev = sum(int(np.prod(s.shard_shape(x.shape))) * 4 for s, x in
                zip(jax.tree.leaves(shardings), jax.tree.leaves(shapes)))
  total = sum(int(np.prod(x.shape)) * 4 for x in jax.tree.leaves(shapes))
  assert per_dev <= 1.01 * total / 8
