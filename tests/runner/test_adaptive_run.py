"""GAMMA='adaptive' through the run: one gin binding selects the adaptive draft length.

Why: the adaptive loop (decoding/adaptive.py) is exact and runs on device like the fixed one; a
user must be able to choose it from a config as any other gamma, and see it in metrics.json.
"""
import json
import os

import pytest

from specdec_jax import run

pytestmark = pytest.mark.usefixtures("clean_gin")


def test_one_binding_selects_adaptive(tmp_path):
  out = str(tmp_path)
  metrics = run.run(["configs/local/smoke.gin"], out, [
      "GAMMA = 'adaptive'", "NUM_EXAMPLES = 4", "MAX_DECODE_LENGTH = 8", "RunConfig.repeats = 1",
      "RunConfig.gamma_max = 5"])
  (m,) = metrics
  assert m["run"] == "draft=t5_test_draft,gamma=adaptive,temperature=0"
  assert m["gamma"] == 5 and m["adaptive"]["gamma_max"] == 5
  assert m["greedy_match_rate"] == 1.0
  assert m["speedup_predicted"] is None  # the fixed-gamma formula does not apply
  assert m["alpha"] is not None and m["tokens_per_target_call"] >= 1.0
  with open(os.path.join(out, "metrics.json")) as f:
    assert json.load(f)["run"] == m["run"]


@pytest.mark.slow
def test_gin_module_binds_its_knobs(tmp_path):
  metrics = run.run(["configs/local/smoke.gin", "gin/decoding/adaptive.gin"], str(tmp_path), [
      "NUM_EXAMPLES = 4", "MAX_DECODE_LENGTH = 8", "RunConfig.repeats = 1",
      "AdaptiveConfig.gamma_max = 3", "AdaptiveConfig.confidence_threshold = 0.4"])
  (m,) = metrics
  assert m["adaptive"]["gamma_max"] == 3 and m["adaptive"]["confidence_threshold"] == 0.4
  assert m["greedy_match_rate"] == 1.0
