"""The project's own format: Orbax params + model_config.json, dtype cast and sharded restore."""
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from ckpt_testutil import BF16, assert_trees_bit_identical, random_params
from specdec_jax.checkpoints import orbax_io
from specdec_jax.checkpoints.tree import CheckpointError, flatten, unflatten
from specdec_jax.models.model_config import ModelConfig, get_preset


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_save_restore_bit_identical(tmp_path, small_config, dtype):
  params = random_params(small_config, dtype=dtype)
  orbax_io.save(str(tmp_path / "ckpt"), small_config, params)
  assert sorted(os.listdir(tmp_path / "ckpt")) == ["model_config.json", "params"]
  assert ModelConfig.from_json((tmp_path / "ckpt" / "model_config.json").read_text()) == small_config
  config, restored = orbax_io.restore(str(tmp_path / "ckpt"))
  assert config == small_config
  assert all(isinstance(v, np.ndarray) for v in flatten(restored).values())
  assert_trees_bit_identical(restored, params)


def test_bf16_stored_loaded_as_float32(tmp_path, small_config):
  params = random_params(small_config)
  orbax_io.save(str(tmp_path), small_config, params, dtype=BF16)
  assert {d for _, d in orbax_io.metadata(str(tmp_path)).values()} == {np.dtype(BF16)}
  _, restored = orbax_io.restore(str(tmp_path), dtype=np.float32)
  for k, v in flatten(params).items():
    got = flatten(restored)[k]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, v.astype(BF16).astype(np.float32))


def test_sharding_forms(tmp_path, small_config):
  params = random_params(small_config)
  orbax_io.save(str(tmp_path), small_config, params)
  single = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("model",))
  P = jax.sharding.PartitionSpec
  def by_path(path, shape):  # shard the embedding's vocab axis when it divides, else replicate
    n = len(jax.devices())
    spec = P("model", None) if path.endswith("embedding") and shape[0] % n == 0 else P()
    return jax.sharding.NamedSharding(mesh, spec)
  tree = unflatten({k: single for k in flatten(params)})
  for spec in (single, by_path, tree):
    _, restored = orbax_io.restore(str(tmp_path), sharding=spec, dtype=np.float32)
    flat = flatten(restored)
    assert all(isinstance(v, jax.Array) for v in flat.values())
    assert_trees_bit_identical(jax.device_get(restored), params)
  emb = flatten(orbax_io.restore(str(tmp_path), sharding=by_path)[1])["token_embedder/embedding"]
  assert emb.sharding.is_equivalent_to(by_path("token_embedder/embedding", emb.shape), 2)


def test_sharded_restore_on_four_devices(tmp_path, small_config):
  """In a fresh process with 4 CPU devices: each device holds only its slice (Orbax and T5X)."""
  from specdec_jax.checkpoints import t5x_legacy
  params = random_params(small_config)
  orbax_io.save(str(tmp_path), small_config, params)
  t5x_legacy.write(str(tmp_path / "t5x"), params)
  code = textwrap.dedent(f"""
      import jax, numpy as np
      from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
      from specdec_jax.checkpoints import orbax_io, load_checkpoint
      assert len(jax.devices()) == 4
      mesh = Mesh(np.array(jax.devices()), ("model",))
      rule = lambda path, shape: NamedSharding(mesh, P(None, "model") if len(shape) == 2 else P())
      for load in (lambda: orbax_io.restore({str(tmp_path)!r}, sharding=rule)[1],
                   lambda: load_checkpoint({str(tmp_path)!r}, sharding=rule)[1],
                   lambda: load_checkpoint({str(tmp_path / "t5x")!r}, sharding=rule)[1]):
        wo = load()["decoder"]["layers_0"]["mlp"]["wo"]["kernel"]
        assert wo.shape == (32, 16), wo.shape
        assert [s.data.shape for s in wo.addressable_shards] == [(32, 4)] * 4
      print("OK")
  """)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


def test_save_validates_and_restore_reports(tmp_path, small_config):
  params = flatten(random_params(small_config))
  bad = dict(params)
  del bad["decoder/layers_0/mlp/wo/kernel"]
  with pytest.raises(CheckpointError, match="missing array target/decoder/layers_0/mlp/wo/kernel"):
    orbax_io.save(str(tmp_path / "a"), small_config, unflatten(bad))
  with pytest.raises(CheckpointError, match="not a specdec_jax checkpoint"):
    orbax_io.restore(str(tmp_path))
  orbax_io.save(str(tmp_path / "b"), small_config, unflatten(params))
  other = get_preset("t5_test_target")
  with pytest.raises(CheckpointError, match=r"shape mismatch at target/token_embedder/embedding"):
    orbax_io.restore(str(tmp_path / "b"), config=other)


def test_scanned_layout_saved_as_configured(tmp_path):
  config = get_preset("t5_test_draft", scan_layers=True)
  params = random_params(config.replace(scan_layers=False))
  orbax_io.save(str(tmp_path), config, params)  # per-layer input is stacked to match the config
  shapes = {k: s for k, (s, _) in orbax_io.metadata(str(tmp_path)).items()}
  assert shapes["decoder/layers/mlp/wo/kernel"] == (1, 32, 16)
