"""Generated training sequences on disk: one directory per source task, written as it goes.

Why this layout: sequence-level distillation (DistillSpec) trains the draft on continuations the
target (or the draft) generated for the training prompts. Generating them is hours on a CPU, so the
job writes batch by batch and must survive a kill without losing or repeating an example:
- `sequences.jsonl`: one line per example, in example order: `index` (row of the source task's
  train split), `generator` (checkpoint that produced it), `input_ids` (the encoder input as fed,
  EOS included, no padding) and `output_ids` (the generated tokens, EOS included when the model
  ended; a continuation cut at the length limit has none).
- `index.json`: how many batches and examples are done and the byte length of `sequences.jsonl`
  that holds exactly them, replaced atomically after the lines are flushed to disk. A resumed job
  truncates the file to that length (dropping a batch whose lines were written but not yet
  indexed) and continues at the next batch, so each example is written exactly once.
  A finished directory records `complete` and the sha256 of its lines: the trainer refuses an
  unfinished one and keys a resumed run on the digest.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

import numpy as np

from specdec_jax.data.vocabulary import EOS_ID

SEQUENCES = "sequences.jsonl"
INDEX = "index.json"


def is_generated(path: str) -> bool:
  """Whether `path` is a generated-sequences directory (a task name may be one)."""
  return os.path.isfile(os.path.join(path, INDEX))


def read_index(path: str) -> dict[str, Any] | None:
  file = os.path.join(path, INDEX)
  if not os.path.exists(file):
    return None
  with open(file, encoding="utf-8") as f:
    return json.load(f)


def write_index(path: str, index: dict[str, Any]) -> None:
  """Atomic: a kill leaves the old index or the new one, never half of one."""
  tmp = os.path.join(path, INDEX + ".tmp")
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(index, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, os.path.join(path, INDEX))


def file_digest(path: str) -> str:
  h = hashlib.sha256()
  with open(os.path.join(path, SEQUENCES), "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()[:16]


def content_digest(path: str) -> str | None:
  """The recorded digest of a finished directory's lines; None if it is not a finished one."""
  index = read_index(path)
  return index.get("sha256") if index and index.get("complete") else None


@dataclasses.dataclass
class Sequences:
  """A finished directory's examples, padded: inputs [N, input_len], targets [N, target_len]."""
  source_task: str
  inputs_NxP: np.ndarray
  targets_NxL: np.ndarray
  rows: list[dict[str, Any]]


def _pad_no_eos(ids: list[int], length: int) -> np.ndarray:
  """Right-pads with 0; a longer continuation is cut WITHOUT adding an EOS (the model did not end
  there, and teaching it to would be teaching what the target does not do)."""
  out = np.zeros(length, np.int32)
  ids = ids[:length]
  out[:len(ids)] = ids
  return out


def load(path: str, input_len: int, target_len: int, join_inputs: bool = False) -> Sequences:
  """Reads a finished directory; raises naming the problem for an unfinished or damaged one.

  `join_inputs` (decoder-only): each target is the prompt followed by its continuation."""
  index = read_index(path)
  if index is None:
    raise ValueError(f"{path} is not a generated-sequences directory (no {INDEX})")
  if not index.get("complete"):
    raise ValueError(
        f"{path} is unfinished: {index.get('examples_done')} of {index.get('examples_total')} "
        "examples generated; re-run its generation command to finish it before training on it")
  if file_digest(path) != index["sha256"]:
    raise ValueError(f"{path}/{SEQUENCES} does not match the sha256 in its {INDEX} (changed "
                     "after generation): regenerate it")
  with open(os.path.join(path, SEQUENCES), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  if len(rows) != index["examples_total"]:
    raise ValueError(f"{path}: {len(rows)} lines, its index says {index['examples_total']}")
  inputs = np.stack([_pad_no_eos(r["input_ids"], input_len) for r in rows])
  if input_len and any(len(r["input_ids"]) > input_len for r in rows):
    # Keep an EOS at the end of a cut input, as `data._pad` does for the tasks themselves.
    long = np.array([len(r["input_ids"]) > input_len for r in rows])
    inputs[long, -1] = EOS_ID
  targets = np.stack([_pad_no_eos((r["input_ids"] if join_inputs else []) + r["output_ids"],
                                  target_len) for r in rows])
  return Sequences(index["source_task"], inputs, targets, rows)
