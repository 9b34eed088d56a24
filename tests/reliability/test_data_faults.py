"""Faults the framework survives: data that changed under a run, prompts that do not fit, fields
of the wrong type, sidecar files that are not what they claim, and a swapped pair.

Each test names the fault it reproduces; on the main branch before these fixes each failed: a run
resumed over new prompts written to the same path ("6/6 examples already on disk", the old
outputs kept), over-long input_ids lost their EOS silently, a non-string reference silently
switched the quality metric off, a malformed model_config.json / missing `_METADATA` / broken
HF index raised errors naming no file, and a draft larger than its target ran without a word.
"""
import json
import logging as std_logging

import gin
import pytest

from specdec_jax import run
from specdec_jax.checkpoints import hf, loader, orbax_io, t5x_orbax
from specdec_jax.checkpoints.tree import CheckpointError
from specdec_jax.data import local_tasks, tasks
from specdec_jax.data.local_tasks import Example
from specdec_jax.runner import drafts
from specdec_jax.runner.run_config import DraftSpec, RunConfig

SMOKE = "configs/local/smoke.gin"

pytestmark = pytest.mark.usefixtures("clean_gin")


def _write_task(path, words):
  path.write_text("\n".join(json.dumps({"en": f"The {w} sat on the mat.", "de": f"Die {w}."})
                            for w in words) + "\n")


@pytest.mark.slow  # two runs (~20 s); the fingerprint's task digest is tested fast beside it
def test_new_prompts_at_the_same_path_refuse_to_resume(tmp_path):
  task, out = tmp_path / "prompts.jsonl", str(tmp_path / "run")
  _write_task(task, ["cat", "dog", "bird", "fish"])
  bindings = [f"TASK = '{task}'", "NUM_EXAMPLES = 4", "BATCH_SIZE = 2", "MAX_DECODE_LENGTH = 4",
              "RunConfig.repeats = 1", "GAMMA = 2"]
  run.run([SMOKE], out, bindings)
  gin.clear_config()
  _write_task(task, ["cow", "pig", "hen", "eel"])  # same path, same size, new prompts
  with pytest.raises(ValueError, match=r"task_contents.*the task's data changed"):
    run.run([SMOKE], out, bindings)


def test_the_fingerprint_digests_every_byte_of_the_task(tmp_path):
  task = tmp_path / "prompts.jsonl"
  _write_task(task, ["cat"] * 40000)  # > 1 MiB: checkpoints are sampled, task files are not
  first = RunConfig(task=str(task)).fingerprint()["task_contents"]
  data = bytearray(task.read_bytes())
  middle = len(data) // 2
  data[data.index(b"cat", middle)] = ord("b")  # "bat": one byte in the middle
  task.write_bytes(bytes(data))
  assert RunConfig(task=str(task)).fingerprint()["task_contents"] != first
  assert "task_contents" in RunConfig(task="translate_en_de").fingerprint()


def _examples(*rows):
  return [Example(index=i, inputs=None, input_ids=tuple(r), input_field="input_ids")
          for i, r in enumerate(rows)]


def test_over_long_prompts_are_refused_or_cut_with_a_warning(caplog):
  examples = _examples([5, 6, 7, 8, 9, 1], [5, 6, 1])
  kw = dict(model_vocab_size=64, encoder_decoder=True, max_input_length=4)
  with pytest.raises(ValueError, match=r"1 of 2 prompts .* max_input_length=4 .*example 0, 6 "
                                       r"tokens.*truncate_inputs"):
    tasks.tokenize(examples, None, truncate=False, **kw)
  with caplog.at_level(std_logging.WARNING):
    ids = tasks.tokenize(examples, None, truncate=True, **kw)
  assert ids == [[5, 6, 7, 1], [5, 6, 1]]  # the T5 input keeps its EOS last
  assert "1 of 2 prompts are longer than max_input_length=4 and were cut" in caplog.text
  # A decoder-only prompt has no EOS to keep.
  assert tasks.tokenize(examples, None, truncate=True, **{**kw, "encoder_decoder": False}
                        )[0] == [5, 6, 7, 8]


def test_a_reference_that_is_not_a_string_is_refused(tmp_path):
  path = tmp_path / "t.jsonl"
  path.write_text(json.dumps({"en": "Hello.", "de": ["Hallo."]}) + "\n")
  with pytest.raises(ValueError, match=r"t\.jsonl, line 1: reference field 'de' must be a "
                                       r"string.*list"):
    local_tasks.load_examples(str(path))


def test_a_malformed_model_config_names_its_file(tmp_path):
  _, params = loader.load_model("t5_test_draft")
  ckpt = tmp_path / "draft"
  orbax_io.save(str(ckpt), loader.preset_config("t5_test_draft"), params)
  (ckpt / "model_config.json").write_text('{"emb_dim": 8,')
  with pytest.raises(ValueError, match=r"model config .*draft/model_config\.json is not valid "
                                       r"JSON.*line 1"):
    loader.load_model(str(ckpt))
  (ckpt / "model_config.json").write_text('{"emb_dimension": 8}')
  with pytest.raises(CheckpointError, match=r"draft/model_config\.json is not a valid model "
                                            r"config: unknown ModelConfig fields"):
    loader.load_model(str(ckpt))
  (ckpt / "model_config.json").write_bytes(b"\xff\xfe\x00")
  with pytest.raises(ValueError, match=r"model_config\.json is not UTF-8"):
    loader.load_model(str(ckpt))


def test_missing_t5x_metadata_and_a_broken_hf_index_name_their_files(tmp_path):
  state = tmp_path / "state"
  state.mkdir()
  with pytest.raises(FileNotFoundError, match=r"T5X Orbax metadata .*state/_METADATA does not "
                                              r"exist"):
    t5x_orbax._metadata(str(state))
  (tmp_path / "model.safetensors.index.json").write_text('{"weights": {}}')
  with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json has no "
                                            r"'weight_map'"):
    hf.read_state_dict(str(tmp_path))


def test_a_draft_as_large_as_its_target_is_named_before_anything_runs(caplog):
  target, tparams = loader.load_model("t5_test_draft")
  with caplog.at_level(std_logging.WARNING):
    drafts.load_draft(DraftSpec(kind="model", checkpoint="t5_test_target"), target, tparams,
                      drafts.DraftSettings(),
                      target_name="t5_test_draft")
  assert "at least as many as target t5_test_draft" in caplog.text
  assert "were the two swapped?" in caplog.text


def test_a_task_file_that_is_not_utf8_names_the_file_and_line(tmp_path):
  path = tmp_path / "latin1.jsonl"
  path.write_bytes(json.dumps({"en": "fine"}).encode() + b"\n" +
                   '{"en": "Gr\xfc\xdfe"}'.encode("latin-1") + b"\n")
  with pytest.raises(ValueError, match=r"latin1\.jsonl, line 2: not UTF-8"):
    local_tasks.load_examples(str(path))


def test_the_target_itself_in_int8_panels_is_no_swapped_pair(caplog):
  """The int8 self-draft (the target's own checkpoint, `draft_panels='int8'`) reads a quarter of
  the target's bytes: no size warning. The same draft in float32 is warned about."""
  target, tparams = loader.load_model("t5_test_target")
  for panels, warned in (("int8", False), ("auto", True)):
    caplog.clear()
    with caplog.at_level(std_logging.WARNING):
      drafts.load_draft(DraftSpec(kind="model", checkpoint="t5_test_target"), target, tparams,
                        drafts.DraftSettings(panels=panels), target_name="t5_test_target")
    assert ("were the two swapped?" in caplog.text) == warned
