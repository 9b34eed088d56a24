"""configs/paper/train/: T5X's fine-tuning of T5 v1.1 on the paper's tasks, on meshes that fit.

Why: these configs only run on Cloud TPU, where a wrong learning rate, task name or a mesh that
does not divide T5-XXL is found after the slice has started and the checkpoint has loaded. The
recipe is checked against T5X's values, and every mesh against its model on shapes alone (an
`AbstractMesh` of the slice's size: no TPU needed). tests/test_configs.py parses every file too.
"""
import glob
import os

import pytest
from jax.sharding import AbstractMesh

from specdec_jax import sharding as sh
from specdec_jax import train
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_DIR = os.path.join(ROOT, "configs", "paper", "train")
TASKS = {"ende": "wmt_t2t_ende_v003", "cnndm": "cnn_dailymail"}
SIZES = ("small", "base", "large", "xxl")


pytestmark = pytest.mark.usefixtures("clean_gin")


def _parse(*files):
  return train.parse([os.path.join(ROOT, f) for f in files])


def test_there_is_one_config_per_model_and_task():
  names = {os.path.basename(p) for p in glob.glob(os.path.join(TRAIN_DIR, "*_t5_*.gin"))}
  assert names == {f"{t}_t5_{s}.gin" for t in TASKS for s in SIZES}


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("size", SIZES)
def test_t5x_finetuning_recipe(task, size):
  cfg = _parse(f"configs/paper/train/{task}_t5_{size}.gin")
  assert cfg.model == f"gs://t5-data/pretrained_models/t5x/t5_1_1_{size}/checkpoint_1000000"
  assert (cfg.optimizer, cfg.learning_rate, cfg.schedule, cfg.warmup_steps) == (
      "adafactor", 1e-3, "constant", 0)
  assert (cfg.batch_size, cfg.z_loss, cfg.dtype, cfg.teacher) == (128, 1e-4, "bfloat16", None)
  (spec,) = cfg.tasks
  assert spec.name == TASKS[task]
  assert (spec.input_len, spec.target_len) == ((256, 256) if task == "ende" else (512, 128))
  assert isinstance(cfg.mesh, sh.MeshConfig)


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("size", SIZES[:3])
def test_small_models_are_data_parallel_on_a_v4_8(task, size):
  cfg = _parse(f"configs/paper/train/{task}_t5_{size}.gin")
  shape = cfg.mesh.resolved_shape(4)
  assert shape == (4, 1, 1)
  sh.validate(AbstractMesh(shape, sh.MESH_AXES), Model(get_preset(f"t5_1_1_{size}")),
              cfg.mesh.rules_for("target"), batch_size=cfg.batch_size // cfg.num_microbatches)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_xxl_with_the_v4_32_mesh_module_fits_the_slice(task):
  cfg = _parse(f"configs/paper/train/{task}_t5_xxl.gin", "gin/mesh/tpu_v4_32.gin")
  assert cfg.mesh.shape == (1, 8, 2)
  mesh = AbstractMesh(cfg.mesh.resolved_shape(16), sh.MESH_AXES)
  model = Model(get_preset("t5_1_1_xxl"))
  rules = cfg.mesh.rules_for("target")
  sh.validate(mesh, model, rules, batch_size=cfg.batch_size // cfg.num_microbatches)
  assert dict(rules)["heads"] == ("model_outer", "model_inner")  # all 16 chips
  # Without the module, the file's own mesh is the same layout on the same slice.
  assert _parse(f"configs/paper/train/{task}_t5_xxl.gin").mesh.resolved_shape(16) == (1, 8, 2)


def test_a_mesh_module_gives_any_train_config_its_mesh():
  """gin/mesh/*.gin bind RunConfig.mesh; the trainer takes that MeshConfig when it has none."""
  assert _parse("configs/local/train/t5_target.gin").mesh is None
  cfg = _parse("configs/local/train/t5_target.gin", "gin/mesh/cpu8_draft_on_2.gin")
  assert cfg.mesh.shape == (2, 2, 2) and cfg.mesh.num_cpu_devices == 8
