"""Training batches whose order is a pure function of (seed, step).

Why: resuming after a kill must continue with exactly the batches the killed run would have seen
next, without storing an iterator. Batch `step` is built from scratch: the step picks a task from
a fixed round-robin schedule (the mixture), the task's own counter picks an epoch and a slot in
that epoch's permutation (seeded by (seed, task, epoch)). Nothing depends on the history.

Shapes are static per task (inputs padded/truncated to `input_len`, targets to `target_len`), so
the jitted train step compiles once per task. Optionally (`length_window` W > 1) an epoch's rows
are served in windows of W batches sorted by length, the window's batches in a seeded order, and
each batch is cut to its longest row (`cut_batch`): the same rows each epoch, far less padding
(fairseq's / t5x's length bucketing; SmolLM2's code replies, 640 wide: W = 16 computes 64 % of
the tokens), one compile per width (multiples of `CUT_MULTIPLE`).

A task is a local task / JSONL path (`local_tasks`, tokenized with the run's vocabulary) or a
registered seqio task (`seqio_tasks`: the papers' `wmt_t2t_ende_v003`, `cnn_dailymail`, the local
`specdec_*` ones): its inputs come tokenized by the task and its references are encoded with the
task's own vocabulary, so a model fine-tuned here sees exactly the ids a run decodes from.
A task may also be a directory of generated sequences (`training.seqdata`, written by
`python -m specdec_jax.distill_data`): its train split is the prompts and the continuations the
target (or draft) generated, used as ids; its valid split is the source task's, with references,
so validation still measures the data.
`TaskSpec.max_examples` caps what is read (the first N of the split: TFDS stores a split in
hashed-key order, a pseudo-random sample), so a 4.5M-pair WMT split is tokenized whole only if
asked.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from specdec_jax.data import chat, local_tasks, seqio_tasks, tasks
from specdec_jax.data.vocabulary import EOS_ID, PAD_ID
from specdec_jax.training import seqdata


LOSS_ON = ("all", "continuation")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """One task of the mixture.

  Attributes:
    name: a local task name or JSONL path (see `local_tasks.resolve`).
    weight: batches of this task per round of the schedule (integer mixing rate).
    input_len: encoder tokens per example (T5), EOS included; 0 for decoder-only.
    target_len: decoder tokens per example, EOS included (decoder-only: the whole sequence).
    max_examples: read at most this many training examples (the first ones of the split); None
      reads the whole split. Validation reads `TrainConfig.eval_examples` instead.
    prompt_format: 'plain', or 'chat' (each input as one user turn of the vocabulary's chat
      template, `data.chat`), as `RunConfig.prompt_format` puts a run's prompts.
    loss_on: 'all' (every token of a decoder-only sequence, the prompt's included) or
      'continuation' (only what follows the prompt: the reply, as SpecForge / EAGLE-3 mask a
      chat's assistant turn; the prompt still feeds the model). A T5 task's loss is on its
      targets, the continuation, either way.
  """
  name: str
  weight: int = 1
  input_len: int = 64
  target_len: int = 64
  max_examples: int | None = None
  prompt_format: str = "plain"
  loss_on: str = "all"

  def __post_init__(self):
    if self.loss_on not in LOSS_ON:
      raise ValueError(f"TaskSpec({self.name!r}).loss_on must be one of {LOSS_ON}, got "
                       f"{self.loss_on!r}")
    if self.max_examples is not None and self.max_examples < 1:
      raise ValueError(f"TaskSpec({self.name!r}).max_examples must be >= 1 or None, got "
                       f"{self.max_examples}")


@dataclasses.dataclass
class TokenizedTask:
  """Token arrays of one task, padded with 0: inputs [N, input_len] (T5) and targets [N, L];
  a decoder-only task's `prompt_lengths_N`: how many tokens of each sequence are its prompt."""
  spec: TaskSpec
  inputs_NxP: np.ndarray | None
  targets_NxL: np.ndarray
  prompt_lengths_N: np.ndarray | None = None

  @property
  def size(self) -> int:
    return self.targets_NxL.shape[0]


def _pad(ids: Sequence[int], length: int) -> np.ndarray:
  """Truncates keeping a final EOS, then right-pads with PAD to `length`."""
  ids = list(ids)
  if len(ids) > length:
    ids = ids[:length - 1] + [EOS_ID]
  out = np.full(length, PAD_ID, np.int32)
  out[:len(ids)] = ids
  return out


def is_seqio_task(name: str) -> bool:
  """A registered seqio task (`data.tasks.is_seqio`): a shipped task, a file or a directory of
  generated sequences is none (checked first: no TensorFlow for them)."""
  return tasks.is_seqio(name)


def task_vocabulary(spec: TaskSpec, default):
  """The vocabulary a task's references are encoded with: a seqio task's own, else `default`."""
  return seqio_tasks.vocabulary(spec.name) if is_seqio_task(spec.name) else default


def _read(spec: TaskSpec, vocab, split: str, limit: int | None):
  """(input ids ending with EOS, reference ids without EOS) of the examples with a reference."""
  if is_seqio_task(spec.name):
    examples = seqio_tasks.load_examples(spec.name, split, limit,
                                         max_input_length=max(spec.input_len, spec.target_len))
    vocab = seqio_tasks.vocabulary(spec.name)
    if vocab.eos_id != EOS_ID or vocab.pad_id != PAD_ID:
      raise ValueError(f"seqio task {spec.name!r}: vocabulary eos/pad ids {vocab.eos_id}/"
                       f"{vocab.pad_id}, the trainer assumes {EOS_ID}/{PAD_ID}")
    examples = [ex for ex in examples if ex.reference]
    src = [list(ex.input_ids) for ex in examples]  # tokenized by the task, EOS appended
  else:
    examples = local_tasks.load_examples(spec.name, split, limit)
    examples = chat.apply([ex for ex in examples if ex.reference], vocab, spec.prompt_format)
    src = [s + [vocab.eos_id] for s in vocab.encode_batch([ex.inputs for ex in examples])]
  if not examples:
    raise ValueError(f"task {spec.name!r} ({split}) has no examples with a reference to train on")
  return src, vocab.encode_batch([ex.reference for ex in examples])


def tokenize_task(spec: TaskSpec, vocab, encoder_decoder: bool, split: str = "train",
                  limit: int | None = None) -> TokenizedTask:
  """Reads and tokenizes a task split into fixed-width arrays.

  Encoder-decoder: input (with its task prefix) + EOS -> inputs, reference + EOS -> targets.
  Decoder-only (code): input followed by reference + EOS, as one sequence in `targets`.
  `vocab` tokenizes local tasks; a seqio task brings its own (`task_vocabulary`). The train split
  reads at most `spec.max_examples` examples.
  """
  if limit is None and split == "train":
    limit = spec.max_examples
  if seqdata.is_generated(spec.name):
    index = seqdata.read_index(spec.name)
    kind = index.get("kind", "t5")
    if (kind == "t5") != encoder_decoder:
      raise ValueError(f"task {spec.name!r} holds sequences generated by a {kind} model; the "
                       f"model trained is {'encoder-decoder' if encoder_decoder else 'decoder-only'}")
    if split != "train":  # validate on the source task's references
      task = tokenize_task(dataclasses.replace(spec, name=index["source_task"]), vocab, encoder_decoder, split,
                           limit)
      return TokenizedTask(spec, task.inputs_NxP, task.targets_NxL, task.prompt_lengths_N)
    if not encoder_decoder:  # one sequence: the prompt, then the generated continuation
      seqs = seqdata.load(spec.name, 0, spec.target_len, join_inputs=True)
      prompts_N = np.array([len(r["input_ids"]) for r in seqs.rows], np.int32)
      return TokenizedTask(spec, None, seqs.targets_NxL[:limit], prompts_N[:limit])
    seqs = seqdata.load(spec.name, spec.input_len, spec.target_len)
    return TokenizedTask(spec, seqs.inputs_NxP[:limit], seqs.targets_NxL[:limit])
  src, tgt = _read(spec, vocab, split, limit)
  if encoder_decoder:
    inputs = np.stack([_pad(s, spec.input_len) for s in src])
    targets = np.stack([_pad(t + [EOS_ID], spec.target_len) for t in tgt])
    return TokenizedTask(spec, inputs, targets)
  return TokenizedTask(spec, None, _decoder_sequences(src, tgt, spec.target_len, vocab.eos_id),
                       np.array([len(s) - 1 for s in src], np.int32))  # the input, EOS dropped


def _decoder_sequences(src, tgt, length: int, eos_id: int = EOS_ID) -> np.ndarray:
  """Decoder-only sequences: the input (its EOS dropped), the reference, EOS; [N, length]."""
  return np.stack([_pad(s[:-1] + t + [eos_id], length) for s, t in zip(src, tgt)])


def decoder_prompts(spec: TaskSpec, vocab, split: str = "train", limit: int | None = None
                    ) -> TokenizedTask:
  """A decoder-only task's prompts for generation: each input without EOS, right-padded with 0
  to one width (`spec.input_len`, or the longest prompt when it is 0), as `inputs_NxP`; a longer
  prompt keeps its last tokens (the continuation follows them). `targets_NxL` holds the reference
  sequences as `tokenize_task` makes them."""
  if limit is None and split == "train":
    limit = spec.max_examples
  src, tgt = _read(spec, vocab, split, limit)
  prompts = [s[:-1] for s in src]
  width = spec.input_len or max(len(p) for p in prompts)
  if width >= spec.target_len:
    raise ValueError(f"task {spec.name!r}: prompts of {width} tokens leave no room for a "
                     f"continuation within target_len {spec.target_len}; set TaskSpec.input_len "
                     "below target_len")
  inputs = np.stack([_pad(p[-width:], width) for p in prompts])
  return TokenizedTask(spec, inputs, _decoder_sequences(src, tgt, spec.target_len),
                       np.array([len(s) - 1 for s in src], np.int32))


def schedule(specs: Sequence[TaskSpec]) -> list[int]:
  """Round-robin task indices, e.g. weights (3, 1) -> [0, 0, 0, 1]."""
  out = [i for i, s in enumerate(specs) for _ in range(s.weight)]
  if not out:
    raise ValueError("the training mixture is empty (every task weight is 0)")
  return out


def batch_at(tasks: Sequence[TokenizedTask], step: int, batch_size: int, seed: int
             ) -> tuple[int, dict[str, np.ndarray]]:
  """(task index, batch) of training step `step`; a pure function of its arguments.

  The batch holds `decoder_input_tokens` (T5: targets shifted right with BOS = PAD = 0;
  decoder-only: the sequence without its last token), `decoder_target_tokens`, `loss_weights`
  (1 where the target is not padding) and, for T5, `encoder_input_tokens`.
  """
  task_idx, rows = rows_at(tasks, step, batch_size, seed)
  return task_idx, batch_of(tasks[task_idx], rows)


def rows_at(tasks: Sequence[TokenizedTask], step: int, batch_size: int, seed: int,
            length_window: int = 0) -> tuple[int, np.ndarray]:
  """(task index, the task's example rows) of training step `step` (`batch_at`'s choice);
  `length_window` W > 1: the rows of W consecutive batches of the epoch's permutation, sorted
  by length (`row_lengths`), make W batches served in a seeded order (0 or 1: off)."""
  task_idx, batches, at = _served(tasks, step, batch_size, seed, length_window)
  return task_idx, batches[at]


def batch_share(tasks: Sequence[TokenizedTask], step: int, batch_size: int, seed: int,
                length_window: int) -> float:
  """Step `step`'s loss-weighted tokens over the mean of its window's batches (1.0 without
  windows). Why: a loss averaged over each batch's own tokens weighs a token of a batch of short
  rows more than one of a batch of long rows; windows sort rows into such batches (SmolLM2's
  code replies, W = 16: the shortest quarter of the rows would get 25 % of the loss for 13 % of
  the tokens), where random batches hold about equal counts (14 %). Scaled by its share, each
  batch gives every token of its window the same weight (13 %)."""
  task_idx, batches, at = _served(tasks, step, batch_size, seed, length_window)
  counts = [float(batch_of(tasks[task_idx], b)["loss_weights"].sum()) for b in batches]
  mean = sum(counts) / len(counts)
  return counts[at] / mean if mean else 1.0


def _served(tasks: Sequence[TokenizedTask], step: int, batch_size: int, seed: int,
            length_window: int) -> tuple[int, list[np.ndarray], int]:
  """(task index, the batches of step `step`'s window in serving order, which one it gets);
  without windows the window is the step's batch alone."""
  order = schedule([t.spec for t in tasks])
  rounds, pos = divmod(step, len(order))
  task_idx = order[pos]
  # How many batches this task served before `step`: full rounds plus earlier slots of this round.
  served = rounds * order.count(task_idx) + order[:pos].count(task_idx)
  task = tasks[task_idx]
  per_epoch = task.size // batch_size
  if per_epoch == 0:
    raise ValueError(f"task {task.spec.name!r} has {task.size} examples, fewer than one batch "
                     f"of {batch_size}")
  epoch, slot = divmod(served, per_epoch)
  perm = np.random.default_rng([seed, task_idx, epoch]).permutation(task.size)
  if length_window <= 1:
    return task_idx, [perm[slot * batch_size:(slot + 1) * batch_size]], 0
  window, at = divmod(slot, length_window)
  span = length_window * batch_size
  rows = perm[:per_epoch * batch_size][window * span:(window + 1) * span]  # whole batches
  rows = rows[np.argsort(row_lengths(task.targets_NxL[rows]), kind="stable")]
  picks = np.random.default_rng([seed, task_idx, epoch, window]).permutation(
      len(rows) // batch_size)
  return task_idx, [rows[p * batch_size:(p + 1) * batch_size] for p in picks], at


def row_lengths(targets_NxL: np.ndarray) -> np.ndarray:
  """Each row's length up to and including its last non-pad token (0: a row of padding)."""
  nonpad_NxL = targets_NxL != PAD_ID
  last_N = targets_NxL.shape[1] - np.argmax(nonpad_NxL[:, ::-1], axis=1)
  return np.where(nonpad_NxL.any(axis=1), last_N, 0)


CUT_MULTIPLE = 64  # a cut batch's width is rounded up to it: at most L / 64 compiled shapes


def cut_width(longest: int, t: int, multiple: int | None = None) -> int:
  """`longest` positions rounded up to `multiple` (`CUT_MULTIPLE`), at least one multiple, at
  most `t`: the width a cut batch (or a target-state fill batch) is computed at."""
  multiple = multiple or CUT_MULTIPLE
  return min(t, max(multiple, -(-longest // multiple) * multiple))


def cut_batch(batch: dict[str, np.ndarray], multiple: int | None = None
              ) -> dict[str, np.ndarray]:
  """The batch without the decoder positions after its longest row's last weighted one
  (rounded up to `multiple`): every decoder array ([B, T, ...]) is cut, the encoder's input is
  not. Why it is the same loss: the decoder (and a draft on its states) is causal, so no kept
  position reads a cut one, and a cut position has loss weight 0."""
  weights_BxT = batch["loss_weights"]
  longest = int(row_lengths((weights_BxT != 0).astype(np.int32)).max())
  width = cut_width(longest, weights_BxT.shape[1], multiple)
  return {k: (v if k == "encoder_input_tokens" else v[:, :width]) for k, v in batch.items()}


def batch_of(task: TokenizedTask, rows: np.ndarray) -> dict[str, np.ndarray]:
  """The batch (`batch_at`'s arrays) of `rows` of one task."""
  seq = task.targets_NxL[rows]
  if task.inputs_NxP is not None:
    # T5: BOS (= PAD = 0) then the targets shifted right, as the decode loop feeds them.
    inputs, targets = np.concatenate([np.zeros_like(seq[:, :1]), seq[:, :-1]], axis=1), seq
  else:
    # Decoder-only: next-token prediction with no BOS, as decoding feeds the raw prompt.
    inputs, targets = seq[:, :-1], seq[:, 1:]
  weights = (targets != PAD_ID).astype(np.float32)
  if task.spec.loss_on == "continuation" and task.inputs_NxP is None:
    if task.prompt_lengths_N is None:
      raise ValueError(f"task {task.spec.name!r}: loss_on='continuation' needs each sequence's "
                       "prompt length, which this decoder-only task does not carry")
    # Target j is sequence token j + 1: weighted from the prompt's end on.
    weights *= np.arange(1, seq.shape[1])[None, :] >= task.prompt_lengths_N[rows][:, None]
  batch = {"decoder_input_tokens": inputs, "decoder_target_tokens": targets,
           "loss_weights": weights}
  if task.inputs_NxP is not None:
    batch["encoder_input_tokens"] = task.inputs_NxP[rows]
  return batch


def model_inputs(batch: dict) -> tuple:
  """(encoder ids, decoder input ids) of a batch; a decoder-only batch gets a [B, 1] dummy
  encoder input (`Model.forward` ignores it), so one step function serves both kinds."""
  dec = batch["decoder_input_tokens"]
  enc = batch.get("encoder_input_tokens")
  if enc is None:
    enc = np.zeros((dec.shape[0], 1), np.int32)
  return enc, dec


def target_frequencies(tasks: Sequence[TokenizedTask], vocab_size: int
                       ) -> list[tuple[str, float, np.ndarray]]:
  """[(task name, weight, token frequencies [V])] over each task's decoder-side targets (pad
  excluded; with loss_on='continuation', the continuations only: the ids the loss is on): the
  counts a draft's head ranking is made of (`checkpoints.head_ranking`). A generated-sequence
  directory is filed under its source task, the name a run gives."""
  out = []
  for task in tasks:
    counted_NxL = task.targets_NxL != PAD_ID
    if task.spec.loss_on == "continuation" and task.prompt_lengths_N is not None:
      counted_NxL &= (np.arange(task.targets_NxL.shape[1])[None, :]
                      >= task.prompt_lengths_N[:, None])
    ids = task.targets_NxL[counted_NxL]
    counts = np.bincount(ids.ravel(), minlength=vocab_size)[:vocab_size].astype(np.float64)
    name = task.spec.name
    if seqdata.is_generated(name):
      name = seqdata.read_index(name)["source_task"]
    out.append((name, float(task.spec.weight), counts / max(counts.sum(), 1.0)))
  return out


def mixed_frequencies(freqs: Sequence[tuple[str, float, np.ndarray]]) -> np.ndarray:
  """The mixture's token frequencies [V]: each task's weighted as the batches mix them."""
  total = sum(w for _, w, _ in freqs)
  return sum(w / total * f for _, w, f in freqs)
