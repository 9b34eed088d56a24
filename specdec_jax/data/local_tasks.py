"""Local JSONL tasks: the shipped EN->DE, summarisation and code sets, or any JSONL file.

Why: runs on a laptop have no TFDS and no seqio; a `TASK` is a name of a shipped task or a path,
and each line is turned into model inputs by the contract in DESIGN.md ("Public contract", its
"Input JSONL" item):

- the input text comes from the first field present among `en` (prefixed with
  "translate English to German: "), `document` (prefixed with "summarize: "), `inputs` (as is)
  and `prompt` (as is; code completion);
- the reference for quality metrics is `de`, `summary`, `targets` or `canonical_solution`;
- a line with `input_ids` (a list of ints) bypasses tokenization: those ids are the model input,
  exactly as given (no EOS is appended to them).

Everything here is plain Python + numpy, so it is cheap to import and to test.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import lzma
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specdec_jax.paths import ASSETS_DIR

ASSETS_DATA_DIR = ASSETS_DIR / "data"

# Field -> prefix. Order is precedence when a line has several text inputs.
INPUT_PREFIXES: dict[str, str] = {
    "en": "translate English to German: ",
    "document": "summarize: ",
    "inputs": "",
    "prompt": "",
}
REFERENCE_FIELDS = ("de", "summary", "targets", "canonical_solution")
IDS_FIELD = "input_ids"

LOCAL_TASKS: dict[str, str] = {
    "translate_en_de": "English -> German pairs (fields en, de, src)",
    "summarize": "document -> one-line summary (fields document, summary, id, src)",
    "code_complete": "Python function completion (fields prompt, canonical_solution, task_id)",
}
SPLITS = ("train", "valid")


@dataclasses.dataclass(frozen=True)
class Example:
  """One input line.

  Attributes:
    index: 0-based position of the line among the file's examples (blank lines skipped).
    inputs: input text with the field's task prefix, or None for an `input_ids`-only line.
    reference: reference output text, or None.
    input_ids: the line's `input_ids` when given (these bypass tokenization), else None.
    input_field: which field the input came from (`input_ids`, `en`, `document`, ...).
    metadata: the line's other fields (`src`, `id`, `task_id`, ...), kept for predictions.
  """
  index: int
  inputs: str | None
  reference: str | None = None
  input_ids: tuple[int, ...] | None = None
  input_field: str = "inputs"
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def _open_bytes(path: Path):
  if path.suffix == ".xz":
    return lzma.open(path, "rb")
  if path.suffix == ".gz":
    return gzip.open(path, "rb")
  return open(path, "rb")


def _read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
  if not path.is_file():
    raise FileNotFoundError(f"JSONL file not found: {path}")
  records = []
  with _open_bytes(path) as f:
    for lineno, line in _numbered_lines(f, path):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}, line {lineno}: invalid JSON: {e}") from e
      if not isinstance(record, dict):
        raise ValueError(f"{path}, line {lineno}: expected a JSON object, got "
                         f"{type(record).__name__}")
      records.append((lineno, record))
  return records


def _numbered_lines(f, path: Path):
  """(line number, line) of a binary file object, each line decoded as UTF-8 on its own, so
  bytes that are not UTF-8 raise a `ValueError` naming the file and the line, not a bare codec
  error from inside a read block."""
  for lineno, raw in enumerate(f, 1):
    try:
      yield lineno, raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise ValueError(f"{path}, line {lineno}: not UTF-8 text ({e.reason} at byte {e.start}); "
                       "task files are UTF-8 JSONL") from None


def load_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
  """Reads a JSONL file (plain, .xz or .gz): one JSON object per non-blank line."""
  return [record for _, record in _read_jsonl(Path(path))]


def task_names() -> list[str]:
  return list(LOCAL_TASKS)


def task_file(name: str, split: str = "valid") -> Path:
  """Path of a shipped task's split."""
  if name not in LOCAL_TASKS:
    raise ValueError(f"unknown local task {name!r}; known local tasks: {', '.join(LOCAL_TASKS)} "
                     "(or pass the path of a .jsonl / .jsonl.xz file)")
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r} for task {name!r}; shipped splits: "
                     f"{', '.join(SPLITS)} (the test split is deliberately not distributed)")
  return ASSETS_DATA_DIR / name / f"{split}.jsonl.xz"


