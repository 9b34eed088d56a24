"""T5X legacy format: T5X's own test checkpoint, and checkpoints our writer lays out as T5X does."""
import json
import os

import flax.serialization
import numpy as np
import pytest

from ckpt_testutil import BF16, assert_trees_bit_identical, random_params
from specdec_jax.checkpoints import t5x_legacy
from specdec_jax.checkpoints.tree import CheckpointError, expected_shapes, flatten, validate
from specdec_jax.models.model_config import get_preset


def test_reads_the_checkpoint_t5x_wrote(t5x_tiny_path):
  flat = t5x_legacy.open_target(t5x_tiny_path)
  config = get_preset("t5_1_1_tiny")
  validate(flat, config, source="T5X test_t5_tiny")  # no missing, unexpected or mis-shaped array
  assert sorted(flat) == sorted(expected_shapes(config))
  assert all(v.dtype == np.float32 for v in flat.values())
  # Adafactor slots live beside target in the file but are not returned.
  state = t5x_legacy.read_msgpack(t5x_tiny_path)
  assert "param_states" in state["optimizer"]["state"]
  assert t5x_legacy.is_t5x_legacy(t5x_tiny_path)
  # Normal RMS-norm init is ones; the embedding is normal(1.0).
  np.testing.assert_array_equal(flat["decoder/decoder_norm/scale"], np.ones(8, np.float32))
  assert 0.9 < flat["token_embedder/embedding"].std() < 1.1


@pytest.mark.parametrize("dtype", [np.float32, BF16])
@pytest.mark.parametrize("compressor", ["gzip", "zstd"])
def test_zarr_write_read_bit_identical(tmp_path, small_config, dtype, compressor):
  params = random_params(small_config, dtype=dtype)
  ckpt = tmp_path / "checkpoint_7"
  t5x_legacy.write(str(ckpt), params, step=7, compressor=compressor)
  name = "target.decoder.layers_0.mlp.wo.kernel"
  zarray = json.loads((ckpt / name / ".zarray").read_text())
  assert zarray["compressor"]["id"] == compressor
  assert zarray["dtype"] in ("<f4", "bfloat16")
  assert (ckpt / name / "0.0").exists()  # chunk files named with `.` separators
  flat = t5x_legacy.open_target(str(ckpt))
  assert not isinstance(flat["decoder/layers_0/mlp/wo/kernel"], np.ndarray)  # lazily opened
  assert_trees_bit_identical(t5x_legacy.load_target(str(ckpt)), params)
  assert int(t5x_legacy.read_msgpack(str(ckpt))["optimizer"]["state"]["step"]) == 7


def test_inline_write_read_and_cast(tmp_path, small_config):
  params = random_params(small_config, dtype=BF16)
  t5x_legacy.write(str(tmp_path), params, inline=True)
  assert sorted(os.listdir(tmp_path)) == ["checkpoint"]
  assert_trees_bit_identical(t5x_legacy.load_target(str(tmp_path / "checkpoint")), params)
  as_f32 = flatten(t5x_legacy.load_target(str(tmp_path), dtype=np.float32))
  for k, v in flatten(params).items():
    assert as_f32[k].dtype == np.float32
    np.testing.assert_array_equal(as_f32[k], v.astype(np.float32))


def test_chunked_msgpack_arrays(tmp_path, small_config, monkeypatch):
  # flax splits arrays over 1 GiB into `__msgpack_chunked_array__` dicts; force it on small ones.
  monkeypatch.setattr(flax.serialization, "MAX_CHUNK_SIZE", 1024)
  params = random_params(small_config)
  t5x_legacy.write(str(tmp_path), params, inline=True)
  monkeypatch.undo()
  raw = (tmp_path / "checkpoint").read_bytes()
  assert b"__msgpack_chunked_array__" in raw
  assert_trees_bit_identical(t5x_legacy.load_target(str(tmp_path)), params)


def test_multi_chunk_arrays(tmp_path, monkeypatch):
  monkeypatch.setattr(t5x_legacy, "_MAX_CHUNK_BYTES", 4 * 1024)
  config = get_preset("t5_test_target")
  params = random_params(config)
  t5x_legacy.write(str(tmp_path), params)
  chunks = os.listdir(tmp_path / "target.token_embedder.embedding")
  assert len([c for c in chunks if not c.startswith(".")]) > 1
  assert_trees_bit_identical(t5x_legacy.load_target(str(tmp_path)), params)


def test_choose_chunk_shape_divides_evenly():
  assert t5x_legacy.choose_chunk_shape((8, 16), 4) == [8, 16]
  chunk = t5x_legacy.choose_chunk_shape((32128, 4096), 4)  # xxl embedding, 526 MB
  assert np.prod(chunk) * 4 <= 2**26
  assert 32128 % chunk[0] == 0 and 4096 % chunk[1] == 0


