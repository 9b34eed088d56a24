"""The smoke job end to end through the entry point, as a user runs it.

Why: this is the project's first main job; it must write every metrics.json contract key, one
predictions.jsonl line per example, the operative config and TensorBoard events that TensorBoard
itself can read. Greedy speculative output must equal greedy autoregressive output.
"""
import json
import os

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from specdec_jax.testing import run_in_process
from specdec_jax.metrics.report import CONTRACT_KEYS
from specdec_jax.metrics.tensorboard import read_scalars, run_dir

RUN_KEY = "draft=t5_test_draft,gamma=3,temperature=0"


@pytest.fixture(scope="module")
def smoke_dir(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("smoke"))
  run_in_process("--gin_file=configs/local/smoke.gin", f"--output_dir={out}",
                 "--gin.RunConfig.repeats=1")
  return out


def test_metrics_contract(smoke_dir):
  with open(os.path.join(smoke_dir, "metrics.json")) as f:
    m = json.load(f)
  assert isinstance(m, dict)
  missing = set(CONTRACT_KEYS) - set(m)
  assert not missing, missing
  assert m["num_examples"] == 8 and m["gamma"] == 3 and m["temperature"] == 0.0
  assert (m["target"], m["draft"]) == ("t5_test_target", "t5_test_draft")
  assert m["greedy_match_rate"] == 1.0
  for k in ("alpha", "acceptance_rate", "c", "v", "speedup", "speedup_predicted",
            "ar_ms_per_token", "spec_ms_per_token", "tokens_per_target_call"):
    assert isinstance(m[k], float), k
  assert 0.0 <= m["alpha"] <= 1.0 and m["tokens_per_target_call"] >= 1.0
  assert len(m["accepts_per_position"]) == 3 and len(m["accepted_length_hist"]) == 4
  assert set(m["quality"]) >= {"metric", "autoregressive", "speculative"}


def test_predictions(smoke_dir):
  with open(os.path.join(smoke_dir, "predictions.jsonl")) as f:
    lines = [json.loads(line) for line in f]
  assert sorted(p["index"] for p in lines) == list(range(8))
  for p in lines:
    assert p["run"] == RUN_KEY and "text" in p
    assert p["output_ids"] == p["autoregressive_output_ids"] and p["match"]
    assert 1 <= len(p["output_ids"]) <= 16


def test_config_and_tensorboard(smoke_dir):
  with open(os.path.join(smoke_dir, "config.gin")) as f:
    text = f.read()
  assert "RunConfig.gamma = %GAMMA" in text and "GAMMA = 3" in text
  scalars = read_scalars(run_dir(smoke_dir, RUN_KEY))
  for tag in ("metrics/alpha", "metrics/acceptance_rate", "metrics/speedup",
              "metrics/speedup_predicted", "metrics/c", "metrics/v",
              "metrics/tokens_per_target_call", "metrics/spec_ms_per_token",
              "acceptance_per_position/1", "progress/running_alpha", "progress/tokens_per_s"):
    assert tag in scalars, tag
  acc = EventAccumulator(run_dir(smoke_dir, RUN_KEY))
  acc.Reload()
  assert "accepted_length" in acc.Tags()["histograms"]
  root = EventAccumulator(os.path.join(smoke_dir, "tensorboard"))
  root.Reload()
  assert any("config" in t for t in root.Tags()["tensors"])


def test_an_int8_draft_through_the_entry_point(tmp_path):
  """`RunConfig.draft_panels = 'int8'`: the run decodes with the quantized draft (another draft:
  the target's greedy output all the same), records the setting in its fingerprint, and refuses
  a bad value before writing anything."""
  from specdec_jax.models import packed
  from specdec_jax.runner.run_config import DRAFT_PANELS, RunConfig
  assert DRAFT_PANELS == packed.PANELS  # the run's choices are the packer's
  assert "draft_panels" not in RunConfig().fingerprint()
  assert RunConfig(draft_panels="int8").fingerprint()["draft_panels"] == "int8"
  with pytest.raises(ValueError, match="draft_panels must be one of"):
    RunConfig(draft_panels="int4")
  out = str(tmp_path / "int8")
  run_in_process("--gin_file=configs/local/smoke.gin", f"--output_dir={out}",
                 "--gin.RunConfig.repeats=1", "--gin.RunConfig.draft_panels='int8'")
  with open(os.path.join(out, "metrics.json")) as f:
    m = json.load(f)
  assert m["greedy_match_rate"] == 1.0 and m["num_examples"] == 8
