"""Exact reductions that XLA:CPU lowers slowly, written as plain ones.

Why a module of its own on the ground floor: the decode loop (`decoding.sampling` re-exports
`argmax`) and the model-free drafts' n-gram matching (`models.model_free`) both take argmaxes in
the hot loop, and models may not import decoding.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def argmax(x_NxV: jax.Array) -> jax.Array:
  """`jnp.argmax(x, axis=-1)` as int32, bit for bit (the first maximal entry; the first NaN where
  a row has one), in two plain reductions. Why: XLA:CPU lowers argmax to one variadic (value,
  index) reduction that it does not vectorise, several times slower than max-then-first-index,
  and a greedy iteration takes one per drafted token, verified position and sampled residual."""
  v = x_NxV.shape[-1]
  max_Nx1 = jnp.max(x_NxV, axis=-1, keepdims=True)
  iota_NxV = jax.lax.broadcasted_iota(jnp.int32, x_NxV.shape, x_NxV.ndim - 1)
  hit_NxV = (x_NxV == max_Nx1) | jnp.isnan(x_NxV)
  return jnp.min(jnp.where(hit_NxV, iota_NxV, v), axis=-1).astype(jnp.int32)
