"""A run's prompts in fixed-shape batches: the task's examples as the target reads them.

Why fixed shapes: every batch is padded to one prompt width P (the longest prompt, at most
MAX_INPUT_LENGTH), so each decoding program compiles once per batch size; only a final partial
batch compiles again (its real size keeps the acceptance histograms exact).
Where the examples, their vocabulary and their ids come from (a shipped task, a JSONL path or a
seqio task) is the data door's business (`specdec_jax.data.tasks`); this module only batches them.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from specdec_jax.data import local_tasks, tasks


@dataclasses.dataclass
class Prompts:
  """Examples, their input ids and the run's vocabulary (None if it has none)."""

  examples: list
  ids: list[list[int]]
  vocab: object | None
  width: int
  pad_id: int = 0  # the target's (`ModelConfig.pad_id`)

  @classmethod
  def tokenized(cls, data: tasks.TaskData, target, max_input_length: int, *,
                truncate: bool = True) -> Prompts:
    """`data`'s prompts as `target` reads them: ids inside its vocabulary, T5 inputs ending with
    EOS; outputs decode to text only if the target's ids are the task vocabulary's. Longer
    prompts are cut with a warning (`truncate`) or refused."""
    ids = data.input_ids(model_vocab_size=target.vocab_size,
                         encoder_decoder=target.config.is_encoder_decoder,
                         max_input_length=max_input_length, truncate=truncate)
    return cls(data.examples, ids, data.decoding_vocab(target.vocab_size),
               width=max(len(r) for r in ids), pad_id=target.pad_id)

  def take(self, positions: Sequence[int]) -> Prompts:
    """The prompts at `positions`, padded to the same width (so their batches have the shape the
    run's programs were compiled and timed for)."""
    return Prompts([self.examples[p] for p in positions], [self.ids[p] for p in positions],
                   self.vocab, self.width, self.pad_id)

  @property
  def input_field(self) -> str | None:
    return self.examples[0].input_field if self.examples else None

  def batch(self, positions: Sequence[int]) -> np.ndarray:
    """int32 [len(positions), width], right-padded with the target's pad id."""
    return local_tasks.batch_inputs([self.ids[p] for p in positions], pad_to=self.width,
                                    pad_id=self.pad_id)

  def decode(self, ids: Sequence[int]) -> str | None:
    return None if self.vocab is None else self.vocab.decode(ids)
