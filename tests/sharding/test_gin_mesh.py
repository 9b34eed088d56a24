"""Meshes come from gin (gin/mesh/*.gin), and the documented TPU layouts fit the paper's models.

Why: a mesh setting that does not divide T5-XXL's heads, or a draft's, would only fail on a TPU
slice after minutes of start-up. These checks need no TPU: `validate` reads shapes only, so an
`AbstractMesh` of the slice's size stands in for the real one.
"""
import os

import pytest
from jax.sharding import AbstractMesh

from specdec_jax import run, sharding as sh
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


pytestmark = pytest.mark.usefixtures("clean_gin")


def _parse(*files, bindings=()):
  return run.parse([os.path.join(ROOT, f) for f in files], list(bindings))


def test_smoke_sharded_binds_the_draft_on_fewer_chips_mesh():
  cfg = _parse("configs/local/smoke_sharded.gin")
  m = cfg.mesh
  assert isinstance(m, sh.MeshConfig)
  assert m.shape == (2, 2, 2) and m.num_cpu_devices == 8
  # gin/mesh/standard_rules.gin spells out exactly what the code's default rules are.
  assert m.rules_for("target") == sh.rules_to_hashable(sh.standard_rules(sh.TARGET_MODEL_AXES))
  assert m.rules_for("draft") == sh.rules_to_hashable(sh.standard_rules(sh.DRAFT_MODEL_AXES))
  assert dict(m.rules_for("draft"))["heads"] == "model_inner"
  assert dict(m.rules_for("target"))["heads"] == ("model_outer", "model_inner")
  mesh = sh.make_mesh(m)
  assert dict(mesh.shape) == {"data": 2, "model_outer": 2, "model_inner": 2}


def test_smoke_without_mesh_module_is_unsharded():
  assert _parse("configs/local/smoke.gin").mesh is None


def test_draft_replicated_module():
  cfg = _parse("configs/local/smoke.gin", "gin/mesh/cpu8_draft_on_2.gin",
               "gin/mesh/draft_replicated.gin")
  rules = dict(cfg.mesh.rules_for("draft"))
  assert rules["heads"] is None and rules["vocab"] is None and rules["batch"] == "data"


@pytest.mark.parametrize("module,devices", [("gin/mesh/tpu_v4_8.gin", 4),
                                            ("gin/mesh/tpu_v4_32.gin", 16)])
def test_tpu_meshes_fit_t5_xxl_and_its_drafts(module, devices):
  m = _parse("configs/local/smoke.gin", module).mesh
  shape = m.resolved_shape(devices)
  mesh = AbstractMesh(shape, sh.MESH_AXES)
  sh.validate(mesh, Model(get_preset("t5_1_1_xxl")), m.rules_for("target"), name="target",
              batch_size=1)
  for draft in ("t5_1_1_small", "t5_1_1_base", "t5_1_1_large"):
    sh.validate(mesh, Model(get_preset(draft)), m.rules_for("draft"), name=draft, batch_size=1)
  # The target really spans every chip; the draft fewer.
  assert shape[1] * shape[2] == devices and shape[2] < devices


@pytest.mark.slow
def test_smoke_sharded_runs_end_to_end(tmp_path):
  """`python -m specdec_jax.run --gin_file=configs/local/smoke_sharded.gin`, in process (~1 min)."""
  metrics = run.run([os.path.join(ROOT, "configs/local/smoke_sharded.gin")], str(tmp_path),
                    ["RunConfig.repeats = 1", "NUM_EXAMPLES = 4"])
  m = metrics[0] if isinstance(metrics, list) else metrics
  assert m["greedy_match_rate"] == 1.0
  assert os.path.exists(tmp_path / "predictions.jsonl")
