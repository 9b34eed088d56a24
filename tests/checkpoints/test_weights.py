"""Format detection, config resolution and validation in `load_checkpoint`."""
import numpy as np
import pytest

from ckpt_testutil import BF16, assert_trees_bit_identical, random_params
from specdec_jax.checkpoints import (CheckpointError, check_vocab_compatible, detect_format,
                                     load_checkpoint)
from specdec_jax.checkpoints import hf, orbax_io, t5x_legacy, t5x_orbax
from specdec_jax.checkpoints.tree import flatten, unflatten
from specdec_jax.models.model_config import get_preset


@pytest.fixture
def written(tmp_path, small_config):
  """The same params in all four formats."""
  params = random_params(small_config)
  paths = {"specdec": tmp_path / "own", "t5x": tmp_path / "t5x" / "checkpoint_0",
           "t5x_orbax": tmp_path / "t5xo" / "checkpoint_0", "hf": tmp_path / "hf"}
  orbax_io.save(str(paths["specdec"]), small_config, params)
  t5x_legacy.write(str(paths["t5x"]), params)
  t5x_orbax.write(str(paths["t5x_orbax"]), params)
  hf.to_hf(small_config, params, str(paths["hf"]))
  return params, {k: str(v) for k, v in paths.items()}


def test_every_format_detected_and_loaded(written, small_config):
  params, paths = written
  for fmt, path in paths.items():
    assert detect_format(path) == fmt
    config, loaded = load_checkpoint(path)  # T5X formats: config inferred from shapes
    assert config == small_config, fmt
    assert_trees_bit_identical(loaded, params)
  assert detect_format(paths["t5x"] + "/checkpoint") == "t5x"
  assert detect_format(paths["t5x_orbax"] + "/state") == "t5x_orbax"
  # URLs (gs:// in the gin files) go through tensorstore kvstores; file:// exercises that path.
  for fmt in ("t5x", "t5x_orbax", "specdec"):
    assert detect_format("file://" + paths[fmt]) == fmt
  for fmt in ("t5x", "t5x_orbax"):
    assert_trees_bit_identical(load_checkpoint("file://" + paths[fmt])[1], params)
  with pytest.raises(CheckpointError, match="HF checkpoints must be local"):
    detect_format("file://" + paths["hf"])


def test_dtype_and_layout_options(written, small_config):
  params, paths = written
  for path in paths.values():
    config, loaded = load_checkpoint(path, dtype=BF16, scan_layers=True)
    assert config.scan_layers
    flat = flatten(loaded)
    assert flat["decoder/layers/mlp/wo/kernel"].shape == (1, 32, 16)
    assert flat["decoder/layers/mlp/wo/kernel"].dtype == BF16
    np.testing.assert_array_equal(flat["decoder/layers/mlp/wo/kernel"][0],
                                  params["decoder"]["layers_0"]["mlp"]["wo"]["kernel"].astype(BF16))


def test_preset_and_config_for_t5x(written, small_config):
  _, paths = written
  config, _ = load_checkpoint(paths["t5x"], preset="t5_test_draft")
  assert config == small_config
  with pytest.raises(CheckpointError, match=r"shape mismatch at target/token_embedder/embedding: "
                     r"checkpoint has \(64, 16\), config expects \(64, 32\)"):
    load_checkpoint(paths["t5x"], preset="t5_test_target")
  with pytest.raises(CheckpointError, match="differs from its model_config.json"):
    load_checkpoint(paths["specdec"], preset="t5_test_target")
  # Run-time choices (activation dtype) may differ from the stored config.
  config, _ = load_checkpoint(paths["specdec"], config=small_config.replace(dtype="bfloat16"))
  assert config.dtype == "bfloat16"


def test_preset_name_gives_random_init():
  pytest.importorskip("specdec_jax.models.model")
  config, params = load_checkpoint("t5_test_draft", seed=3)
  assert config == get_preset("t5_test_draft")
  _, again = load_checkpoint("t5_test_draft", seed=3)
  assert_trees_bit_identical(params, again)


def test_unknown_format_lists_files(tmp_path):
  (tmp_path / "weights.npz").write_bytes(b"x")
  (tmp_path / "notes.txt").write_text("hi")
  with pytest.raises(CheckpointError, match=r"unknown checkpoint format.*\['notes.txt', 'weights.npz'\]"):
    load_checkpoint(str(tmp_path))
  with pytest.raises(CheckpointError, match="does not exist and is not a preset"):
    load_checkpoint(str(tmp_path / "nope"))


def test_missing_array_named_by_t5x_path(tmp_path, small_config):
  flat = flatten(random_params(small_config))
  del flat["decoder/layers_0/mlp/wo/kernel"]
  t5x_legacy.write(str(tmp_path), unflatten(flat))
  with pytest.raises(CheckpointError, match="missing array target/decoder/layers_0/mlp/wo/kernel"):
    load_checkpoint(str(tmp_path), preset="t5_test_draft")


def test_check_vocab_compatible_is_exported():
  with pytest.raises(CheckpointError, match="vocabularies differ"):
    check_vocab_compatible(get_preset("t5_1_1_tiny"), get_preset("t5_test_draft"))
