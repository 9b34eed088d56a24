"""Local JSONL tasks: the Input JSONL contract of DESIGN.md (prefixes, input_ids bypass, errors)."""
import json
import lzma
from pathlib import Path

import numpy as np
import pytest

from specdec_jax.data import local_tasks as lt
from specdec_jax.data import vocabulary


@pytest.fixture(scope="module")
def vocab():
  return vocabulary.default_vocabulary()


def _write_jsonl(path: Path, rows, compress=False):
  text = "".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in rows)
  if compress:
    with lzma.open(path, "wt", encoding="utf-8") as f:
      f.write(text)
  else:
    path.write_text(text, encoding="utf-8")
  return path


@pytest.mark.parametrize("compress", [False, True])
def test_load_jsonl_plain_and_xz(tmp_path, compress):
  path = _write_jsonl(tmp_path / ("x.jsonl.xz" if compress else "x.jsonl"),
                      [{"en": "a"}, "\n", {"inputs": "b", "targets": "c"}], compress)
  assert lt.load_jsonl(path) == [{"en": "a"}, {"inputs": "b", "targets": "c"}]


def test_load_jsonl_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="missing.jsonl"):
    lt.load_jsonl(tmp_path / "missing.jsonl")
  bad = _write_jsonl(tmp_path / "bad.jsonl", [{"en": "a"}, "{not json\n"])
  with pytest.raises(ValueError, match="line 2: invalid JSON"):
    lt.load_jsonl(bad)
  arr = _write_jsonl(tmp_path / "arr.jsonl", ["[1, 2]\n"])
  with pytest.raises(ValueError, match="line 1: expected a JSON object"):
    lt.load_jsonl(arr)


@pytest.mark.parametrize("task,count,prefix,ref_start", [
    ("translate_en_de", 975, "translate English to German: Please keep the lawn", "Bitte halten"),
    ("summarize", 354, "summarize: Some developers like", "minimal AMD API"),
    ("code_complete", 71, "def get_dict(self):\n", "    thread = current_thread()"),
])
def test_shipped_tasks_and_prefixes(task, count, prefix, ref_start):
  examples = lt.load_examples(task)  # valid split by default
  assert len(examples) == count
  assert [e.index for e in examples[:3]] == [0, 1, 2]
  assert examples[0].inputs.startswith(prefix)
  assert examples[0].reference.startswith(ref_start)
  assert examples[0].input_ids is None


def test_shipped_files_resolve():
  for task in lt.task_names():
    for split in lt.SPLITS:
      assert lt.resolve(task, split).is_file()
  assert lt.load_examples("summarize", num_examples=3)[0].metadata == {
      "id": "node-almond", "src": "debian-descriptions"}


def test_each_field_implies_its_prefix(tmp_path):
  path = _write_jsonl(tmp_path / "mixed.jsonl", [
      {"en": "Hello.", "de": "Hallo."},
      {"document": "A long text.", "summary": "text"},
      {"inputs": "question: why?", "targets": "because"},
      {"prompt": "def f():\n", "canonical_solution": "    return 1\n"},
  ])
  examples = lt.load_examples(str(path))
  assert [e.inputs for e in examples] == [
      "translate English to German: Hello.", "summarize: A long text.", "question: why?",
      "def f():\n"]
  assert [e.reference for e in examples] == ["Hallo.", "text", "because", "    return 1\n"]
  assert [e.input_field for e in examples] == ["en", "document", "inputs", "prompt"]
  assert lt.load_examples(path)[0].inputs == examples[0].inputs  # a Path works too


def test_input_ids_bypass_tokenization(tmp_path, vocab):
  path = _write_jsonl(tmp_path / "ids.jsonl", [
      {"input_ids": [5, 17, 300], "de": "ref"},
      {"en": "Hello."},
      {"input_ids": [7], "en": "ignored for the model input"},
  ])
  examples = lt.load_examples(path)
  assert examples[0].input_ids == (5, 17, 300) and examples[0].inputs is None
  assert examples[0].reference == "ref" and examples[0].input_field == "input_ids"
  ids = lt.tokenize_examples(examples, vocab, add_eos=True)
  assert ids[0] == [5, 17, 300]  # verbatim: no EOS appended
  assert ids[1] == vocab.encode("translate English to German: Hello.") + [vocab.eos_id]
  assert ids[2] == [7]
  assert lt.tokenize_examples(examples[1:2], vocab, add_eos=False)[0][-1] != vocab.eos_id


