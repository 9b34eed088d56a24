"""A killed run resumes without losing or duplicating an example.

Why: long paper runs get pre-empted. The kill is simulated at the worst moment: a batch's
predictions are (partly) on disk but its batch record is not, plus a torn last line.
"""
import json
import os

import gin
import pytest

from specdec_jax import run
from specdec_jax.metrics.records import BatchRecord
from specdec_jax.runner import store as store_lib
from specdec_jax.runner.run_config import RunConfig

SMOKE = "configs/local/smoke.gin"
BINDINGS = ["NUM_EXAMPLES = 6", "BATCH_SIZE = 2", "MAX_DECODE_LENGTH = 8", "RunConfig.repeats = 1",
            "GAMMA = 2"]


pytestmark = pytest.mark.usefixtures("clean_gin")


def _lines(path):
  with open(path) as f:
    return [json.loads(x) for x in f if x.strip()]


def test_killed_run_resumes_exactly_once(tmp_path, monkeypatch):
  out = str(tmp_path / "run")
  real_add = store_lib.ResultStore.add_batch
  calls = {"n": 0}

  def dying_add(self, record, predictions):
    calls["n"] += 1
    if calls["n"] == 2:  # killed after writing half the predictions, before the batch record
      predictions = list(predictions)
      with open(os.path.join(self.output_dir, store_lib.PREDICTIONS), "a") as f:
        f.write(json.dumps(predictions[0]) + "\n")
        f.write(json.dumps(predictions[1])[:25])  # torn line
      raise KeyboardInterrupt
    return real_add(self, record, predictions)

  monkeypatch.setattr(store_lib.ResultStore, "add_batch", dying_add)
  with pytest.raises(KeyboardInterrupt):
    run.run([SMOKE], out, BINDINGS)
  assert len(_lines(os.path.join(out, store_lib.BATCHES))) == 1
  monkeypatch.setattr(store_lib.ResultStore, "add_batch", real_add)
  gin.clear_config()
  metrics = run.run([SMOKE], out, BINDINGS)
  preds = _lines(os.path.join(out, "predictions.jsonl"))
  assert sorted(p["index"] for p in preds) == list(range(6))  # each example exactly once
  batches = _lines(os.path.join(out, store_lib.BATCHES))
  assert sorted(i for b in batches for i in b["indices"]) == list(range(6))
  (m,) = metrics
  assert m["num_examples"] == 6 and m["greedy_match_rate"] == 1.0
  for p in preds:  # greedy: every resumed output still equals the autoregressive one
    assert p["output_ids"] == p["autoregressive_output_ids"]


def _store_with_a_result(out, fingerprint):
  """A store that finished one batch (a store with no result has no claim on its directory)."""
  store = store_lib.ResultStore(out, fingerprint)
  store.add_batch(BatchRecord(group="t0", indices=(0,), points={}), [])
  return store


def test_changed_config_refuses_to_resume(tmp_path):
  out = str(tmp_path / "run")
  _store_with_a_result(out, {"gamma": 2})
  with pytest.raises(ValueError, match="different configuration"):
    store_lib.ResultStore(out, {"gamma": 3})


def test_changed_checkpoint_files_refuse_to_resume(tmp_path):
  """A checkpoint re-exported to the same path is a different configuration: resuming would
  continue results written with the old weights."""
  ckpt = tmp_path / "draft"
  ckpt.mkdir()
  (ckpt / "model_config.json").write_text('{"emb_dim": 8}')
  (ckpt / "weights.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB: sampled, not read whole
  base = dict(target_checkpoint="zoo_t5_target", draft_checkpoint=str(ckpt))
  first = RunConfig(**base).fingerprint()
  assert str(ckpt) in first["contents"] and "zoo_t5_target" not in first["contents"]
  assert RunConfig(**base).fingerprint() == first  # stable while nothing changes
  data = bytearray((ckpt / "weights.bin").read_bytes())
  data[-5] ^= 1  # one bit in the last sampled block
  (ckpt / "weights.bin").write_bytes(bytes(data))
  second = RunConfig(**base).fingerprint()
  assert second["contents"] != first["contents"]
  out = str(tmp_path / "run")
  _store_with_a_result(out, first)
  with pytest.raises(ValueError, match=r"changed: \['contents'\].*files of a checkpoint"):
    store_lib.ResultStore(out, second)


def test_zoo_checkpoint_digested_from_any_directory(tmp_path, monkeypatch):
  """Repo-relative checkpoint paths resolve as the loader resolves them, so the digest (and the
  refusal to resume onto other weights) does not depend on the working directory."""
  zoo = "specdec_jax/assets/zoo/t5_draft_small"
  here = RunConfig(target_checkpoint="zoo_t5_target", draft_checkpoint=zoo).fingerprint()
  monkeypatch.chdir(tmp_path)
  elsewhere = RunConfig(target_checkpoint="zoo_t5_target", draft_checkpoint=zoo).fingerprint()
  assert here["contents"] == elsewhere["contents"] and zoo in here["contents"]


def test_state_without_contents_names_the_reason(tmp_path):
  out = str(tmp_path / "run")
  _store_with_a_result(out, {"gamma": 2})  # a run directory written before content digests
  with pytest.raises(ValueError, match="written before runs recorded"):
    store_lib.ResultStore(out, {"gamma": 2, "contents": {"draft": "0123456789abcdef"}})
