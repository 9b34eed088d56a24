"""Nothing shipped is ever written by a command (issue 31).

Why: the README's training command once exported over `specdec_jax/assets/zoo/t5_draft_small`
(git status showed the shipped weights modified). Training recipes now export under their
--output_dir, and every writer refuses a path inside the package's assets (`paths.check_writable`).
The end-to-end test runs the README's recipe command itself (two steps) and compares a digest of
every shipped file before and after.
"""
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from specdec_jax import paths
from specdec_jax.paths import ASSETS_DIR, PACKAGE_PARENT, ReadOnlyAssetsError

README_TRAIN = ("-m", "specdec_jax.train", "--gin_file=configs/local/train/t5_draft_small.gin")


def _digest(root) -> str:
  """sha256 over every file's relative path and bytes under `root`."""
  h = hashlib.sha256()
  for d, dirs, files in os.walk(root):
    dirs.sort()
    for name in sorted(files):
      p = os.path.join(d, name)
      h.update(os.path.relpath(p, root).encode())
      with open(p, "rb") as f:
        h.update(f.read())
  return h.hexdigest()


def _git_status(path) -> str | None:
  """`git status --porcelain` of `path`, or None outside a git checkout."""
  try:
    out = subprocess.run(["git", "status", "--porcelain", "--", str(path)], cwd=PACKAGE_PARENT,
                         capture_output=True, text=True, timeout=60, check=False)
  except (OSError, subprocess.TimeoutExpired):
    return None
  return out.stdout if out.returncode == 0 else None


def test_check_writable_refuses_the_assets_and_nothing_else(tmp_path, monkeypatch):
  monkeypatch.chdir(PACKAGE_PARENT)
  for bad in ("specdec_jax/assets/zoo/t5_draft_small", str(ASSETS_DIR), str(ASSETS_DIR / "new")):
    with pytest.raises(ReadOnlyAssetsError, match="read-only"):
      paths.check_writable(bad, "the export")
  link = tmp_path / "zoo_link"
  link.symlink_to(ASSETS_DIR / "zoo")
  with pytest.raises(ReadOnlyAssetsError):  # a symbolic link into the assets is the assets
    paths.check_writable(str(link / "t5_draft_small"))
  for good in (str(tmp_path / "out"), "runs/train/x", "gs://bucket/specdec_jax/assets/zoo"):
    assert paths.check_writable(good) == good
  monkeypatch.chdir(tmp_path)  # relative to another working directory: not the package's
  assert paths.check_writable("specdec_jax/assets/zoo/x") == "specdec_jax/assets/zoo/x"


def test_orbax_save_refuses_the_zoo():
  from specdec_jax.checkpoints import orbax_io
  from specdec_jax.models.model_config import get_preset
  target = ASSETS_DIR / "zoo" / "never_written"
  with pytest.raises(ReadOnlyAssetsError):
    orbax_io.save(str(target), get_preset("t5_test_draft"), {"x": np.zeros(1)})
  assert not target.exists()


def test_recipes_export_under_their_output_dir(clean_gin, tmp_path):
  from specdec_jax import train
  import gin
  folder = os.path.join(PACKAGE_PARENT, "configs/local/train")
  text = lambda f: open(os.path.join(folder, f), encoding="utf-8").read()  # noqa: E731
  recipes = [f for f in sorted(os.listdir(folder)) if f.endswith(".gin")
             and "\nTrainConfig.export_dir" in text(f)]
  assert all("export_dir = 'export'" in text(f) for f in os.listdir(folder)
             if f.endswith(".gin") and "FeatureTrainConfig.export_dir" in text(f))  # its trainer
  assert len(recipes) > 10
  for name in recipes:
    gin.clear_config()
    cfg = train.parse([f"configs/local/train/{name}"])
    assert cfg.export_path(str(tmp_path)) == str(tmp_path / "export"), name


def test_train_refuses_an_export_into_the_assets_before_training(clean_gin, tmp_path):
  from specdec_jax import train
  with pytest.raises(ReadOnlyAssetsError):
    train.train(["configs/local/train/t5_draft_small.gin"], str(tmp_path / "out"),
                [f"TrainConfig.export_dir = '{ASSETS_DIR / 'zoo' / 't5_draft_small'}'"])
  assert not (tmp_path / "out").exists()  # refused before anything was written


def test_readme_training_command_leaves_the_assets_unchanged(tmp_path):
  with open(os.path.join(PACKAGE_PARENT, "README.md"), encoding="utf-8") as f:
    assert "python " + " ".join(README_TRAIN) in f.read()  # the command the README gives
  before, status_before = _digest(ASSETS_DIR), _git_status(ASSETS_DIR)
  out = tmp_path / "t5_draft_small"
  env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.run(
      [sys.executable, *README_TRAIN, f"--output_dir={out}", "--gin.TrainConfig.max_steps=2",
       "--gin.TrainConfig.batch_size=4", "--gin.TrainConfig.eval_examples=0"],
      cwd=PACKAGE_PARENT, env=env, capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (out / "export" / "model_config.json").is_file()  # the export is the run's own
  assert _digest(ASSETS_DIR) == before
  if status_before is not None:
    assert _git_status(ASSETS_DIR) == status_before == ""


def test_head_rankings_and_hf_exports_refuse_the_zoo():
  """Two more writers (a reviewer found them unguarded): scripts/head_ranking.py's
  `write_ranking` into a checkpoint directory, and `checkpoints.hf.to_hf`."""
  from specdec_jax.checkpoints import head_ranking, hf
  from specdec_jax.models.model_config import get_preset
  zoo = ASSETS_DIR / "zoo" / "t5_draft_small"
  before = sorted(p.name for p in zoo.iterdir())
  with pytest.raises(ReadOnlyAssetsError):
    head_ranking.write_ranking(str(zoo), list(range(4)), 4, "test")
  with pytest.raises(ReadOnlyAssetsError):
    hf.to_hf(get_preset("t5_test_draft"), {}, str(ASSETS_DIR / "zoo" / "never_written"))
  assert sorted(p.name for p in zoo.iterdir()) == before
  assert not (ASSETS_DIR / "zoo" / "never_written").exists()
