"""Sharded training equals unsharded training, and a mesh that cannot work fails before compiling.

Why: T5-XXL fine-tuning only fits a TPU slice with the model, batch and optimizer state sharded;
these checks run on the 8 forced CPU devices of tests/conftest.py with mesh (data 2, model_outer 2,
model_inner 2): the same losses and params as one device (up to float reassociation in the
collectives), fewer bytes per device, Orbax resume of sharded state, and microbatched gradients
equal to whole-batch ones.
"""
import json

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from specdec_jax import sharding
from specdec_jax.checkpoints import load_checkpoint, orbax_io
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model
from specdec_jax.training import data as data_lib
from specdec_jax.training import sharded as sharded_lib
from specdec_jax.training import step as step_lib
from specdec_jax.training.placement import Placement
from specdec_jax.training.trainer import TrainConfig, train

MESH = sharding.MeshConfig(data=2, model_outer=2, model_inner=2)
RTOL, ATOL = 1e-4, 1e-6


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """A JSONL task and two tiny T5s: 'target' (heads 4, divisible by the 4 model devices) and
  'draft' (heads 2, not divisible)."""
  root = tmp_path_factory.mktemp("sharded_train")
  lines = [{"en": f"The dog number {i} ran to house {i % 5}.", "de": f"Der Hund {i} lief."}
           for i in range(40)]
  task = root / "pairs.jsonl"
  task.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
  models = {}
  for name in ("t5_test_target", "t5_test_draft"):
    # One layer each: compiles are the cost here, and one layer has every sharded weight kind.
    cfg = get_preset(name, vocab_size=8192, num_encoder_layers=1, num_decoder_layers=1)
    models[name] = str(root / name)
    orbax_io.save(models[name], cfg, load_checkpoint(name, config=cfg, seed=1)[1])
  return root, str(task), models


def _config(task, model, **kw):
  spec = data_lib.TaskSpec(name=task, input_len=24, target_len=16)
  base = dict(model=model, tasks=[spec], max_steps=3, batch_size=8, checkpoint_every=3,
              log_every=1, eval_examples=0, export_dir=None, learning_rate=0.05)
  return TrainConfig(**{**base, **kw})


def _params_at(out_dir, step):
  mgr = ocp.CheckpointManager(str(out_dir / "checkpoints"))
  state = mgr.restore(step, args=ocp.args.StandardRestore())
  return [np.asarray(x) for x in jax.tree.leaves(state["params"])]


def _losses(out_dir):
  acc = EventAccumulator(str(out_dir / "tensorboard"))
  acc.Reload()
  return [e.value for e in acc.Scalars("train/loss")]


@pytest.fixture(scope="module")
def unsharded(setup):
  root, task, models = setup
  out = root / "unsharded"
  summary = train(_config(task, models["t5_test_target"], eval_examples=8), str(out),
                  progress=False)
  return out, summary


def test_sharded_training_equals_unsharded(setup, unsharded):
  root, task, models = setup
  ref_dir, ref = unsharded
  out = root / "sharded"
  export = str(root / "sharded_export")
  summary = train(_config(task, models["t5_test_target"], mesh=MESH, eval_examples=8,
                          export_dir=export, export_dtype=None), str(out), progress=False)
  assert summary["steps"] == ref["steps"] == 3
  assert summary["target_tokens_seen"] == ref["target_tokens_seen"]
  losses, ref_losses = _losses(out), _losses(ref_dir)
  assert len(losses) == 3 and np.all(np.isfinite(losses))
  np.testing.assert_allclose(losses, ref_losses, rtol=RTOL)
  for a, b in zip(_params_at(out, 3), _params_at(ref_dir, 3)):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
  # Validation (replicated eval batches) and the export (written shard by shard) agree too.
  name = _config(task, "m").tasks[0].name
  np.testing.assert_allclose(summary["valid_cross_entropy"][name],
                             ref["valid_cross_entropy"][name], rtol=RTOL)
  exported = jax.tree.leaves(load_checkpoint(export, dtype=np.float32)[1])
  for a, b in zip(exported, _params_at(ref_dir, 3)):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
  # The checkpoint holds the params in shards (Orbax restores the saved layout).
  mgr = ocp.CheckpointManager(str(out / "checkpoints"))
  kernel = mgr.restore(3, args=ocp.args.StandardRestore())["params"]["decoder"]["logits_dense"][
      "kernel"]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, ("model_outer", "model_inner"))
  # Same batches in the same order.
  assert (out / "batches.jsonl").read_text() == (ref_dir / "batches.jsonl").read_text()


