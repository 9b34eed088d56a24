"""The one door to a task's data: which kind of task a name is, its examples, its vocabulary and
its input ids.

Why one door: a `TASK` is a shipped task name, a packaged task (`humaneval`: read from an
installed package, `PACKAGED_TASKS`; `humaneval@N` repeats each problem N times), a JSONL path
(relative to the working directory or to the repository root) or a registered seqio task, and
the run, the AOT tool, the scripts and the n-gram tables must route it the same way: the same examples, tokenized with the same
vocabulary into the same ids. Only a seqio task imports seqio (and TensorFlow), and only when it
is one; the check for a shipped name or an existing file comes first.

The vocabulary: a seqio task's inputs come tokenized by the task's own vocabulary, which the run
decodes with unless `vocabulary` names another; a local task uses `vocabulary`, else the shipped
one. A run needs one only to tokenize text fields and to decode outputs to text; an all
`input_ids` task with a model whose vocabulary is not the shipped one runs without any.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os

from absl import logging

from specdec_jax.data import chat, hf_tokenizer, humaneval, local_tasks, seqio_tasks, vocabulary as vocab_lib
from specdec_jax.paths import resolve_path

# The shipped task a JSONL's input field stands for (n-gram tables, a restricted head's ranking).
FIELD_TASKS = {"en": "translate_en_de", "document": "summarize", "prompt": "code_complete"}
# Tasks whose data an installed package ships (an extra): name -> module with `load_examples`,
# `check_split` and `data_path` (`humaneval@N`: each problem N times, `humaneval.samples`).
PACKAGED_TASKS = {humaneval.NAME: humaneval}


def packaged(task: str):
  """The module of a packaged task name (`humaneval`, `humaneval@100`), else None."""
  return PACKAGED_TASKS.get(task.partition("@")[0])


@dataclasses.dataclass(frozen=True)
class TaskData:
  """A task's examples and the vocabulary they are tokenized and decoded with.

  Attributes:
    examples: `local_tasks.Example`s, in the task's order.
    vocab: the vocabulary (None if the task needs none and none is shipped).
    text: some example has text to tokenize (not only `input_ids`).
    seqio: the task is a seqio task (its ids come tokenized by its own vocabulary).
  """

  examples: list
  vocab: object | None
  text: bool
  seqio: bool

  @property
  def preset_vocab_size(self) -> int | None:
    """The embedding size a random-init preset takes to decode this task: the vocabulary's padded
    size when there are ids of that vocabulary (text to tokenize, or a seqio task); else None."""
    if (self.text or self.seqio) and self.vocab is not None:
      return self.vocab.padded_vocab_size
    return None

  def input_ids(self, *, model_vocab_size: int, encoder_decoder: bool,
                max_input_length: int, truncate: bool = True) -> list[list[int]]:
    """`tokenize` with this task's vocabulary (only when it has text to tokenize)."""
    return tokenize(self.examples, self.vocab if self.text else None,
                    model_vocab_size=model_vocab_size, encoder_decoder=encoder_decoder,
                    max_input_length=max_input_length, truncate=truncate)

  def decoding_vocab(self, model_vocab_size: int):
    return vocab_for_decoding(self.vocab, model_vocab_size)


def load(task: str, split: str, num_examples: int | None, *, vocabulary: str | None = None,
         max_input_length: int = 512, tfds_data_dir: str | None = None,
         prompt_format: str = "plain") -> TaskData:
  """The examples of `task` and its vocabulary (`vocabulary` overrides a seqio task's own), the
  text put in `prompt_format` ('chat': the tokenizer's chat template, `data.chat`)."""
  chat.check_format(prompt_format)
  examples = load_examples(task, split, num_examples, max_input_length=max_input_length,
                           tfds_data_dir=tfds_data_dir)
  seqio = is_seqio(task)
  if seqio and vocabulary and hf_tokenizer.is_tokenizer(resolve_path(vocabulary)):
    examples = as_text(examples)
  text = needs_text(examples)
  if seqio and not vocabulary:
    vocab = seqio_tasks.vocabulary(task, tfds_data_dir)
  else:
    vocab = load_vocabulary(vocabulary, required=text)
  return TaskData(chat.apply(examples, vocab, prompt_format), vocab, text, seqio)


