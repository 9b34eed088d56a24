"""Training losses, all in float32: cross-entropy (with T5X's z-loss) and token-level distillation.

Distillation follows DistillSpec (Zhou et al. 2023): the draft is trained towards the target's
next-token distribution, token by token, since the acceptance rate of speculative sampling is
exactly sum_x min(p, q) and a draft closer to p in distribution accepts more. Forward KL(p || q)
on the training data is the supervised-KD variant; `training.divergences` holds it and the
others DistillSpec compares (reverse KL, JSD(beta), total variation).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.training import divergences


def cross_entropy(logits_BxTxV: jax.Array, targets_BxT: jax.Array, weights_BxT: jax.Array,
                  z_loss: float = 0.0) -> tuple[jax.Array, jax.Array]:
  """(sum of weighted token losses, sum of weights); z-loss keeps log Z near 0 (T5X: 1e-4)."""
  logits = logits_BxTxV.astype(jnp.float32)
  log_z_BxT = jax.nn.logsumexp(logits, axis=-1)
  target_logit_BxT = jnp.take_along_axis(logits, targets_BxT[..., None], axis=-1)[..., 0]
  loss_BxT = log_z_BxT - target_logit_BxT + z_loss * jnp.square(log_z_BxT)
  return jnp.sum(loss_BxT * weights_BxT), jnp.sum(weights_BxT)


def forward_kl(student_logits_BxTxV: jax.Array, teacher_logits_BxTxV: jax.Array,
               weights_BxT: jax.Array, temperature: float = 1.0) -> jax.Array:
  """Sum over weighted positions of KL(teacher || student) at `temperature` (the other
  divergences: `training.divergences`)."""
  return divergences.weighted_sum("fkl", student_logits_BxTxV, teacher_logits_BxTxV, weights_BxT,
                                  temperature=temperature)
