"""Model-free drafts (Leviathan Table 3's unigram and bigram, prompt lookup) through the runner."""
import json
import os

import gin
import pytest

from specdec_jax import run


@pytest.fixture(autouse=True)
def _clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.mark.slow
def test_unigram_bigram_prompt_lookup_alpha_only(tmp_path):
  out = str(tmp_path)
  metrics = run.run(["configs/local/smoke.gin"], out, [
      "DRAFT = ['bigram', 'prompt_lookup']", "MODE = 'speculative'",
      "NUM_EXAMPLES = 4", "MAX_DECODE_LENGTH = 8", "GAMMA = 2", "RunConfig.repeats = 1"])
  assert [m["draft"] for m in metrics] == ["bigram", "prompt_lookup"]
  for m in metrics:
    assert 0.0 <= m["alpha"] <= 1.0 and m["num_examples"] == 4
    assert m["speedup"] is None  # speculative mode: no baseline timed
  with open(os.path.join(out, "metrics.json")) as f:
    assert len(json.load(f)) == 2
