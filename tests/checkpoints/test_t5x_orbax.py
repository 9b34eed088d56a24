"""T5X's Orbax/OCDBT layout (`checkpoint_N/state/`), written with orbax as T5X writes it."""
import json
import os

import numpy as np
import orbax.checkpoint as ocp
import pytest

from ckpt_testutil import BF16, assert_trees_bit_identical, random_params
from specdec_jax.checkpoints import t5x_orbax
from specdec_jax.checkpoints.tree import CheckpointError, flatten


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_write_read_bit_identical(tmp_path, small_config, dtype):
  params = random_params(small_config, dtype=dtype)
  slots = {"encoder": {"encoder_norm": {"scale": {"v": np.ones(16, np.float32)}}}}
  ckpt = tmp_path / "checkpoint_100"
  state = t5x_orbax.write(str(ckpt), params, step=100, param_states=slots)
  meta = json.loads(open(os.path.join(state, "_METADATA")).read())
  keys = {tuple(e["key"] for e in v["key_metadata"]) for v in meta["tree_metadata"].values()}
  assert ("target", "encoder", "layers_0", "attention", "query", "kernel") in keys
  assert meta["use_ocdbt"] is True
  assert t5x_orbax.is_t5x_orbax(str(ckpt)) and t5x_orbax.is_t5x_orbax(state)
  flat = t5x_orbax.open_target(str(ckpt))
  assert not any(k.startswith("state") for k in flat)  # optimizer slots are never read
  assert_trees_bit_identical(t5x_orbax.load_target(str(ckpt)), params)
  assert_trees_bit_identical(t5x_orbax.load_target(state), params)


def test_without_ocdbt(tmp_path, small_config):
  params = random_params(small_config)
  with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)) as ckptr:
    ckptr.save(str(tmp_path / "checkpoint_1" / "state"),
               args=ocp.args.PyTreeSave({"target": params, "state": {"step": np.int32(1)}}))
  assert_trees_bit_identical(t5x_orbax.load_target(str(tmp_path / "checkpoint_1")), params)


def test_cast_on_load(tmp_path, small_config):
  params = random_params(small_config, dtype=BF16)
  t5x_orbax.write(str(tmp_path), params)
  loaded = flatten(t5x_orbax.load_target(str(tmp_path), dtype=np.float32))
  for k, v in flatten(params).items():
    assert loaded[k].dtype == np.float32
    np.testing.assert_array_equal(loaded[k], v.astype(np.float32))


def test_errors(tmp_path, small_config):
  with pytest.raises(CheckpointError, match="no Orbax"):
    t5x_orbax.open_target(str(tmp_path))
  with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True)) as ckptr:
    ckptr.save(str(tmp_path / "c" / "state"),
               args=ocp.args.PyTreeSave({"params": random_params(small_config)}))
  with pytest.raises(CheckpointError, match=r"no `target\.\*` arrays.*params\.decoder"):
    t5x_orbax.open_target(str(tmp_path / "c"))


def test_read_through_a_url(tmp_path, small_config):
  params = random_params(small_config)
  t5x_orbax.write(str(tmp_path / "checkpoint_2"), params)
  url = "file://" + str(tmp_path / "checkpoint_2")
  assert t5x_orbax.is_t5x_orbax(url)
  assert_trees_bit_identical(t5x_orbax.load_target(url), params)