def _rewrite_specs(ckpt, fn):
  """Edits every stored spec in a written checkpoint, as older or remote writers would have."""
  file = os.path.join(ckpt, "checkpoint")
  with open(file, "rb") as f:
    state = flax.serialization.msgpack_restore(f.read())
  def walk(node):
    for k, v in node.items():
      if isinstance(v, dict) and "driver" in v:
        node[k] = fn(v)
      elif isinstance(v, dict):
        walk(v)
  walk(state["optimizer"]["target"])
  with open(file, "wb") as f:
    f.write(flax.serialization.msgpack_serialize(state))


def test_gcs_specs_are_read_from_the_local_directory(tmp_path, small_config):
  params = random_params(small_config)
  t5x_legacy.write(str(tmp_path), params)
  _rewrite_specs(str(tmp_path), lambda s: dict(s, kvstore={
      "driver": "gcs", "bucket": "t5x-dummy-bucket", "path": s["kvstore"]["path"]}))
  assert_trees_bit_identical(t5x_legacy.load_target(str(tmp_path)), params)


def test_old_specs_with_top_level_path(tmp_path, small_config):
  params = random_params(small_config)
  t5x_legacy.write(str(tmp_path), params)
  _rewrite_specs(str(tmp_path), lambda s: {"driver": "zarr", "kvstore": {"driver": "file"},
                                           "path": s["kvstore"]["path"], "dtype": s["dtype"]})
  assert_trees_bit_identical(t5x_legacy.load_target(str(tmp_path)), params)


def test_specs_with_absolute_paths_from_elsewhere(tmp_path, small_config):
  params = random_params(small_config)
  t5x_legacy.write(str(tmp_path), params)
  _rewrite_specs(str(tmp_path), lambda s: dict(s, kvstore={
      "driver": "file", "path": "/somewhere/else/checkpoint_1/" + s["kvstore"]["path"]}))
  assert_trees_bit_identical(t5x_legacy.load_target(str(tmp_path)), params)


def test_resolve_spec_for_a_gcs_checkpoint_dir():
  spec = {"driver": "zarr", "dtype": "float32",
          "kvstore": {"driver": "file", "path": "target.decoder.decoder_norm.scale"},
          "metadata": {"chunks": [8], "compressor": {"id": "gzip", "level": 1}, "shape": [8]}}
  out = t5x_legacy.resolve_spec(spec, "gs://t5-data/pretrained_models/t5x/t5_1_1_small/checkpoint_1000000")
  assert out["kvstore"] == ("gs://t5-data/pretrained_models/t5x/t5_1_1_small/checkpoint_1000000/"
                            "target.decoder.decoder_norm.scale/")
  assert out["metadata"] == {"shape": [8]}  # chunks/compressor come from .zarray


def test_errors(tmp_path, small_config):
  with pytest.raises(CheckpointError, match="no T5X msgpack checkpoint"):
    t5x_legacy.open_target(str(tmp_path))
  (tmp_path / "checkpoint").write_bytes(flax.serialization.msgpack_serialize({"params": {}}))
  with pytest.raises(CheckpointError, match="not a T5X checkpoint"):
    t5x_legacy.read_msgpack(str(tmp_path))
  (tmp_path / "checkpoint").write_bytes(flax.serialization.msgpack_serialize(
      {"version": 2, "optimizer": {"target": {}}}))
  with pytest.raises(CheckpointError, match="version 2"):
    t5x_legacy.read_msgpack(str(tmp_path))
  params = random_params(small_config)
  t5x_legacy.write(str(tmp_path / "c"), params)
  import shutil
  shutil.rmtree(tmp_path / "c" / "target.decoder.decoder_norm.scale")
  with pytest.raises(CheckpointError, match="target/decoder/decoder_norm/scale"):
    t5x_legacy.open_target(str(tmp_path / "c"))


def test_read_through_a_url(tmp_path, small_config):
  """The gs:// code path (tensorstore kvstores), exercised with a file:// URL."""
  params = random_params(small_config, dtype=BF16)
  t5x_legacy.write(str(tmp_path / "checkpoint_3"), params)
  url = "file://" + str(tmp_path / "checkpoint_3")
  assert t5x_legacy.is_t5x_legacy(url) and t5x_legacy.is_t5x_legacy(url + "/checkpoint")
  assert_trees_bit_identical(t5x_legacy.load_target(url), params)
  assert not t5x_legacy.is_t5x_legacy("file://" + str(tmp_path))
