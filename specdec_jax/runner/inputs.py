"""A run's prompts: examples of a TASK, the vocabulary (if any), and fixed-shape batches.

Why fixed shapes: every batch is padded to one prompt width P (the longest prompt, at most
MAX_INPUT_LENGTH), so each decoding program compiles once per batch size; only a final partial
batch compiles again (its real size keeps the acceptance histograms exact).
A run needs a vocabulary only to tokenize text fields and to decode outputs to text; an all
`input_ids` task with a model whose vocabulary is not the shipped one runs without any.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from specdec_jax.data import local_tasks
from specdec_jax.gin_utils import PACKAGE_PARENT


def resolve_path(path: str) -> str:
  """A path as given if it exists (or is absolute), else relative to the repository root."""
  path = os.path.expanduser(str(path))
  if os.path.isabs(path) or os.path.exists(path):
    return path
  candidate = os.path.join(PACKAGE_PARENT, path)
  return candidate if os.path.exists(candidate) else path


def resolve_task(task: str) -> str:
  """A shipped task name stays a name; anything else is a path (resolved against the repo root)."""
  return task if task in local_tasks.LOCAL_TASKS else resolve_path(task)


@dataclasses.dataclass
class Prompts:
  """Examples, their input ids and the run's vocabulary (None if it has none)."""

  examples: list
  ids: list[list[int]]
  vocab: object | None
  width: int

  @property
  def input_field(self) -> str | None:
    return self.examples[0].input_field if self.examples else None

  def batch(self, positions: Sequence[int]) -> np.ndarray:
    """int32 [len(positions), width], right-padded with 0."""
    return local_tasks.batch_inputs([self.ids[p] for p in positions], pad_to=self.width)

  def decode(self, ids: Sequence[int]) -> str | None:
    return None if self.vocab is None else self.vocab.decode(ids)


def needs_text(examples) -> bool:
  return any(ex.input_ids is None for ex in examples)


def load_vocabulary(path: str | None, required: bool):
  """The vocabulary at `path`, else the shipped one (if present); raises if required and absent."""
  from specdec_jax.data import vocabulary as vocab_lib
  if path:
    return vocab_lib.SentencePieceVocabulary(resolve_path(path))
  if os.path.exists(vocab_lib.DEFAULT_VOCAB_PATH):
    return vocab_lib.default_vocabulary()
  if required:
    raise FileNotFoundError(
        f"this task has text inputs, which need a SentencePiece vocabulary, but the shipped one "
        f"({vocab_lib.DEFAULT_VOCAB_PATH}) is missing; bind RunConfig.vocabulary to a .model file "
        "or use a JSONL with `input_ids`")
  return None


def is_seqio(task: str) -> bool:
  if task in local_tasks.LOCAL_TASKS or os.path.exists(resolve_path(task)):
    return False
  from specdec_jax.data import seqio_tasks
  return seqio_tasks.is_seqio_task(task)


def load_examples(task: str, split: str, num_examples: int | None, *,
                  max_input_length: int = 512, tfds_data_dir: str | None = None):
  """Examples of a shipped task, a JSONL path, or a seqio task (seqio extra)."""
  if is_seqio(task):
    from specdec_jax.data import seqio_tasks
    examples = seqio_tasks.load_examples(task, split, num_examples,
                                         max_input_length=max_input_length,
                                         tfds_data_dir=tfds_data_dir)
  else:
    examples = local_tasks.load_examples(resolve_task(task), split, num_examples)
  if not examples:
    raise ValueError(f"task {task!r} ({split}) has no examples")
  return examples


FIELD_TASKS = {"en": "translate_en_de", "document": "summarize", "prompt": "code_complete"}


def ngram_examples(cfg, run_examples):
  """(examples, description) to estimate n-gram tables on: the train split of the run's task (a
  shipped task, the shipped task of a JSONL's input field, or a seqio task), else the run's own
  prompts (only input ids: fine for smoke runs, leaky for real ones)."""
  task = cfg.task
  if task not in local_tasks.LOCAL_TASKS and run_examples:
    task = FIELD_TASKS.get(run_examples[0].input_field, task)
  if task in local_tasks.LOCAL_TASKS:
    return (local_tasks.load_examples(task, "train", cfg.ngram_train_examples),
            f"{task} (train split)")
  from specdec_jax.data import seqio_tasks
  if seqio_tasks.is_seqio_task(task):
    return (seqio_tasks.load_examples(task, "train", cfg.ngram_train_examples,
                                      tfds_data_dir=cfg.tfds_data_dir), f"{task} (train split)")
  return run_examples, "the run's own prompts"


def tokenize(examples, vocab, *, model_vocab_size: int, encoder_decoder: bool,
             max_input_length: int) -> list[list[int]]:
  """Input ids per example: tokenized text (T5 inputs end with EOS) or the given `input_ids`."""
  if vocab is not None:
    ids = local_tasks.tokenize_examples(examples, vocab, max_input_length=max_input_length,
                                        add_eos=encoder_decoder, truncate=True)
  else:
    ids = [list(ex.input_ids)[:max_input_length] for ex in examples]
  for ex, row in zip(examples, ids):
    bad = [t for t in row if t >= model_vocab_size]
    if bad:
      raise ValueError(f"example {ex.index}: input ids {bad[:5]} are outside the model's "
                       f"vocabulary of {model_vocab_size}")
    if not any(row):
      raise ValueError(f"example {ex.index} has no non-pad input token")
  return ids


def vocab_for_decoding(vocab, model_vocab_size: int):
  """Keeps a vocabulary for decoding outputs only if the model's ids are that vocabulary's."""
  if vocab is None:
    return None
  return vocab if model_vocab_size in (vocab.vocab_size, vocab.padded_vocab_size) else None
