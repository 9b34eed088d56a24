"""SentencePiece vocabulary with T5 special ids and seqio-style sentinel ids.

Why this module exists: every model in the local zoo shares one tokenizer, and checkpoints
converted from T5X use seqio's conventions. This class reproduces those conventions with only the
`sentencepiece` package (no TensorFlow, no seqio), so that ids agree with
`seqio.SentencePieceVocabulary(model_file, extra_ids=100)`:

- pad = 0, eos = 1, unk = 2, no BOS (the model file is trained that way; we check it on load);
- `extra_ids` sentinel pieces `<extra_id_0>`..`<extra_id_{n-1}>` are appended after the model's
  own pieces in REVERSE order, so `<extra_id_0>` is the last id (seqio adds them the same way:
  user-defined pieces named "▁<extra_id_i>" with score 0);
- `decode` stops at the first EOS, drops pad and maps ids outside the vocabulary to unk;
- `padded_vocab_size` rounds `vocab_size` up to a multiple of 128, the size of a model's
  embedding table (T5's 32100 -> 32128).

The sentinels are appended to the serialized model by writing the protobuf records by hand
(`_piece_record`): a repeated field may be extended by concatenating records, which avoids a
dependency on the protobuf package and on its generated-code version.
"""
from __future__ import annotations

import functools
import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from specdec_jax.paths import ASSETS_DIR

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
DEFAULT_EXTRA_IDS = 100
PAD_VOCAB_MULTIPLE = 128
DEFAULT_VOCAB_PATH = ASSETS_DIR / "vocab" / "local_sp8k.model"

# sentencepiece_model.proto: ModelProto.pieces = 1; SentencePiece {piece = 1; score = 2; type = 3}.
_USER_DEFINED = 4


def _varint(value: int) -> bytes:
  out = bytearray()
  while True:
    byte = value & 0x7F
    value >>= 7
    if value:
      out.append(byte | 0x80)
    else:
      out.append(byte)
      return bytes(out)


def _piece_record(piece: str, score: float = 0.0, piece_type: int = _USER_DEFINED) -> bytes:
  """One serialized `ModelProto.pieces` entry (field 1, length-delimited)."""
  text = piece.encode("utf-8")
  inner = (b"\x0a" + _varint(len(text)) + text + b"\x15" + struct.pack("<f", score)
           + b"\x18" + _varint(piece_type))
  return b"\x0a" + _varint(len(inner)) + inner