def as_text(examples):
  """A seqio task's examples with their prompt text only (the task's T5 ids dropped), for a
  Hugging Face tokenizer to tokenize: a Llama target fed T5 ids would read another language.
  Why here and not in seqio: seqio's vocabularies are SentencePiece's; the prompt text
  (`inputs_pretokenized`) is the same for any model."""
  missing = [ex.index for ex in examples if ex.inputs is None]
  if missing:
    raise ValueError(f"seqio examples {missing[:5]} carry no prompt text (inputs_pretokenized) "
                     "to tokenize with a Hugging Face tokenizer")
  return [dataclasses.replace(ex, input_ids=None, input_field="seqio_text") for ex in examples]


def resolve_task(task: str) -> str:
  """A shipped task name stays a name; anything else is a path (resolved against the repo root)."""
  return task if task in local_tasks.LOCAL_TASKS else resolve_path(task)


def content_digest(task: str, split: str) -> str | None:
  """SHA-256 (16 hex digits) of every byte of the file `task` reads for `split`; None for a
  seqio task (its data is versioned by TFDS).

  Why: a run resumed over new prompts written to the same path reported "6/6 examples already
  on disk" and kept the old outputs; the resume fingerprint now covers the data as it covers
  checkpoints. The whole file is read (task files are small next to checkpoints), so an edit
  that keeps the size is caught too.
  """
  if is_seqio(task):
    return None
  if packaged(task) is not None:
    packaged(task).check_split(split)
    path = packaged(task).data_path()
  else:
    path = local_tasks.resolve(resolve_task(task), split)
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()[:16]


def is_seqio(task: str) -> bool:
  """Whether `task` is a seqio task: not a shipped or packaged name, not an existing file (no
  TensorFlow for those), and registered."""
  if (task in local_tasks.LOCAL_TASKS or packaged(task) is not None
      or os.path.exists(resolve_path(task))):
    return False
  return seqio_tasks.is_seqio_task(task)


def load_examples(task: str, split: str, num_examples: int | None, *,
                  max_input_length: int = 512, tfds_data_dir: str | None = None):
  """Examples of a shipped task, a packaged task, a JSONL path, or a seqio task (seqio extra)."""
  if packaged(task) is not None:
    module = packaged(task)
    examples = module.load_examples(split, num_examples, module.samples(task))
  elif is_seqio(task):
    examples = seqio_tasks.load_examples(task, split, num_examples,
                                         max_input_length=max_input_length,
                                         tfds_data_dir=tfds_data_dir)
  else:
    examples = local_tasks.load_examples(resolve_task(task), split, num_examples)
  if not examples:
    raise ValueError(f"task {task!r} ({split}) has no examples")
  return examples


def needs_text(examples) -> bool:
  return any(ex.input_ids is None for ex in examples)


def load_vocabulary(path: str | None, required: bool):
  """The vocabulary at `path` (a SentencePiece .model; a Hugging Face tokenizer.json or the
  checkpoint directory holding it; a fetched checkpoint's name, `checkpoints.fetch`), else the
  shipped one (if present); raises if required and absent."""
  from specdec_jax.checkpoints import fetch  # pylint: disable=import-outside-toplevel
  path = fetch.resolve(path)
  if path and hf_tokenizer.is_tokenizer(resolve_path(path)):
    return hf_tokenizer.HFTokenizerVocabulary(resolve_path(path))
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


