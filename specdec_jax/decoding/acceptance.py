"""Acceptance rules: given the draft's block and both models' processed distributions, how many
draft tokens to keep and which token to emit after them.

Public contract (DESIGN.md): `tokenwise(key, draft_tokens, draft_probs, target_probs)` with shapes
[B, G] int32, [B, G, V], [B, G + 1, V] float32 -> (num_accepted [B] int32, next_token [B] int32).
All arithmetic is float32 whatever the models ran in.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.decoding.sampling import sample

# A residual whose mass is below this is numerically p == q: rejection then had probability ~0,
# and sampling from p is the correct limit (the residual is undefined, not zero).
RESIDUAL_EPS = 1e-12


def _take(probs_BxGxV: jax.Array, tokens_BxG: jax.Array) -> jax.Array:
  return jnp.take_along_axis(probs_BxGxV, tokens_BxG[..., None], axis=-1)[..., 0]


def leading_count(accept_BxG: jax.Array) -> jax.Array:
  """Number of leading True entries per row."""
  return jnp.sum(jnp.cumprod(accept_BxG.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def residual(p_BxV: jax.Array, q_BxV: jax.Array) -> jax.Array:
  """norm(max(0, p - q)), falling back to p where the residual has no mass."""
  r = jnp.maximum(p_BxV - q_BxV, 0.0)
  mass = jnp.sum(r, axis=-1, keepdims=True)
  return jnp.where(mass > RESIDUAL_EPS, r / jnp.maximum(mass, RESIDUAL_EPS), p_BxV)


def tokenwise(key: jax.Array, draft_tokens: jax.Array, draft_probs: jax.Array,
              target_probs: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Token-wise modified rejection sampling (Leviathan et al. Algorithm 1; Chen et al. Alg. 2).

  Accept x_i while r_i <= p_i(x_i) / q_i(x_i) with r_i ~ U[0, 1). At the first rejection n, emit a
  sample of norm(max(0, p_{n+1} - q_{n+1})); if all G are accepted, emit a bonus sample of p_{G+1}.
  Written as r_i * q_i(x_i) <= p_i(x_i) so q = 0 needs no division (x_i ~ q_i, so q_i(x_i) > 0).
  """
  draft_probs = draft_probs.astype(jnp.float32)
  target_probs = target_probs.astype(jnp.float32)
  batch, gamma = draft_tokens.shape
  k_accept, k_next = jax.random.split(key)
  p_x = _take(target_probs[:, :gamma], draft_tokens)
  q_x = _take(draft_probs, draft_tokens)
  r = jax.random.uniform(k_accept, (batch, gamma), jnp.float32)
  n_B = leading_count(r * q_x <= p_x)
  # Distribution of the token after the accepted prefix: residual at n < G, target at n == G.
  q_pad = jnp.concatenate([draft_probs, jnp.zeros_like(draft_probs[:, :1])], axis=1)
  p_n = jnp.take_along_axis(target_probs, n_B[:, None, None], axis=1)[:, 0]
  q_n = jnp.take_along_axis(q_pad, n_B[:, None, None], axis=1)[:, 0]
  next_B = sample(k_next, residual(p_n, q_n))
  return n_B, next_B


ACCEPTANCE_RULES = {"tokenwise": tokenwise}


def get_rule(name: str):
  if name not in ACCEPTANCE_RULES:
    raise ValueError(f"unknown acceptance rule {name!r}; known: {sorted(ACCEPTANCE_RULES)}")
  return ACCEPTANCE_RULES[name]
