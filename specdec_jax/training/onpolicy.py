"""On-policy distillation (DistillSpec's lambda): some batches are the draft's own continuations.

Why: a draft drafts from its own prefixes, and those drift from the target's and the data's; a
divergence measured only on fixed sequences never sees where the draft's own outputs go wrong.
DistillSpec (Zhou et al. 2023, after GKD) therefore trains on sequences the student samples with
its current parameters for a fraction lambda of the batches, the teacher scoring every position
of them; no gradient flows through the sampling.

For exact resume both choices are pure functions of (seed, step): whether step s is on-policy, and
the sampling key. A resumed run restores the very parameters the killed one had at that step, so
it regenerates the same continuations (the trainer's `batches.jsonl` digests show it).
Generation is the framework's own batched on-device loop (an autoregressive `decoding.decoder.Decoder`), jitted once
per task shape; in a sharded run it reads the student's sharded parameters where they are (XLA
partitions the loop like the train step). Encoder-decoder (T5) students only: the prompt is the
encoder input. A shared-encoder student samples on its target's encoder output, as it drafts
(`shared_encoder.WithTargetEncoder`: the teacher encodes the prompts once per batch).
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from specdec_jax.data.vocabulary import PAD_ID
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.training import shared_encoder

_STREAM = 0x0D15  # separates the on-policy random stream from init and data order


def is_on_policy(fraction: float, seed: int, step: int) -> bool:
  """Whether training step `step` trains on the student's own continuations."""
  if fraction <= 0.0:
    return False
  if fraction >= 1.0:
    return True
  return bool(np.random.default_rng([seed, _STREAM, step]).random() < fraction)


def sampling_key(seed: int, step: int) -> jax.Array:
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), _STREAM), step)


def student_batch(model, params, batch: dict[str, np.ndarray], *, temperature: float, seed: int,
                  step: int, teacher=None, teacher_params=None) -> dict[str, np.ndarray]:
  """`batch` with its decoder side replaced by the student's continuation of its prompts.

  Continuations are at most the batch's target length; the loss covers every generated token
  (EOS included when the student ended), nothing after. `teacher`: needed (only) by a
  shared-encoder student, which decodes on the teacher's encoder output.
  """
  enc_BxP = batch["encoder_input_tokens"]
  target_len = batch["decoder_target_tokens"].shape[1]
  model, params = shared_encoder.standalone(model, params, teacher, teacher_params)
  decoder = Decoder(model, sampling=SamplingConfig(temperature=temperature),
                    max_decode_len=target_len)
  result = decoder.generate(Params(params), enc_BxP, sampling_key(seed, step))
  tokens_BxN, lengths_B = jax.device_get((result.tokens_BxN, result.lengths_B))
  targets_BxN = np.asarray(tokens_BxN, np.int32)
  weights_BxN = (np.arange(target_len)[None, :] < np.asarray(lengths_B)[:, None])
  inputs_BxN = np.concatenate([np.full_like(targets_BxN[:, :1], PAD_ID), targets_BxN[:, :-1]],
                              axis=1)  # BOS (= PAD) then the continuation shifted right
  out: dict[str, Any] = dict(batch)
  out.update(decoder_input_tokens=inputs_BxN, decoder_target_tokens=targets_BxN,
             loss_weights=weights_BxN.astype(np.float32))
  return out
