"""Training a shared-encoder draft: the target's encoder reads the source, frozen.

Why: such a draft (`ModelConfig.source_dim`) has no encoder; at decode time it cross-attends to
the target's encoder output (`decoding.seam`). It must train on exactly those states, so the
trainer's teacher IS its target: the teacher's `encode` runs inside the train step, outside the
gradient (the teacher's parameters are an argument the step never differentiates), and the export
records which target it was (`checkpoints.pairing`).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax

from specdec_jax.checkpoints import pairing
from specdec_jax import seam
from specdec_jax.models.model_config import ModelConfig


def check_config(cfg, model_cfg: ModelConfig | None, teacher_cfg: ModelConfig | None) -> None:
  """Raises a ValueError unless the teacher can lend this student its encoder. Configs only, so
  it runs before anything is written (None: a config not readable without the weights yet)."""
  if model_cfg is None or not model_cfg.shares_encoder:
    return
  if not cfg.teacher:
    raise ValueError(f"model {cfg.model} is a shared-encoder draft (source_dim "
                     f"{model_cfg.source_dim}): name its target as TrainConfig.teacher; the "
                     "draft trains on that target's (frozen) encoder output")
  if teacher_cfg is None:
    return
  if not teacher_cfg.is_encoder_decoder or teacher_cfg.shares_encoder:
    raise ValueError(f"teacher {cfg.teacher} has no encoder of its own to share with the "
                     f"shared-encoder draft {cfg.model}")
  if teacher_cfg.emb_dim != model_cfg.source_dim:
    raise ValueError(f"shared-encoder draft {cfg.model} reads encoder states of width "
                     f"{model_cfg.source_dim} but teacher {cfg.teacher} encodes to "
                     f"{teacher_cfg.emb_dim}: set ModelConfig.source_dim to the target's emb_dim")


def check_pairing(cfg, model_cfg: ModelConfig, teacher_params) -> None:
  """Fine-tuning a shared-encoder draft that already belongs to a target: only with that target."""
  if (model_cfg.shares_encoder and os.path.isdir(str(cfg.model))
      and pairing.read(cfg.model) is not None):
    pairing.check(cfg.model, draft_name=cfg.model, target_name=cfg.teacher,
                  target_params=teacher_params)


def encoded_for(model, teacher, teacher_params, inputs_BxP):
  """The teacher's encoding of the batch for a shared-encoder student, else None. No gradient
  reaches the teacher: its parameters are not what the step differentiates; `stop_gradient`
  also keeps a future joint objective from training the target's encoder by accident."""
  if not model.shares_encoder:
    return None
  encoded = teacher.encode(teacher_params, inputs_BxP)
  return jax.lax.stop_gradient(encoded)


@dataclasses.dataclass(frozen=True)
class WithTargetEncoder(seam.Delegate):
  """A shared-encoder draft (`base`) made a standalone model: its prefill encodes with `target`.

  Why: the draft alone cannot decode (it has no encoder), yet on-policy distillation samples its
  own continuations in the framework's autoregressive loop. Its params are the pair (draft
  params, target params), so the loop's one prefill runs the target's encoder and the draft's
  cross-attention projections, and every later step is the draft's own `extend`. A
  `seam.Delegate` (frozen, hashable: the loops take it as a static argument of `jit`).
  """

  target: Any = None

  @property
  def shares_encoder(self) -> bool:
    return False  # it brings its target's encoder along

  def encode(self, params, inputs_BxP: jax.Array):
    return self.target.encode(params[1], inputs_BxP)

  def prefill(self, params, inputs_BxP: jax.Array, cache_len: int, *, encoded=None):
    if encoded is None:
      encoded = self.encode(params, inputs_BxP)
    return self.base.prefill(params[0], inputs_BxP, cache_len, encoded=encoded)

  def extend(self, params, cache, tokens_BxT: jax.Array):
    return self.base.extend(params[0], cache, tokens_BxT)


def standalone(model, params, teacher, teacher_params):
  """(model, params) that decode on their own: a shared-encoder draft is paired with the
  target whose encoder it reads; any other model is returned as it is."""
  if not model.shares_encoder:
    return model, params
  if teacher is None:
    raise ValueError("a shared-encoder draft decodes only on its target's encoder output: pass "
                     "the target (the training run's teacher)")
  return WithTargetEncoder(model, target=teacher), (params, teacher_params)