def tokenize(examples, vocab, *, model_vocab_size: int, encoder_decoder: bool,
             max_input_length: int, truncate: bool = True) -> list[list[int]]:
  """Input ids per example: tokenized text (T5 inputs end with EOS) or the given `input_ids`,
  fitted to `max_input_length` by `fit_length`."""
  if vocab is not None:
    ids = local_tasks.tokenize_examples(examples, vocab, add_eos=encoder_decoder)
  else:
    ids = [list(ex.input_ids) for ex in examples]
  ids = fit_length(examples, ids, max_input_length, truncate=truncate,
                   eos_id=vocab.eos_id if vocab is not None else vocab_lib.EOS_ID,
                   keep_eos=encoder_decoder)
  for ex, row in zip(examples, ids):
    bad = [t for t in row if t >= model_vocab_size]
    if bad:
      raise ValueError(f"example {ex.index}: input ids {bad[:5]} are outside the model's "
                       f"vocabulary of {model_vocab_size}")
    if not any(row):
      raise ValueError(f"example {ex.index} has no non-pad input token")
  return ids


def fit_length(examples, ids: list[list[int]], max_input_length: int, *, truncate: bool,
               eos_id: int, keep_eos: bool) -> list[list[int]]:
  """Prompts longer than `max_input_length` cut to it (a T5 input that ended with EOS keeps it
  last), with one warning that counts them; or, without `truncate`, a `ValueError` naming the
  first.

  Why: prompts were cut silently and lost their EOS, so a run answered a different question
  than the data asked; a researcher decides whether that is acceptable (RunConfig.truncate_inputs).
  """
  long = [(ex, row) for ex, row in zip(examples, ids) if len(row) > max_input_length]
  if not long:
    return ids
  ex, row = long[0]
  if not truncate:
    raise ValueError(
        f"{len(long)} of {len(ids)} prompts are longer than max_input_length={max_input_length} "
        f"(the first: example {ex.index}, {len(row)} tokens); raise RunConfig.max_input_length "
        "or set RunConfig.truncate_inputs = True to cut them")
  logging.warning("%d of %d prompts are longer than max_input_length=%d and were cut (the "
                  "longest had %d tokens); RunConfig.truncate_inputs = False refuses them instead",
                  len(long), len(ids), max_input_length, max(len(r) for _, r in long))

  def cut(row):
    if len(row) <= max_input_length:
      return row
    if keep_eos and row[-1] == eos_id:
      return row[:max_input_length - 1] + [eos_id]
    return row[:max_input_length]
  return [cut(row) for row in ids]


def vocab_for_decoding(vocab, model_vocab_size: int):
  """Keeps a vocabulary for decoding outputs only if the model's ids are that vocabulary's."""
  if vocab is None:
    return None
  return vocab if model_vocab_size in (vocab.vocab_size, vocab.padded_vocab_size) else None


def standing_for(task: str, run_examples) -> str:
  """The task a run's TASK stands for: a shipped task itself; a JSONL the shipped task of its
  input field (`en` lines: translate_en_de); anything else itself. Why: a JSONL of en-de prompts
  should draft as the en-de task does, with n-gram tables of its train split and the en-de
  ranking of a restricted head, not with the mixture's."""
  if task not in local_tasks.LOCAL_TASKS and run_examples:
    return FIELD_TASKS.get(run_examples[0].input_field, task)
  return task


def ngram_examples(task: str, run_examples, max_examples: int | None, *,
                   tfds_data_dir: str | None = None):
  """(examples, description) to estimate n-gram tables on: the train split of the task the run's
  TASK stands for (`standing_for`: a shipped task, the shipped task of a JSONL's input field, or
  a seqio task), else the run's own prompts (only input ids: fine for smoke runs, leaky for real
  ones)."""
  task = standing_for(task, run_examples)
  if task in local_tasks.LOCAL_TASKS:
    return (local_tasks.load_examples(task, "train", max_examples), f"{task} (train split)")
  if seqio_tasks.is_seqio_task(task):
    return (seqio_tasks.load_examples(task, "train", max_examples, tfds_data_dir=tfds_data_dir),
            f"{task} (train split)")
  return run_examples, "the run's own prompts"
