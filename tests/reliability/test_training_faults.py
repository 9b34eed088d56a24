"""Faults the framework survives: training that diverges, bad numbers, refused resumes, a second
training job in the same directory, and weights that are not finite.

Each test names the fault it reproduces; on the main branch before these fixes each failed: a NaN
or infinite learning rate trained "successfully" (loss NaN) and exported NaN weights, that export
then drafted with alpha NaN, a refused resume had already overwritten config.gin, and two
training jobs could write one directory.
"""
import json
import os

import jax
import numpy as np
import pytest

from specdec_jax import lock
from specdec_jax import train as train_entry
from specdec_jax.checkpoints import loader, orbax_io
from specdec_jax.checkpoints.tree import CheckpointError
from specdec_jax.models.model_config import get_preset
from specdec_jax.training import data as data_lib
from specdec_jax.training.trainer import NonFiniteTraining, TrainConfig, train


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """(task file, model dir): the tiny draft preset with the shipped vocabulary's embedding."""
  root = tmp_path_factory.mktemp("faults")
  lines = [{"en": f"The dog number {i} ran to park {i % 5}.", "de": f"Der Hund {i} lief."}
           for i in range(32)]
  path = root / "pairs.jsonl"
  path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
  cfg = get_preset("t5_test_draft", vocab_size=8192)
  model_dir = str(root / "init")
  orbax_io.save(model_dir, cfg, jax.device_get(loader.load_model(
      "t5_test_draft", vocab_size=8192)[1]))
  return str(path), model_dir


@pytest.fixture
def task(setup):
  return setup


def _config(task, **kw):
  task, model = task
  spec = data_lib.TaskSpec(name=task, input_len=16, target_len=8)
  base = dict(model=model, tasks=[spec], max_steps=4, batch_size=4, checkpoint_every=2,
              log_every=1, eval_examples=0, export_dir=None, learning_rate=0.01)
  return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("name,value", [
    ("learning_rate", float("nan")), ("learning_rate", float("inf")), ("learning_rate", 0.0),
    ("weight_decay", float("nan")), ("z_loss", float("-inf")), ("distill_temperature", 0.0),
    ("on_policy_temperature", float("nan")), ("max_train_seconds", float("nan")),
    ("checkpoint_every", 0), ("log_every", 0), ("warmup_steps", -1)])
def test_every_numeric_training_setting_must_be_finite_and_in_range(task, name, value):
  with pytest.raises(ValueError, match=name):
    _config(task, **{name: value})


def test_a_diverging_run_stops_at_the_step_names_it_and_saves_nothing_bad(task, tmp_path):
  """A finite but absurd learning rate drives the weights to infinity within a few steps: the run
  stops naming the step and the quantity, keeps only finite checkpoints, and exports nothing."""
  out, export = tmp_path / "run", tmp_path / "export"
  cfg = _config(task, optimizer="adamw", learning_rate=1e30, max_steps=6, checkpoint_every=1,
                export_dir=str(export))
  with pytest.raises(NonFiniteTraining, match=r"training stopped at step \d+: .*not finite"):
    train(cfg, str(out), progress=False)
  assert not export.exists()
  import orbax.checkpoint as ocp
  mgr = ocp.CheckpointManager(str(out / "checkpoints"))
  for step in mgr.all_steps():
    params = mgr.restore(step, args=ocp.args.StandardRestore())["params"]
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params)), step


def test_non_finite_weights_cannot_be_saved_or_loaded(tmp_path, monkeypatch):
  cfg = get_preset("t5_test_draft")
  _, params = loader.load_model("t5_test_draft")
  params = jax.tree.map(np.array, params)  # writable copies
  params["decoder"]["decoder_norm"]["scale"][3] = np.nan
  with pytest.raises(CheckpointError, match="decoder_norm/scale"):
    orbax_io.save(str(tmp_path / "nan"), cfg, params)
  assert not (tmp_path / "nan").exists()  # refused before anything was written
  # Written anyway (a file from elsewhere): the loader refuses it, naming the array.
  monkeypatch.setattr(orbax_io, "check_finite", lambda *a: None)
  orbax_io.save(str(tmp_path / "nan"), cfg, params)
  monkeypatch.undo()
  with pytest.raises(CheckpointError, match="NaN or infinite.*decoder_norm/scale"):
    loader.load_model(str(tmp_path / "nan"))


def _gin(tmp_path, task, seed):
  task, model = task
  path = tmp_path / f"train_{seed}.gin"
  path.write_text(f"""
TrainConfig.model = '{model}'
TrainConfig.tasks = [@TaskSpec()]
TaskSpec.name = '{task}'
TaskSpec.input_len = 16
TaskSpec.target_len = 8
TrainConfig.max_steps = 2
TrainConfig.batch_size = 4
TrainConfig.checkpoint_every = 1
TrainConfig.eval_examples = 0
TrainConfig.seed = {seed}
""")
  return str(path)


def test_a_refused_training_resume_writes_nothing(task, tmp_path):
  out = tmp_path / "run"
  train_entry.train([_gin(tmp_path, task, 0)], str(out), progress=False)
  before = {p: (out / p).read_bytes() for p in ("config.gin", "run_key.json",
                                                "train_summary.json")}
  with pytest.raises(ValueError, match=r"different \['seed'\]"):
    train_entry.train([_gin(tmp_path, task, 1)], str(out), progress=False)
  assert {p: (out / p).read_bytes() for p in before} == before


def test_a_second_training_job_in_the_same_directory_is_refused(task, tmp_path):
  out = tmp_path / "run"
  with lock.hold(str(out), "training job"):  # this process holds it as another job would
    pid = os.getpid()
    # flock is per open file description: a second hold in this process is refused like another
    # process would be.
    with pytest.raises(lock.DirectoryLocked, match=f"pid {pid}"):
      train_entry.train([_gin(tmp_path, task, 0)], str(out), progress=False)
  assert not (out / "checkpoints").exists()
