"""Per-token divergences between the target's (teacher, p) and the draft's (student, q) next-token
distributions, for distilling drafts (DistillSpec, Zhou et al. 2023, section 4).

Why several: speculative sampling accepts a drafted token with probability sum_x min(p, q) =
1 - TVD(p, q), so the best draft is the one closest to p in total variation, but which divergence
gets a small draft there fastest depends on the task and the decoding temperature. DistillSpec
compares them:
- 'fkl', forward KL(p || q): mass-covering (supervised KD); the zoo's original recipe.
- 'rkl', reverse KL(q || p): mode-seeking; a weak draft concentrates on the target's modes.
- 'jsd', generalised Jensen-Shannon JSD(beta) = beta KL(p || m) + (1 - beta) KL(q || m) with
  m = beta p + (1 - beta) q: bounded (by the entropy of the mixture weights) and smooth in both.
- 'tvd', total variation 0.5 sum_x |p(x) - q(x)| = 1 - beta_accept: exactly the quantity that
  sets the acceptance rate.
All in float32 (the models may run in bfloat16), both distributions at the same `temperature`;
the teacher gets no gradient.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

DIVERGENCES = ("fkl", "rkl", "jsd", "tvd")
# The TensorBoard / summary name of each; 'kl' is the name the zoo's forward-KL runs logged.
METRIC_NAMES = {"fkl": "kl", "rkl": "reverse_kl", "jsd": "jsd", "tvd": "tvd"}


def check(name: str, beta: float = 0.5) -> None:
  """Raises a ValueError naming the problem with a divergence setting."""
  if name not in DIVERGENCES:
    raise ValueError(f"unknown divergence {name!r}; choose one of {DIVERGENCES}")
  if name == "jsd" and not 0.0 < beta < 1.0:
    raise ValueError(f"jsd_beta must lie strictly between 0 and 1 (JSD(beta) is identically 0 at "
                     f"the ends), got {beta}")


def _log_probs(logits_BxTxV: jax.Array, temperature: float) -> jax.Array:
  return jax.nn.log_softmax(logits_BxTxV.astype(jnp.float32) / jnp.float32(temperature), axis=-1)


def _kl(log_a: jax.Array, log_b: jax.Array) -> jax.Array:
  """KL(a || b) over the last axis from log-probabilities; a = 0 terms count 0 (no 0 * inf)."""
  a = jnp.exp(log_a)
  return jnp.sum(jnp.where(a > 0, a * (log_a - log_b), 0.0), axis=-1)


def per_token(name: str, student_logits_BxTxV: jax.Array, teacher_logits_BxTxV: jax.Array, *,
              temperature: float = 1.0, beta: float = 0.5) -> jax.Array:
  """D(p || q) at every position, float32 [B, T] (any leading shape): p teacher, q student."""
  check(name, beta)
  log_q = _log_probs(student_logits_BxTxV, temperature)
  log_p = _log_probs(jax.lax.stop_gradient(teacher_logits_BxTxV), temperature)
  if name == "fkl":
    return _kl(log_p, log_q)
  if name == "rkl":
    return _kl(log_q, log_p)
  if name == "jsd":
    log_m = jnp.logaddexp(math.log(beta) + log_p, math.log1p(-beta) + log_q)
    return beta * _kl(log_p, log_m) + (1.0 - beta) * _kl(log_q, log_m)
  return 0.5 * jnp.sum(jnp.abs(jnp.exp(log_p) - jnp.exp(log_q)), axis=-1)


def weighted_sum(name: str, student_logits_BxTxV: jax.Array, teacher_logits_BxTxV: jax.Array,
                 weights_BxT: jax.Array, *, temperature: float = 1.0, beta: float = 0.5
                 ) -> jax.Array:
  """Sum over weighted positions of the per-token divergence (the trainer divides by tokens)."""
  d_BxT = per_token(name, student_logits_BxTxV, teacher_logits_BxTxV, temperature=temperature,
                    beta=beta)
  return jnp.sum(d_BxT * weights_BxT)
