"""The decoding cache: an explicit pytree with a per-example write index.

Why it looks like this (see DESIGN.md, "The decoding seam"):
- `index_B` is per example, so a batch whose examples accept different numbers of draft tokens
  needs no padding or re-alignment: each example writes at its own position.
- Writes REPLACE slot contents (a scatter with `.set`), never add into them, so rolling back is just
  setting `index_B` lower: the stale slots are masked (every slot at or past the query position is
  masked) and the next write overwrites them. T5X's additive one-hot write would corrupt them.
- Cross-attention keys/values are projected once per request at prefill, not at every step.
"""
from __future__ import annotations

from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class LayerKV:
  """Keys and values of one attention layer (or all layers stacked on a leading L axis)."""

  k_BxSxHxK: jax.Array
  v_BxSxHxK: jax.Array

  def write(self, k_BxTxHxK: jax.Array, v_BxTxHxK: jax.Array, pos_BxT: jax.Array) -> "LayerKV":
    """Replaces slots `pos_BxT` of each example. Out-of-range slots are dropped, never clamped."""
    b_Bx1 = jnp.arange(pos_BxT.shape[0])[:, None]
    return LayerKV(
        self.k_BxSxHxK.at[b_Bx1, pos_BxT].set(k_BxTxHxK.astype(self.k_BxSxHxK.dtype), mode="drop"),
        self.v_BxSxHxK.at[b_Bx1, pos_BxT].set(v_BxTxHxK.astype(self.v_BxSxHxK.dtype), mode="drop"))

  @classmethod
  def zeros(cls, batch: int, length: int, heads: int, head_dim: int, dtype) -> "LayerKV":
    z = jnp.zeros((batch, length, heads, head_dim), dtype)
    return cls(z, z)


@flax.struct.dataclass
class DecodeCache:
  """Everything a model needs to continue decoding a batch.

  Attributes:
    self_kv: decoder self-attention K/V, a tuple with one `LayerKV` per layer.
    index_B: the slot the next token of each example is written to; slots >= index are invalid.
    cross_kv: T5 only: cross-attention K/V per layer, projected once from the encoder output.
    encoder_mask_BxE: T5 only: 1 where the encoder input is a real token.
  """

  self_kv: tuple[LayerKV, ...]
  index_B: jax.Array
  cross_kv: Optional[tuple[LayerKV, ...]] = None
  encoder_mask_BxE: Optional[jax.Array] = None

  @property
  def length(self) -> int:
    """Number of slots (static)."""
    if isinstance(self.self_kv, LayerKV):  # stacked [L, B, S, H, K] (scan_layers)
      return self.self_kv.k_BxSxHxK.shape[2]
    return self.self_kv[0].k_BxSxHxK.shape[1]

  @property
  def batch_size(self) -> int:
    return self.index_B.shape[0]


def per_layer(kv) -> tuple[LayerKV, ...]:
  """A tuple of per-layer K/V from either cache layout (tuple, or one stacked [L, ...] LayerKV)."""
  if isinstance(kv, LayerKV):
    return tuple(jax.tree.map(lambda x, i=i: x[i], kv) for i in range(kv.k_BxSxHxK.shape[0]))
  return tuple(kv)


def rollback(cache: DecodeCache, index_B: jax.Array) -> DecodeCache:
  """Sets the valid prefix of each example to `index_B` slots (safe because writes replace)."""
  return cache.replace(index_B=index_B.astype(jnp.int32))


def valid_prefix_equal(a: DecodeCache, b: DecodeCache, atol: float = 0.0) -> bool:
  """True if both caches have the same indices and equal K/V in every valid slot (tests, checks)."""
  if not bool(jnp.all(a.index_B == b.index_B)):
    return False
  slots = jnp.arange(a.length)
  valid_BxS = slots[None, :] < a.index_B[:, None]
  for la, lb in zip(per_layer(a.self_kv), per_layer(b.self_kv)):
    for xa, xb in ((la.k_BxSxHxK, lb.k_BxSxHxK), (la.v_BxSxHxK, lb.v_BxSxHxK)):
      n = min(xa.shape[1], xb.shape[1])
      diff = jnp.abs(xa[:, :n] - xb[:, :n]).max(axis=(2, 3))
      if not bool(jnp.all(jnp.where(valid_BxS[:, :n], diff <= atol, True))):
        return False
  return True
