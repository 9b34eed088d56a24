"""Flags and gin handling of the entry point (no decoding, fast).

Why: a typo in a binding must fail loudly before anything runs; gin alone would silently create
a new macro that nothing reads.
"""
import os

import gin
import pytest

from specdec_jax import gin_utils, paths, run

SMOKE = "configs/local/smoke.gin"


pytestmark = pytest.mark.usefixtures("clean_gin")


def test_rewrite_gin_args():
  out = gin_utils.rewrite_gin_args(
      ["prog", "--gin.MODE=benchmark", "--gin.GAMMA=4", "--gin.TEMPERATURE=0.5",
       "--gin.TASK='summarize'", "--gin.GAMMA=[1, 2, 'auto']", "--gin.RunConfig.resume=False",
       "--output_dir=/tmp/x", "--gin.TARGET_CHECKPOINT=/ckpt/t5"])
  assert out == ["prog", "--gin_bindings=MODE = 'benchmark'", "--gin_bindings=GAMMA = 4",
                 "--gin_bindings=TEMPERATURE = 0.5", "--gin_bindings=TASK = 'summarize'",
                 "--gin_bindings=GAMMA = [1, 2, 'auto']",
                 "--gin_bindings=RunConfig.resume = False", "--output_dir=/tmp/x",
                 "--gin_bindings=TARGET_CHECKPOINT = '/ckpt/t5'"]


def test_parse_smoke_with_overrides():
  cfg = run.parse([SMOKE], ["GAMMA = 5", "TEMPERATURE = 0.7", "RunConfig.repeats = 2"])
  assert (cfg.gamma, cfg.temperature, cfg.repeats, cfg.mode) == (5, 0.7, 2, "benchmark")


def test_unknown_macro_binding_raises():
  with pytest.raises(ValueError, match=r"unknown gin binding.*TEMPRATURE"):
    run.parse([SMOKE], ["TEMPRATURE = 1.0"])


def test_unknown_parameter_and_configurable_raise():
  with pytest.raises(ValueError, match="bogus"):
    run.parse([SMOKE], ["RunConfig.bogus = 1"])
  with pytest.raises(ValueError, match="No configurable matching"):
    run.parse([SMOKE], ["NoSuchThing.x = 1"])


def test_invalid_values_raise_clear_errors():
  with pytest.raises(ValueError, match="MODE must be one of"):
    run.parse([SMOKE], ["MODE = 'fast'"])
  with pytest.raises(ValueError, match="GAMMA must be"):
    run.parse([SMOKE], ["GAMMA = 'many'"])


def test_repo_root_is_a_default_search_path(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  cfg = run.parse([SMOKE])
  assert cfg.target_checkpoint == "t5_test_target"
  assert paths.PACKAGE_PARENT in gin_utils.default_search_paths()
  assert os.path.isfile(os.path.join(paths.PACKAGE_PARENT, SMOKE))


def test_missing_gin_file_raises():
  with pytest.raises(ValueError, match="no --gin_file"):
    run.parse([])
