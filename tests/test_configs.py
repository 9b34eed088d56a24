"""Every config under configs/ parses, binds every required macro and yields a valid RunConfig.

Why: a config that only breaks when someone runs it is found late (levanter tests every config
file). Macros left as %gin.REQUIRED are bound to a placeholder, as a user would on the command line.
"""
import glob
import os

import gin
import pytest

from specdec_jax import gin_utils, run
from specdec_jax.runner.config import RunConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.gin"), recursive=True))
REQUIRED_MACROS = ("TARGET_CHECKPOINT", "DRAFT_CHECKPOINT", "DRAFT", "TASK", "NUM_EXAMPLES",
                   "BATCH_SIZE", "GAMMA", "TEMPERATURE", "TOP_K", "TOP_P", "SEED", "MODE",
                   "MAX_DECODE_LENGTH")
PLACEHOLDERS = {"TARGET_CHECKPOINT": "'t5_test_target'", "DRAFT_CHECKPOINT": "'t5_test_draft'",
                "TASK": "'translate_en_de'"}


@pytest.fixture(autouse=True)
def _clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _required_bindings(path):
  """Placeholder bindings for macros the file leaves as %gin.REQUIRED."""
  run.register_configurables()
  gin.clear_config()
  gin_utils.add_search_paths()
  gin.parse_config_file(path)
  out = []
  for name in REQUIRED_MACROS:
    if gin_utils.macro_defined(name) and repr(gin.query_parameter(f"%{name}")) == "%gin.REQUIRED":
      out.append(f"{name} = {PLACEHOLDERS.get(name, '1')}")
  gin.clear_config()
  return out


def test_there_are_configs():
  names = {os.path.relpath(c, ROOT) for c in CONFIGS}
  for must in ("smoke", "ende", "summarize", "code", "default"):
    assert f"configs/local/{must}.gin" in names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, ROOT))
def test_config_parses(path):
  cfg = run.parse([path], _required_bindings(path))
  assert isinstance(cfg, RunConfig)
  for name in REQUIRED_MACROS:
    assert gin_utils.macro_defined(name), f"{path} does not declare {name}"
  with open(path) as f:
    assert "Required / commonly overridden" in f.read(), f"{path} lacks the macro header"
