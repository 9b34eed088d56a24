"""The runner's view of drafts: names, kinds, and the calibration alpha (review defects 3-5).

Why: a sweep files each draft's results under its name, refuses a draft that cannot serve the
target before anything compiles, and chooses GAMMA='auto' from an alpha that must be the prompts'
alpha, not the padding's.
"""
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.runner import calibrate, pipeline, run_config as config_lib
from specdec_jax.runner.run_config import DraftSpec, RunConfig
from specdec_jax.testing import WrongOnRows, tiny_pair


def test_drafts_in_same_named_folders_get_distinct_names():
  """Defect 3: runs/a/export and runs/b/export were both 'export' (one decoded, both reported)."""
  cfg = RunConfig(draft_checkpoint=["runs/a/export", "runs/b/export", "runs/b/other"],
                  gamma=[2, 3])
  specs = config_lib.draft_specs(cfg)
  assert [s.name for s in specs] == ["a/export", "b/export", "other"]
  keys = [p.key for p in config_lib.points(cfg)]
  assert len(keys) == len(set(keys)) == 6
  # Named twice is the same draft, decoded once.
  assert len(config_lib.draft_specs(RunConfig(draft_checkpoint=["x/d", "x/d"]))) == 1
  assert DraftSpec("model", "runs/a/export").name == "export"  # no clash: the folder name


def test_draft_of_the_other_kind_is_refused_at_load():
  """Defect 4: a T5 target with a decoder-only draft ran to the end with alpha 0.000."""
  cfg = RunConfig(target_checkpoint="t5_test_target", draft_checkpoint="decoder_test_draft",
                  task="configs/local/smoke_prompts.jsonl", num_examples=2, max_input_length=32)
  with pytest.raises(ValueError, match=r"decoder_test_draft.*decoder-only.*kind 'decoder'.*"
                                       r"encoder-decoder \(T5\) model \(kind 't5'\)"):
    pipeline.load(cfg)


def test_calibration_alpha_counts_real_rows_only():
  """Defect 5: rows that pad a batch to a data-parallel mesh entered the calibration alpha."""
  target, tp, _, _ = tiny_pair("decoder", seed=5)
  draft = WrongOnRows(target, rows=(1,))  # agrees on row 0, never on row 1 (the padding row)
  a = np.array([[5, 6, 7, 2]], np.int32)
  b = np.array([[9, 3, 0, 0]], np.int32)
  decoder = Decoder(target, draft, Chain(3), SamplingConfig(), rule="tokenwise", max_decode_len=8)

  def alpha(x, rows):
    return calibrate.calibration_acceptance(decoder, Params(tp, tp), x, rows=rows, seed=0)["alpha"]
  alone = alpha(a, rows=1)
  padded = alpha(np.concatenate([a, b]), rows=1)
  both = alpha(np.concatenate([a, b]), rows=2)
  assert alone == pytest.approx(1.0) and padded == pytest.approx(1.0)
  assert both < 0.9  # the padding row would have pulled it down