def test_sharded_crash_and_resume_equals_uninterrupted(setup):
  """Orbax saves and restores the sharded state (params, Adafactor statistics, counters)."""
  root, task, models = setup
  cfg = _config(task, models["t5_test_target"], mesh=MESH, checkpoint_every=2)
  straight, crashed = root / "sharded_straight", root / "sharded_crashed"
  train(cfg, str(straight), progress=False)
  with pytest.raises(RuntimeError, match="simulated crash"):
    train(cfg, str(crashed), crash_after_step=2, progress=False)
  assert train(cfg, str(crashed), progress=False)["steps"] == 3  # resumed from step 2
  for a, b in zip(_params_at(straight, 3), _params_at(crashed, 3)):
    np.testing.assert_array_equal(a, b)


def test_microbatches_give_the_whole_batch_update(setup, unsharded):
  root, task, models = setup
  ref_dir, _ = unsharded
  out = root / "microbatched"
  train(_config(task, models["t5_test_target"], num_microbatches=4), str(out), progress=False)
  np.testing.assert_allclose(_losses(out), _losses(ref_dir), rtol=RTOL)
  for a, b in zip(_params_at(out, 3), _params_at(ref_dir, 3)):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_params_and_optimizer_state_are_split_over_devices(setup):
  _, _, models = setup
  cfg, params = load_checkpoint(models["t5_test_target"], dtype=np.float32)
  tm, model, _ = sharded_lib.setup(MESH, Model(cfg), batch_size=8)
  placed = tm.place(params, tm.param_shardings(model))
  full = sum(x.nbytes for x in jax.tree.leaves(params))
  per_device = sharding.per_device_bytes(placed)
  assert len(per_device) == 8
  # Everything big (embeddings, logits, attention, MLP) is split 4 ways; layer-norm scales are not.
  assert max(per_device.values()) < full / 3
  # AdamW's moments mirror the params and are split the same way; Adafactor's factored rows and
  # columns keep the sharding of the axis they still have.
  for opt in (optax.adamw(1e-3), optax.adafactor(1e-3)):
    state = Placement(tm).opt_state(opt, placed)
    local = Placement(None).opt_state(opt, jax.device_get(placed))
    full_opt = sum(np.asarray(x).nbytes for x in jax.tree.leaves(local))
    assert max(sharding.per_device_bytes(state).values()) < full_opt / 2


@pytest.mark.parametrize("model,mesh,kw,match", [
    ("t5_test_draft", MESH, {}, "does not divide the model .* dimension 'heads' = 2"),
    ("t5_test_target", sharding.MeshConfig(data=4, model_outer=1, model_inner=2),
     dict(batch_size=6), "does not divide the batch size = 6"),
    ("t5_test_target", sharding.MeshConfig(data=4, model_outer=1, model_inner=2),
     dict(num_microbatches=4), "does not divide the batch size = 2"),
])
def test_mesh_that_does_not_divide_fails_before_compiling(setup, model, mesh, kw, match):
  root, task, models = setup
  out = root / f"bad_{model}_{len(kw)}_{kw.get('batch_size', 0)}"
  compiled = len(step_lib._STEP_CACHE)
  with pytest.raises(ValueError, match=match):
    train(_config(task, models[model], mesh=mesh, **kw), str(out), progress=False)
  assert len(step_lib._STEP_CACHE) == compiled  # no train step was built
  assert not (out / "checkpoints").exists()  # nor any data read or state written


def test_bad_microbatch_count_is_a_config_error():
  with pytest.raises(ValueError, match="num_microbatches"):
    TrainConfig(model="m", tasks=[data_lib.TaskSpec("a")], max_steps=1, batch_size=8,
                num_microbatches=3)
