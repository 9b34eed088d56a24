"""A run's prompts in fixed-shape batches: the task's examples as the target reads them.

Why a few fixed shapes: a batch is padded to a width bucket, the next power of two (at least
16) above its longest prompt, capped at the run's longest prompt (at most MAX_INPUT_LENGTH), so
each decoding program compiles once per bucket and batch size (a final partial batch compiles
again: its real size keeps the acceptance histograms exact); every compile is the untimed
warm-up call of `timing.interleaved`. Why not one width for all: the target's encoder and every
cross-attention read the padded width, and a request's fixed cost followed it: en-de's widest
prompt is 100 ids, its average 28, and a 25-id prompt padded to 100 cost 10.6 ms before its
first iteration against 4.4 ms padded to 32 (DESIGN.md, Machine facts). `RunConfig.prompt_buckets
= False` pads every batch to the run's longest prompt, as before.
Where the examples, their vocabulary and their ids come from (a shipped task, a JSONL path or a
seqio task) is the data door's business (`specdec_jax.data.tasks`); this module only batches them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from specdec_jax.data import local_tasks, tasks


MIN_BUCKET = 16


def bucket_width(longest: int, width: int) -> int:
  """The padded width of a batch whose longest prompt has `longest` ids: the next power of two,
  at least MIN_BUCKET, at most `width` (the run's longest prompt)."""
  return min(width, max(MIN_BUCKET, 1 << max(longest - 1, 0).bit_length()))


@dataclasses.dataclass
class Prompts:
  """Examples, their input ids and the run's vocabulary (None if it has none); `buckets`: pad a
  batch to its width bucket (`bucket_width`), else to `width`."""

  examples: list
  ids: list[list[int]]
  vocab: object | None
  width: int
  pad_id: int = 0  # the target's (`ModelConfig.pad_id`)
  buckets: bool = True

  @classmethod
  def tokenized(cls, data: tasks.TaskData, target, max_input_length: int, *,
                truncate: bool = True, buckets: bool = True) -> Prompts:
    """`data`'s prompts as `target` reads them: ids inside its vocabulary, T5 inputs ending with
    EOS; outputs decode to text only if the target's ids are the task vocabulary's. Longer
    prompts are cut with a warning (`truncate`) or refused."""
    ids = data.input_ids(model_vocab_size=target.vocab_size,
                         encoder_decoder=target.config.is_encoder_decoder,
                         max_input_length=max_input_length, truncate=truncate)
    return cls(data.examples, ids, data.decoding_vocab(target.vocab_size),
               width=max(len(r) for r in ids), pad_id=target.pad_id, buckets=buckets)

  def take(self, positions: Sequence[int]) -> Prompts:
    """The prompts at `positions`, with the same width and buckets (so their batches have the
    shapes the run's programs were compiled and timed for)."""
    return Prompts([self.examples[p] for p in positions], [self.ids[p] for p in positions],
                   self.vocab, self.width, self.pad_id, self.buckets)

  @property
  def input_field(self) -> str | None:
    return self.examples[0].input_field if self.examples else None

  def batch(self, positions: Sequence[int]) -> np.ndarray:
    """int32 [len(positions), P], right-padded with the target's pad id: P is the batch's width
    bucket (`bucket_width`), or `width` without buckets."""
    rows = [self.ids[p] for p in positions]
    pad_to = (bucket_width(max(len(r) for r in rows), self.width) if self.buckets and rows
              else self.width)
    return local_tasks.batch_inputs(rows, pad_to=pad_to, pad_id=self.pad_id)

  def decode(self, ids: Sequence[int]) -> str | None:
    return None if self.vocab is None else self.vocab.decode(ids)
