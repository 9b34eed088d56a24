"""The normalised parameter tree: shapes from the config, validation messages, layer stacking."""
import numpy as np
import pytest

from ckpt_testutil import random_params
from specdec_jax.checkpoints.tree import (CheckpointError, check_vocab_compatible, expected_shapes,
                                         flatten, infer_config, stack_layers, to_layout,
                                         unstack_layers, validate)
from specdec_jax.models.model_config import get_preset


@pytest.mark.parametrize("name", ["t5_1_1_tiny", "t5_test_target", "decoder_test_target"])
def test_expected_shapes_match_the_model(name):
  model_mod = pytest.importorskip("specdec_jax.models.model")
  config = get_preset(name)
  shapes = {k: tuple(v.shape) for k, v in flatten(model_mod.build_model(config).param_shapes()).items()}
  assert shapes == expected_shapes(config)


def test_expected_shapes_match_the_model_scanned():
  model_mod = pytest.importorskip("specdec_jax.models.model")
  config = get_preset("t5_test_target", scan_layers=True)
  try:
    model = model_mod.build_model(config)
  except NotImplementedError:
    pytest.skip("the model runs unrolled layers only (scanned trees are stacked on load/save)")
  shapes = {k: tuple(v.shape) for k, v in flatten(model.param_shapes()).items()}
  assert shapes == expected_shapes(config)


def test_param_count_matches_config():
  for name in ("t5_1_1_small", "t5_1_1_tiny", "decoder_97m"):
    config = get_preset(name)
    assert sum(int(np.prod(s)) for s in expected_shapes(config).values()) == config.num_params()


def test_t5_1_1_small_tree_facts():
  shapes = expected_shapes(get_preset("t5_1_1_small"))
  assert shapes["encoder/layers_7/attention/query/kernel"] == (512, 384)
  assert shapes["decoder/layers_0/encoder_decoder_attention/out/kernel"] == (384, 512)
  assert shapes["decoder/logits_dense/kernel"] == (512, 32128)
  assert shapes["encoder/relpos_bias/rel_embedding"] == (6, 32)
  assert not any("encoder" in k for k in expected_shapes(get_preset("decoder_test_draft")))


def test_validate_names_missing_array_by_t5x_path():
  config = get_preset("t5_test_target")
  flat = flatten(random_params(config))
  del flat["decoder/layers_1/mlp/wo/kernel"]
  with pytest.raises(CheckpointError, match=r"missing array target/decoder/layers_1/mlp/wo/kernel"):
    validate(flat, config)


def test_validate_reports_shape_mismatch_with_both_shapes():
  config = get_preset("t5_test_target")
  flat = flatten(random_params(config))
  flat["encoder/layers_0/attention/query/kernel"] = np.zeros((32, 16), np.float32)
  with pytest.raises(CheckpointError) as e:
    validate(flat, config)
  msg = str(e.value)
  assert "target/encoder/layers_0/attention/query/kernel" in msg
  assert "(32, 16)" in msg and "(32, 32)" in msg


def test_validate_reports_unexpected_arrays():
  config = get_preset("t5_test_target")
  flat = flatten(random_params(config))
  flat["decoder/layers_2/mlp/wo/kernel"] = np.zeros((64, 32), np.float32)
  with pytest.raises(CheckpointError, match=r"unexpected array target/decoder/layers_2/mlp/wo/kernel"):
    validate(flat, config)
  with pytest.raises(CheckpointError, match=r"checkpoint has 3 decoder layers, the config 2"):
    validate(flat, config)
  # A T5 checkpoint given a decoder-only config: a hint first, then every array.
  with pytest.raises(CheckpointError, match="(?s)has an encoder.*unexpected array target/encoder"):
    validate(flat, get_preset("decoder_test_target"))


def test_check_vocab_compatible():
  check_vocab_compatible(get_preset("t5_test_target"), get_preset("t5_test_draft"))
  with pytest.raises(CheckpointError, match="vocab_size=32128.*vocab_size=64"):
    check_vocab_compatible(get_preset("t5_1_1_small"), get_preset("t5_test_draft"))


@pytest.mark.parametrize("name", ["t5_test_target", "decoder_test_target"])
def test_stack_unstack_round_trip(name):
  config = get_preset(name)
  flat = flatten(random_params(config))
  stacked = stack_layers(flat)
  validate(stacked, config.replace(scan_layers=True))
  assert stacked["decoder/layers/mlp/wo/kernel"].shape == (2, 64, 32)
  np.testing.assert_array_equal(stacked["decoder/layers/mlp/wo/kernel"][1],
                                flat["decoder/layers_1/mlp/wo/kernel"])
  back = unstack_layers(stacked)
  assert sorted(back) == sorted(flat)
  for k in flat:
    np.testing.assert_array_equal(back[k], flat[k])
  assert to_layout(flat, False).keys() == flat.keys()
  assert to_layout(stacked, True).keys() == stacked.keys()


def test_stack_rejects_gaps():
  config = get_preset("t5_test_target")
  flat = flatten(random_params(config))
  flat = {k.replace("decoder/layers_1/", "decoder/layers_2/"): v for k, v in flat.items()}
  with pytest.raises(CheckpointError, match=r"not contiguous.*\[0, 2\]"):
    stack_layers(flat)


@pytest.mark.parametrize("name,scan", [("t5_1_1_tiny", False), ("t5_test_draft", True),
                                       ("decoder_test_target", False)])
def test_infer_config_from_shapes(name, scan):
  config = get_preset(name, scan_layers=scan)
  assert infer_config(flatten(random_params(config))) == config
