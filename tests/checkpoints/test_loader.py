"""The one model loader (`specdec_jax.checkpoints.loader`).

Why these tests: the runner, the trainer, the generation job and the AOT builder all load models
through it, each with the rules it had before: a preset and a seed give the weights `Model.init`
gives (resized to the run's vocabulary), a checkpoint's weights come in the compute dtype unless
master weights are asked for, the config alone (`model_config`) is the one `load_model` gives,
and a missing checkpoint says where it was looked for.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ckpt_testutil import assert_trees_bit_identical
from specdec_jax.checkpoints import loader, orbax_io
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model

BF16, F32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)


def _dtypes(params):
  return {jnp.dtype(x.dtype) for x in jax.tree.leaves(params)}


def test_preset_is_model_init_resized_and_seeded():
  model, params = loader.load_model("t5_test_draft", vocab_size=256, seed=3)
  config = get_preset("t5_test_draft", vocab_size=256)
  assert model == Model(config) and loader.model_config("t5_test_draft", vocab_size=256) == config
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(params))  # on the device
  assert_trees_bit_identical(params, jax.jit(Model(config).init)(jax.random.key(3)))
  # The compute dtype does not change a preset's weights (float32, as Model.init makes them).
  model, host = loader.load_model("t5_test_draft", vocab_size=256, seed=3, dtype="bfloat16",
                                  sharding=loader.HOST)
  assert model.config.dtype == "bfloat16" and _dtypes(host) == {F32}
  assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(host))
  assert_trees_bit_identical(host, params)
  _, other = loader.load_model("t5_test_draft", vocab_size=256, seed=4)
  emb = lambda p: np.asarray(p["token_embedder"]["embedding"])  # noqa: E731
  assert not np.array_equal(emb(other), emb(params))


def test_checkpoint_weights_in_compute_dtype_or_float32_masters(tmp_path):
  config = get_preset("t5_test_draft", vocab_size=256)
  params = jax.jit(Model(config).init)(jax.random.key(0))
  path = str(tmp_path / "draft")
  orbax_io.save(path, config, params, dtype=jnp.bfloat16)  # stored bf16, computes float32
  model, loaded = loader.load_model(path)
  assert model.config == config and _dtypes(loaded) == {F32}
  assert loader.model_config(path) == config
  model, loaded = loader.load_model(path, dtype="bfloat16")
  assert model.config.dtype == "bfloat16" and _dtypes(loaded) == {BF16}
  assert loader.model_config(path, dtype="bfloat16") == model.config
  # The trainer: bfloat16 activations, float32 master weights on the host.
  model, loaded = loader.load_model(path, dtype="bfloat16", weights_dtype="float32",
                                    sharding=loader.HOST)
  assert model.config.dtype == "bfloat16" and _dtypes(loaded) == {F32}
  assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(loaded))
  # One sharding: each leaf read straight onto it.
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  _, placed = loader.load_model(path, sharding=device)
  assert {x.sharding for x in jax.tree.leaves(placed)} == {device} and _dtypes(placed) == {F32}


def test_layout_on_request(tmp_path):
  config = get_preset("t5_test_draft", vocab_size=256, scan_layers=True)
  path = str(tmp_path / "scanned")
  _, params = loader.load_model("t5_test_draft", vocab_size=256, sharding=loader.HOST,
                                scan_layers=True)
  orbax_io.save(path, config, params)
  assert loader.load_model(path)[0].config.scan_layers
  model, params = loader.load_model(path, scan_layers=False, sharding=loader.HOST)
  assert not model.config.scan_layers and "layers_0" in params["decoder"]


def test_missing_checkpoints_say_where_they_were_looked_for():
  with pytest.raises(FileNotFoundError, match=r"checkpoint 'no/such/dir' not found \(also looked"):
    loader.load_model("no/such/dir")
  with pytest.raises(FileNotFoundError, match="local zoo is trained by"):
    loader.model_config("specdec_jax/assets/zoo/no_such_model")
  with pytest.raises(ValueError, match="sharding must be None, HOST"):
    loader.load_model("t5_test_draft", sharding="device")
  assert loader.is_preset("t5_test_draft") and not loader.is_preset("no/such/dir")
  assert loader.local_path("gs://bucket/ckpt") is None
  assert loader.locate("gs://bucket/ckpt") == "gs://bucket/ckpt"


def test_a_public_checkpoint_shape_keeps_its_own_vocabulary():
  """A text task's vocabulary resizes test presets, never Llama-3's 128,256 tokenizer ids (the
  AOT compile of Chen's HumanEval config would otherwise compile an 8k head)."""
  from specdec_jax.checkpoints import loader
  assert loader.preset_config("llama3_2_1b", vocab_size=8192).vocab_size == 128256
  assert loader.preset_config("llama_test_target", vocab_size=128).vocab_size == 128
