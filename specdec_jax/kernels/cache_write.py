"""`write_block(cache, block, start)`: a decode step's cache write, in place, as one custom call.

Why: a decode step writes each layer's new keys and values into the cache, and both attention
and the step's result read the updated cache. Written by XLA (`LayerKV.write`'s scatter, or a
dynamic_update_slice), XLA:CPU fused the update into each of those two consumers and, as two
fused copies of one update cannot both run in place, copied the layer's whole cache for each:
2 copies per layer per step in the decode loop, 4 in a lone `extend` (SmolLM2 at 1,026 slots:
~94-190 MB moved per step, more than attention reads). A custom call is fused into nothing: it
writes the block into the cache's own buffer (its result aliases the cache operand), and both
consumers read that buffer. (`jax.lax.optimization_barrier` cannot do it: XLA:CPU removes
barriers before fusion; an aliased no-op call behind XLA's own update still left one copy.)

The call is the kernel library's `specdec_cache_write` (packed_matmul.cc): a memcpy per
(example, index before the write axis) of the block's contiguous run. A block must fit the
cache: one that does not is a runtime error naming the example and slots, never a clamped or
dropped write (the decoders size every cache for their largest block:
`start.cache_len_needed`). Only where the kernels run
(a CPU run on one device, the packed layouts); the caller keeps XLA's write elsewhere.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.kernels import build


def available() -> bool:
  """Whether the call is registered (the kernels built)."""
  return build.load()


def write_block(cache: jax.Array, block: jax.Array, start_B: jax.Array, axis: int) -> jax.Array:
  """cache[b, ..., start_B[b] + t, ...] = block[b, ..., t, ...] along `axis`, in place; the
  updated cache. Any layout: the call copies one run of T x (the dimensions after `axis`) per
  example and index of the dimensions between the batch and `axis`."""
  call = jax.ffi.ffi_call(build.TARGET_NAME_CACHE_WRITE,
                          jax.ShapeDtypeStruct(cache.shape, cache.dtype),
                          input_output_aliases={0: 0})
  return call(cache, block.astype(cache.dtype), start_B.astype(jnp.int32), axis=int(axis))
