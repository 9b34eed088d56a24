"""Runs name checkpoints by path (the zoo's own orbax format), as configs/local/*.gin will once the
zoo is trained: a tiny T5 pair with the shipped vocabulary's size, saved and decoded from disk on
a text task (tokenised with the shipped vocabulary, BLEU against the references)."""
import jax
import pytest

from specdec_jax import run
from specdec_jax.checkpoints import orbax_io
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model


pytestmark = pytest.mark.usefixtures("clean_gin")


@pytest.mark.slow
def test_local_config_with_checkpoint_paths(tmp_path):
  paths = {}
  for name, seed in (("t5_test_target", 0), ("t5_test_draft", 1)):
    cfg = get_preset(name, vocab_size=8192)
    params = jax.jit(Model(cfg).init)(jax.random.key(seed))
    paths[name] = str(tmp_path / name)
    orbax_io.save(paths[name], cfg, params)
  out = str(tmp_path / "run")
  (m,) = run.run(["configs/local/ende.gin"], out, [
      f"TARGET_CHECKPOINT = '{paths['t5_test_target']}'",
      f"DRAFT_CHECKPOINT = '{paths['t5_test_draft']}'",
      "NUM_EXAMPLES = 2", "MAX_DECODE_LENGTH = 6", "GAMMA = 2", "RunConfig.repeats = 1"])
  assert (m["target"], m["draft"]) == ("t5_test_target", "t5_test_draft")
  assert m["greedy_match_rate"] == 1.0 and m["quality"]["metric"] == "bleu"
  assert m["quality"]["autoregressive"] is not None
