"""Vocabulary: T5 special ids, seqio sentinel layout, exact round trips (code included)."""
import pickle

import numpy as np
import pytest
import sentencepiece as spm

from specdec_jax.data import local_tasks
from specdec_jax.data import vocabulary


@pytest.fixture(scope="module")
def vocab():
  return vocabulary.default_vocabulary()


def test_sizes_and_special_ids(vocab):
  assert vocab.base_vocab_size == 8000
  assert vocab.vocab_size == 8100
  assert vocab.padded_vocab_size == 8192
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
  assert [vocab.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]


def test_sentinels_follow_seqio(vocab):
  # seqio appends "▁<extra_id_i>" in reverse order: extra_id_0 is the last id.
  assert vocab.extra_id(0) == 8099 and vocab.extra_id(99) == 8000
  assert vocab.id_to_piece(8099) == "▁<extra_id_0>"
  assert vocab.id_to_piece(8000) == "▁<extra_id_99>"
  ids = vocab.encode("a <extra_id_0> b <extra_id_7>")
  assert vocab.extra_id(0) in ids and vocab.extra_id(7) in ids
  assert vocab.decode(ids) == "a <extra_id_0> b <extra_id_7>"
  with pytest.raises(ValueError):
    vocab.extra_id(100)


@pytest.mark.parametrize("text", [
    "translate English to German: Please keep the lawn clean!",
    "Bitte halten Sie den Rasen sauber: Größe, Übersicht, Maß.",
    "def f(x):\n    \"\"\"Doc.\"\"\"\n    if x:\n        return  x  *  2\n\treturn None\n",
    "  leading and trailing spaces  ",
    "emoji 😀 and CJK 漢字 and digits 31415",
])
def test_round_trip_without_unk(vocab, text):
  ids = vocab.encode(text)
  assert vocab.unk_id not in ids  # byte fallback
  assert vocab.eos_id not in ids  # encode never adds EOS
  assert vocab.decode(ids) == text


def test_code_valid_round_trip_and_concatenative_decode(vocab):
  rows = local_tasks.load_jsonl(local_tasks.task_file("code_complete", "valid"))[:20]
  for r in rows:
    prompt, full = vocab.encode(r["prompt"]), vocab.encode(r["prompt"] + r["canonical_solution"])
    assert vocab.decode(full) == r["prompt"] + r["canonical_solution"]
    # A model continuing the prompt's ids produces ids that decode to the continuation text.
    assert full[:len(prompt)] == prompt
    assert vocab.decode(full[len(prompt):]) == r["canonical_solution"]


def test_decode_stops_at_eos_ignores_pad_maps_out_of_range(vocab):
  ids = vocab.encode("Hello world")
  assert vocab.decode(ids + [vocab.eos_id] + vocab.encode(" more")) == "Hello world"
  assert vocab.decode([0, 0] + ids + [0]) == "Hello world"
  assert vocab.decode(np.asarray(ids + [1, 0, 0], np.int32)) == "Hello world"
  # Padded embedding rows (8100..8191) and garbage decode as unk, like seqio.
  assert vocab.decode(ids + [8150]) == vocab.decode(ids + [vocab.unk_id])
  assert vocab.decode(ids + [-5]) == vocab.decode(ids + [vocab.unk_id])
  assert vocab.decode_batch([ids, ids + [1, 7]]) == ["Hello world"] * 2
  with pytest.raises(ValueError, match="1-D"):
    vocab.decode(np.zeros((2, 3), np.int32))


def test_encode_batch_matches_encode(vocab):
  texts = ["one", "zwei drei", "    x = 1\n"]
  assert vocab.encode_batch(texts) == [vocab.encode(t) for t in texts]


def test_pickle_and_equality(vocab):
  other = pickle.loads(pickle.dumps(vocab))
  assert other == vocab and other.encode("abc def") == vocab.encode("abc def")
  assert vocabulary.SentencePieceVocabulary(vocab.model_file, extra_ids=0).vocab_size == 8000


def test_matches_protobuf_construction(vocab):
  """Our hand-written sentinel records equal what seqio builds with the protobuf classes."""
  pb2 = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
  model = pb2.ModelProto.FromString(vocab.model_file.read_bytes())
  for i in reversed(range(100)):
    model.pieces.add(piece=f"▁<extra_id_{i}>", score=0.0,
                     type=pb2.ModelProto.SentencePiece.USER_DEFINED)
  ref = spm.SentencePieceProcessor(model_proto=model.SerializeToString())
  ours = pb2.ModelProto.FromString(vocab._sp.serialized_model_proto())  # pylint: disable=protected-access
  assert list(ours.pieces) == list(model.pieces)
  text = "x <extra_id_3> Grüße\n    y"
  assert ref.EncodeAsIds(text) == vocab.encode(text)


def test_missing_and_invalid_model_files(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.model"):
    vocabulary.SentencePieceVocabulary(tmp_path / "nope.model")
  bad = tmp_path / "bad.model"
  bad.write_bytes(b"not a model")
  with pytest.raises(ValueError, match="not a valid SentencePiece model"):
    vocabulary.SentencePieceVocabulary(bad)


def test_rejects_non_t5_special_ids(tmp_path):
  prefix = tmp_path / "tiny"
  spm.SentencePieceTrainer.train(sentence_iterator=iter(["abc cab bca ab"] * 20),
                                 model_prefix=str(prefix), vocab_size=10, hard_vocab_limit=False,
                                 minloglevel=2)  # sentencepiece's defaults: unk=0, bos=1, eos=2
  with pytest.raises(ValueError, match="T5 special ids"):
    vocabulary.SentencePieceVocabulary(f"{prefix}.model")