def test_bad_input_ids(tmp_path, vocab):
  path = _write_jsonl(tmp_path / "bad_ids.jsonl", [{"input_ids": [1, "2"]}])
  with pytest.raises(ValueError, match="line 1: `input_ids` must be a list of non-negative ints"):
    lt.load_examples(path)
  path = _write_jsonl(tmp_path / "big_ids.jsonl", [{"input_ids": [1, 9000]}])
  with pytest.raises(ValueError, match="outside the vocabulary"):
    lt.tokenize_examples(lt.load_examples(path), vocab)


def test_line_without_known_fields(tmp_path):
  path = _write_jsonl(tmp_path / "odd.jsonl", [{"en": "ok"}, "\n", {"source": "x", "target": "y"}])
  with pytest.raises(ValueError) as err:
    lt.load_examples(path)
  msg = str(err.value)
  assert "line 3" in msg and "source, target" in msg and "en, document, inputs, prompt" in msg


def test_unknown_task_and_split_and_missing_file(tmp_path):
  with pytest.raises(ValueError, match="known local tasks: translate_en_de, summarize, "
                                       "code_complete"):
    lt.load_examples("wmt_en_de")
  with pytest.raises(ValueError, match="unknown split 'test'"):
    lt.load_examples("summarize", split="test")
  with pytest.raises(FileNotFoundError, match="nothing.jsonl"):
    lt.load_examples(str(tmp_path / "nothing.jsonl"))


def test_length_limit_and_truncation(tmp_path, vocab):
  path = _write_jsonl(tmp_path / "long.jsonl", [{"inputs": "word " * 50}, {"inputs": "short"}])
  examples = lt.load_examples(path)
  with pytest.raises(ValueError, match="example 0 has .* input tokens, more than "
                                       "max_input_length=16"):
    lt.tokenize_examples(examples, vocab, max_input_length=16)
  ids = lt.tokenize_examples(examples, vocab, max_input_length=16, truncate=True)
  assert len(ids[0]) == 16 and ids[0][-1] == vocab.eos_id
  assert ids[0][:15] == vocab.encode("word " * 50)[:15]
  assert ids[1] == vocab.encode("short") + [vocab.eos_id]
  no_eos = lt.tokenize_examples(examples, vocab, max_input_length=16, add_eos=False, truncate=True)
  assert no_eos[0] == vocab.encode("word " * 50)[:16]


def test_batch_inputs():
  batch = lt.batch_inputs([[5, 6, 1], [7, 1]])
  assert batch.dtype == np.int32 and batch.shape == (2, 3)
  np.testing.assert_array_equal(batch, [[5, 6, 1], [7, 1, 0]])
  assert lt.batch_inputs([[5, 1]], pad_to=8).shape == (1, 8)
  with pytest.raises(ValueError, match="more than pad_to=2"):
    lt.batch_inputs([[1, 2, 3]], pad_to=2)
  assert lt.batch_inputs([], pad_to=4).shape == (0, 4)


def test_tokenized_valid_sets_fit_and_have_no_unk(vocab):
  for task in lt.task_names():
    ids = lt.tokenize_examples(lt.load_examples(task), vocab)
    assert all(vocab.unk_id not in x and x[-1] == vocab.eos_id for x in ids)
    batch = lt.batch_inputs(ids)
    assert batch.shape[0] == len(ids) and batch.max() < vocab.vocab_size


@pytest.mark.parametrize("task,twins", [("translate_en_de", 4), ("summarize", 39),
                                        ("code_complete", 0)])
def test_valid_sources_in_train(task, twins):
  """SOURCES.md's overlap figures: no valid code file is trained on; a few en-de sentences and
  Debian descriptions shared by sibling packages have a twin in train (the model card reports
  quality without them too)."""
  idx = lt.valid_sources_in_train(task)
  assert len(idx) == twins
  if task == "summarize":
    valid = lt.load_jsonl(lt.task_file(task, "valid"))
    train_docs = {r["document"] for r in lt.load_jsonl(lt.task_file(task, "train"))}
    assert all(valid[i]["document"] in train_docs for i in idx)
    assert sum(r["document"] in train_docs for r in valid) == twins
  with pytest.raises(ValueError, match="no source key"):
    lt.valid_sources_in_train("nope")
