"""The decoding cache: an explicit pytree with a per-example write index.

Why it looks like this (see DESIGN.md, "The decoding seam"):
- `index_B` is per example, so a batch whose examples accept different numbers of draft tokens
  needs no padding or re-alignment: each example writes at its own position.
- Writes REPLACE slot contents (a scatter with `.set`), never add into them, so rolling back is just
  setting `index_B` lower: the stale slots are masked (every slot at or past the query position is
  masked) and the next write overwrites them. T5X's additive one-hot write would corrupt them.
- Cross-attention keys/values are projected once per request at prefill, not at every step.
- Head-major layouts, the ones attention's two products read without a copy: keys [B, H, K, S]
  (q k^T contracts K, and S is the free dimension), values [B, H, S, K] (weights v contracts S).
  Stored [B, S, H, K], the CPU compiler re-laid both out for every layer at every step: eight
  whole-cache copies per step of the zoo target, about a tenth of its non-matmul time.
"""
from __future__ import annotations

from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.kernels import cache_write


@flax.struct.dataclass
class LayerKV:
  """Keys and values of one attention layer (or all layers stacked on a leading L axis)."""

  k_BxHxKxS: jax.Array
  v_BxHxSxK: jax.Array

  @classmethod
  def from_heads(cls, k_BxSxHxK: jax.Array, v_BxSxHxK: jax.Array) -> "LayerKV":
    """From projections laid out [B, S, H, K] (the cross-attention K/V, an uncached encoder)."""
    return cls(jnp.transpose(k_BxSxHxK, (0, 2, 3, 1)), jnp.transpose(v_BxSxHxK, (0, 2, 1, 3)))

  def write(self, k_BxTxHxK: jax.Array, v_BxTxHxK: jax.Array, pos_BxT: jax.Array) -> "LayerKV":
    """Replaces slots `pos_BxT` of each example. Out-of-range slots are dropped, never clamped.
    (NumPy indexing: the [B, T] index arrays around the H/K slices put [B, T] first, so both
    updates are given as [B, T, H, K].)"""
    b_Bx1 = jnp.arange(pos_BxT.shape[0])[:, None]
    return LayerKV(
        self.k_BxHxKxS.at[b_Bx1, :, :, pos_BxT].set(k_BxTxHxK.astype(self.k_BxHxKxS.dtype),
                                                    mode="drop"),
        self.v_BxHxSxK.at[b_Bx1, :, pos_BxT].set(v_BxTxHxK.astype(self.v_BxHxSxK.dtype),
                                                 mode="drop"))

  def write_in_place(self, k_BxTxHxK: jax.Array, v_BxTxHxK: jax.Array, start_B: jax.Array
                     ) -> "LayerKV":
    """`write` of a contiguous block (slots start_B[b] + 0..T-1) through the kernels' in-place
    call (`kernels.cache_write`: XLA's own write was copied whole once per consumer). The block
    must fit; one that does not fails at run time, naming it. The kernels' path only."""
    k_new = cache_write.write_block(self.k_BxHxKxS, jnp.transpose(k_BxTxHxK, (0, 2, 3, 1)),
                                    start_B, axis=3)
    v_new = cache_write.write_block(self.v_BxHxSxK, jnp.transpose(v_BxTxHxK, (0, 2, 1, 3)),
                                    start_B, axis=2)
    return LayerKV(k_new, v_new)

  def copy_slots(self, src_BxT: jax.Array, dst_BxT: jax.Array) -> "LayerKV":
    """Slots dst_BxT[b, t] get the keys/values of slots src_BxT[b, t] (all read before any is
    written, so the two may overlap); out-of-range destinations are dropped. One layer [B, ...],
    or layers stacked on a leading axis [L, B, ...] (scanned)."""
    if self.k_BxHxKxS.ndim == 5:
      return jax.vmap(lambda layer: layer.copy_slots(src_BxT, dst_BxT))(self)
    slots = self.length
    src_BxT = jnp.clip(src_BxT, 0, slots - 1)
    k_BxHxKxT = jnp.take_along_axis(self.k_BxHxKxS, src_BxT[:, None, None, :], axis=3)
    v_BxHxTxK = jnp.take_along_axis(self.v_BxHxSxK, src_BxT[:, None, :, None], axis=2)
    return self.write(jnp.transpose(k_BxHxKxT, (0, 3, 1, 2)),
                      jnp.transpose(v_BxHxTxK, (0, 2, 1, 3)), dst_BxT)

  @classmethod
  def zeros(cls, batch: int, length: int, heads: int, head_dim: int, dtype) -> "LayerKV":
    return cls(jnp.zeros((batch, heads, head_dim, length), dtype),
               jnp.zeros((batch, heads, length, head_dim), dtype))

  @property
  def length(self) -> int:
    """Number of slots (static)."""
    return self.v_BxHxSxK.shape[-2]

  def slots(self) -> tuple[jax.Array, jax.Array]:
    """(keys, values), both [..., B, S, H, K]: the layout-independent view (tests, checks)."""
    return jnp.moveaxis(self.k_BxHxKxS, (-4, -3, -2, -1), (-4, -2, -1, -3)), \
        jnp.moveaxis(self.v_BxHxSxK, (-4, -3, -2, -1), (-4, -2, -3, -1))


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
    return (self.self_kv if isinstance(self.self_kv, LayerKV) else self.self_kv[0]).length

  @property
  def batch_size(self) -> int:
    return self.index_B.shape[0]

  def rollback(self, index_B: jax.Array) -> "DecodeCache":
    """Each example's valid prefix cut to `index_B` slots (safe because writes replace)."""
    return self.replace(index_B=index_B.astype(jnp.int32))

  def copy_slots(self, src_BxT: jax.Array, dst_BxT: jax.Array) -> "DecodeCache":
    """Self-attention K/V of slots src_BxT copied to slots dst_BxT in every layer (the index is
    left alone). Why: after a block scored with `Model.extend_with_mask`, the entries of the
    continuation that was kept sit at scattered slots; gathered into consecutive slots, a
    rollback (an index move) is again all that committing needs. Entries at their final slots
    were computed at their final positions, so they equal a chain's."""
    kv = self.self_kv
    moved = (kv.copy_slots(src_BxT, dst_BxT) if isinstance(kv, LayerKV)
             else tuple(layer.copy_slots(src_BxT, dst_BxT) for layer in kv))
    return self.replace(self_kv=moved)


def per_layer(kv) -> tuple[LayerKV, ...]:
  """A tuple of per-layer K/V from either cache layout (tuple, or one stacked [L, ...] LayerKV)."""
  if isinstance(kv, LayerKV):
    return tuple(jax.tree.map(lambda x, i=i: x[i], kv) for i in range(kv.k_BxHxKxS.shape[0]))
  return tuple(kv)


def valid_prefix_equal(a: DecodeCache, b: DecodeCache, atol: float = 0.0) -> bool:
  """True if both caches have the same indices and equal K/V in every valid slot (tests, checks)."""
  if not bool(jnp.all(a.index_B == b.index_B)):
    return False
  slots = jnp.arange(a.length)
  valid_BxS = slots[None, :] < a.index_B[:, None]
  for la, lb in zip(per_layer(a.self_kv), per_layer(b.self_kv)):
    for xa, xb in zip(la.slots(), lb.slots()):  # [B, S, H, K]
      n = min(xa.shape[1], xb.shape[1])
      diff = jnp.abs(xa[:, :n] - xb[:, :n]).max(axis=(2, 3))
      if not bool(jnp.all(jnp.where(valid_BxS[:, :n], diff <= atol, True))):
        return False
  return True