def _looks_like_path(s: str) -> bool:
  return os.sep in s or "/" in s or s.endswith((".jsonl", ".json", ".xz", ".gz"))


def resolve(task: str | os.PathLike, split: str = "valid") -> Path:
  """A shipped task name (with `split`) or a JSONL path -> the file to read."""
  if isinstance(task, os.PathLike) or (isinstance(task, str) and _looks_like_path(task)):
    path = Path(task)
    if not path.is_file():
      raise FileNotFoundError(f"task file not found: {path}")
    return path
  if isinstance(task, str) and task in LOCAL_TASKS:
    path = task_file(task, split)
    if not path.is_file():
      raise FileNotFoundError(f"shipped data file missing: {path} (is the package installed "
                              "with its assets? scripts/build_data.py rebuilds the data)")
    return path
  if isinstance(task, str) and Path(task).is_file():
    return Path(task)
  raise ValueError(f"unknown task {task!r}; known local tasks: {', '.join(LOCAL_TASKS)}, "
                   "or give the path of an existing .jsonl / .jsonl.xz file")


def _check_ids(value: Any, where: str) -> tuple[int, ...]:
  if not isinstance(value, list) or not all(
      isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
    raise ValueError(f"{where}: `input_ids` must be a list of non-negative ints")
  if not value:
    raise ValueError(f"{where}: `input_ids` is empty")
  if 0 in value[:len(value) - 1] and any(value[value.index(0):]):
    raise ValueError(
        f"{where}: `input_ids` holds the pad id 0 at position {value.index(0)}, before real "
        f"tokens ({value[:value.index(0) + 2]}...): prompts are right-padded with 0, so the tokens "
        "after it would be dropped; remove id 0 from the prompt")
  return tuple(value)


def example_from_record(record: Mapping[str, Any], index: int, where: str = "") -> Example:
  """Builds an `Example` from one parsed line; `where` names the line in error messages."""
  where = where or f"example {index}"
  input_ids = _check_ids(record[IDS_FIELD], where) if IDS_FIELD in record else None
  text_field = next((f for f in INPUT_PREFIXES if f in record), None)
  if input_ids is None and text_field is None:
    raise ValueError(
        f"{where} has none of the input fields {', '.join([IDS_FIELD, *INPUT_PREFIXES])}; "
        f"it has: {', '.join(sorted(record)) or '(no fields)'}")
  inputs = None
  if text_field is not None:
    value = record[text_field]
    if not isinstance(value, str):
      raise ValueError(f"{where}: field {text_field!r} must be a string, got "
                       f"{type(value).__name__}")
    inputs = INPUT_PREFIXES[text_field] + value
  ref_field = next((f for f in REFERENCE_FIELDS if f in record), None)
  reference = None if ref_field is None else record[ref_field]
  if reference is not None and not isinstance(reference, str):  # else the metric silently stops
    raise ValueError(f"{where}: reference field {ref_field!r} must be a string (or null), got "
                     f"{type(reference).__name__}")
  used = {IDS_FIELD, text_field, ref_field}
  return Example(index=index, inputs=inputs, reference=reference, input_ids=input_ids,
                 input_field=IDS_FIELD if input_ids is not None else text_field,
                 metadata={k: v for k, v in record.items() if k not in used})


def load_examples(task: str | os.PathLike, split: str = "valid",
                  num_examples: int | None = None) -> list[Example]:
  """Examples of a shipped task split or of a JSONL file (the first `num_examples` if given)."""
  path = resolve(task, split)
  records = _read_jsonl(path)
  if num_examples is not None:
    records = records[:num_examples]
  return [example_from_record(r, i, where=f"{path}, line {lineno}")
          for i, (lineno, r) in enumerate(records)]


def tokenize_examples(examples: Sequence[Example], vocab, max_input_length: int | None = None,
                      add_eos: bool = True, truncate: bool = False) -> list[list[int]]:
  """Input ids per example.

  Text inputs are encoded with `vocab` and get `vocab.eos_id` appended when `add_eos` (T5 encoder
  inputs end with EOS; a decoder-only prompt does not). `input_ids` are used as given.

  Args:
    examples: from `load_examples`.
    vocab: a `SentencePieceVocabulary` (anything with `encode_batch`/`encode`, `eos_id`,
      `vocab_size`).
    max_input_length: limit on ids per example (EOS included); None for no limit.
    add_eos: append EOS to tokenized text.
    truncate: cut inputs that exceed the limit (keeping the EOS last) instead of raising.
  Raises:
    ValueError: an input is longer than `max_input_length` and `truncate` is False, or an
      `input_ids` entry is outside the vocabulary.
  """
  texts = [(i, ex.inputs) for i, ex in enumerate(examples) if ex.input_ids is None]
  encode_batch = getattr(vocab, "encode_batch", None)
  encoded = (encode_batch([t for _, t in texts]) if encode_batch is not None
             else [vocab.encode(t) for _, t in texts])
  by_position = {i: list(ids) + ([vocab.eos_id] if add_eos else [])
                 for (i, _), ids in zip(texts, encoded)}
  out = []
  for pos, ex in enumerate(examples):
    if ex.input_ids is not None:
      ids = list(ex.input_ids)
      bad = [t for t in ids if t >= vocab.vocab_size]
      if bad:
        raise ValueError(f"example {ex.index}: input_ids {bad[:5]} are outside the vocabulary "
                         f"(vocab_size {vocab.vocab_size})")
    else:
      ids = by_position[pos]
    if max_input_length is not None and len(ids) > max_input_length:
      if not truncate:
        raise ValueError(
            f"example {ex.index} has {len(ids)} input tokens, more than max_input_length="
            f"{max_input_length}; raise the limit or request truncation (truncate=True)")
      ends_with_eos = ids[-1] == vocab.eos_id
      ids = ids[:max_input_length - 1] + [vocab.eos_id] if ends_with_eos else ids[:max_input_length]
    out.append(ids)
  return out


def batch_inputs(id_lists: Iterable[Sequence[int]], pad_to: int | None = None,
                 pad_id: int = 0) -> np.ndarray:
  """Right-pads id lists with `pad_id` into an int32 array [B, P] (P = `pad_to` or the longest)."""
  id_lists = [list(ids) for ids in id_lists]
  longest = max((len(ids) for ids in id_lists), default=0)
  width = longest if pad_to is None else int(pad_to)
  if longest > width:
    raise ValueError(f"an input has {longest} ids, more than pad_to={width}")
  out = np.full((len(id_lists), width), pad_id, dtype=np.int32)
  for row, ids in enumerate(id_lists):
    out[row, :len(ids)] = ids
  return out


# What makes two rows "the same source", which must never straddle train and valid: the
# lower-cased English sentence, the document text (Debian ships one description under several
# binary packages: -dev, -doc, -prof), the source file of a function.
_SOURCE_KEY = {
    "translate_en_de": lambda r: r["en"].lower(),
    "summarize": lambda r: r["document"],
    "code_complete": lambda r: r["task_id"].split(":")[0],
}


def _source_key_fn(task: str):
  if task not in _SOURCE_KEY:
    raise ValueError(f"no source key for task {task!r}; known: {sorted(_SOURCE_KEY)}")
  return _SOURCE_KEY[task]


def source_key(task: str, row: Mapping[str, Any]) -> str:
  """The key rows of `task` are split by (scripts/build_data.py) and compared across splits."""
  return _source_key_fn(task)(row)


def valid_sources_in_train(task: str) -> list[int]:
  """Indices of the shipped valid rows of `task` whose source also occurs in its train split.

  Why: the shipped files are the local benchmark's own split (SOURCES.md), which is by key, not
  by content; Debian ships one description under several binary packages (`-dev`, `-doc`,
  `-prof`), so a few valid documents have a word-for-word twin in train. Quality figures of a
  model trained on train report both all rows and the rows without such a twin.
  """
  key = _source_key_fn(task)
  seen = {key(r) for r in load_jsonl(task_file(task, "train"))}
  return [i for i, r in enumerate(load_jsonl(task_file(task, "valid"))) if key(r) in seen]
