"""Validation cross-entropy per task, for the trainer's summary and its `eval_every` dashboard.

Why a factory: the valid splits are tokenized and the loss compiled once, so periodic
evaluation during a run costs only the forward passes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from specdec_jax.models.model import Model
from specdec_jax.training import data as data_lib
from specdec_jax.training import losses
from specdec_jax.training import shared_encoder
from specdec_jax.training.placement import Placement


def make_eval_loss(model: Model, replicated=None, teacher: Model | None = None):
  """(params, batch, teacher_params) -> (summed token cross-entropy, token count), jitted.

  `teacher`: a shared-encoder model's target, whose encoder reads the batch (else unused)."""
  def eval_loss(params, batch, teacher_params):
    enc, dec = data_lib.model_inputs(batch)
    encoded = shared_encoder.encoded_for(model, teacher, teacher_params, enc)
    return losses.cross_entropy(model.forward(params, enc, dec, encoded=encoded),
                                batch["decoder_target_tokens"], batch["loss_weights"])
  return jax.jit(eval_loss) if replicated is None else jax.jit(eval_loss, out_shardings=replicated)


def make_evaluator(model: Model, tasks: Sequence[data_lib.TaskSpec], vocab, *,
                   eval_examples: int, batch_size: int, place: Placement | None = None,
                   teacher: Model | None = None, teacher_params=None
                   ) -> Callable[[Any], dict[str, float]]:
  """params -> token-level cross-entropy per task on the first `eval_examples` of valid."""
  place = place or Placement(None)
  eval_loss = make_eval_loss(model, None if place.tm is None else place.tm.replicated, teacher)
  batches = {}
  for spec in tasks:
    task = data_lib.tokenize_task(spec, vocab, model.config.is_encoder_decoder, "valid",
                                  eval_examples)
    batches[spec.name] = []
    for start in range(0, task.size, batch_size):
      rows = np.arange(start, min(start + batch_size, task.size))
      sub = data_lib.TokenizedTask(
          spec, None if task.inputs_NxP is None else task.inputs_NxP[rows], task.targets_NxL[rows],
          None if task.prompt_lengths_N is None else task.prompt_lengths_N[rows])
      batches[spec.name].append(data_lib.batch_at([sub], 0, len(rows), 0)[1])

  def evaluator(params) -> dict[str, float]:
    out = {}
    for name, task_batches in batches.items():
      total, count = 0.0, 0.0
      for batch in task_batches:
        # A short last batch may not split over the data axis: eval batches are replicated.
        s, n = eval_loss(params, place.batch(batch, split_rows=False), teacher_params)
        total, count = total + float(s), count + float(n)
      out[name] = total / max(count, 1.0)
    return out

  return evaluator