def round_up(n: int, multiple: int = PAD_VOCAB_MULTIPLE) -> int:
  return -(-n // multiple) * multiple


class SentencePieceVocabulary:
  """A SentencePiece model plus `extra_ids` sentinels, with T5's pad/eos/unk ids.

  `encode` never adds EOS (as in seqio); callers that feed a T5 encoder append `eos_id`.
  """

  def __init__(self, model_file: str | os.PathLike, extra_ids: int = DEFAULT_EXTRA_IDS):
    path = Path(model_file)
    if not path.is_file():
      raise FileNotFoundError(
          f"SentencePiece model file not found: {path}. The shipped vocabulary lives at "
          f"{DEFAULT_VOCAB_PATH} (rebuild it with scripts/train_vocab.py); pass the path of a "
          f"'.model' file written by sentencepiece to use another one.")
    if extra_ids < 0:
      raise ValueError(f"extra_ids must be >= 0, got {extra_ids}")
    self._model_file = path
    self._extra_ids = int(extra_ids)
    proto = path.read_bytes()
    base = spm.SentencePieceProcessor()
    try:
      base.LoadFromSerializedProto(proto)
    except Exception as e:  # sentencepiece raises RuntimeError/OSError depending on version.
      raise ValueError(f"{path} is not a valid SentencePiece model: {e}") from e
    self._base_size = base.GetPieceSize()
    ids = {"pad": base.pad_id(), "eos": base.eos_id(), "unk": base.unk_id()}
    if ids != {"pad": PAD_ID, "eos": EOS_ID, "unk": UNK_ID} or base.bos_id() != -1:
      raise ValueError(
          f"{path} does not use T5 special ids (pad=0, eos=1, unk=2, no bos): got {ids}, "
          f"bos={base.bos_id()}. Train it with --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1.")
    for i in range(self._base_size):
      if base.IdToPiece(i).startswith("▁<extra_id_"):
        raise ValueError(f"{path} already contains sentinel pieces; load it with extra_ids=0.")
    proto += b"".join(_piece_record(f"▁<extra_id_{i}>") for i in reversed(range(self._extra_ids)))
    self._sp = spm.SentencePieceProcessor()
    self._sp.LoadFromSerializedProto(proto)
    assert self._sp.GetPieceSize() == self.vocab_size

  def __reduce__(self):
    return (type(self), (str(self._model_file), self._extra_ids))

  def __repr__(self):
    return (f"SentencePieceVocabulary({str(self._model_file)!r}, extra_ids={self._extra_ids}) "
            f"[vocab_size={self.vocab_size}]")

  def __eq__(self, other):
    return (isinstance(other, SentencePieceVocabulary) and other._extra_ids == self._extra_ids
            and other._sp.serialized_model_proto() == self._sp.serialized_model_proto())

  def __hash__(self):
    return hash((self._base_size, self._extra_ids, self._model_file.name))

  @property
  def model_file(self) -> Path:
    return self._model_file

  @property
  def extra_ids(self) -> int:
    return self._extra_ids

  @property
  def base_vocab_size(self) -> int:
    """Pieces in the model file (pad/eos/unk and byte pieces included), without sentinels."""
    return self._base_size

  @property
  def vocab_size(self) -> int:
    """Number of valid ids: model pieces + sentinels (8000 + 100 = 8100 for the shipped one)."""
    return self._base_size + self._extra_ids

  @property
  def padded_vocab_size(self) -> int:
    """`vocab_size` rounded up to a multiple of 128: the embedding/logits size of a model."""
    return round_up(self.vocab_size)

  pad_id = property(lambda self: PAD_ID)
  eos_id = property(lambda self: EOS_ID)
  unk_id = property(lambda self: UNK_ID)

  def extra_id(self, i: int) -> int:
    """Id of `<extra_id_{i}>`; `extra_id(0)` is the last id, `vocab_size - 1`."""
    if not 0 <= i < self._extra_ids:
      raise ValueError(f"extra id {i} out of range [0, {self._extra_ids})")
    return self.vocab_size - 1 - i

  def id_to_piece(self, i: int) -> str:
    return self._sp.IdToPiece(int(i))

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without EOS. `" <extra_id_3>"` encodes to the sentinel id."""
    if not isinstance(text, str):
      raise TypeError(f"encode expects a str, got {type(text).__name__}")
    return self._sp.EncodeAsIds(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` over many strings in one call (sentencepiece runs it multithreaded)."""
    return self._sp.Encode(list(texts), out_type=int)

  def _clean(self, ids: Iterable[int]) -> list[int]:
    arr = np.asarray(ids)
    if arr.ndim != 1:
      raise ValueError(f"decode expects a 1-D sequence of ids, got shape {arr.shape}")
    out = []
    for i in arr.tolist():
      i = int(i)
      if i == EOS_ID:
        break
      if i == PAD_ID:
        continue
      out.append(i if 0 <= i < self.vocab_size else UNK_ID)
    return out

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids` up to the first EOS; pad is dropped, out-of-range ids become unk."""
    return self._sp.DecodeIds(self._clean(ids))

  def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
    return [self.decode(ids) for ids in batch]


@functools.lru_cache(maxsize=None)
def default_vocabulary() -> SentencePieceVocabulary:
  """The vocabulary shipped with the package (English, German, Python; 8100 ids, padded 8192)."""
  return SentencePieceVocabulary(DEFAULT_VOCAB_PATH, extra_ids=DEFAULT_EXTRA_IDS)
