"""Committing a verified tree path in a model's cache: its entries into consecutive slots.

Why: the verify call writes node n of the tree to slot root + n (`Model.extend_with_mask` keeps
the write slots consecutive, positions by depth), so the kept path's entries sit at scattered
slots. Gathered to root + 1 .. root + n, the cache is the one a chain over the path would have
built (entries were computed at their depth's position, which is their new slot), and everything
after is the chain's commit again: a rollback, an index move.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.seam import Cache


def commit_path(cache: Cache, root_slot_B: jax.Array, path_BxD: jax.Array,
                num_accepted_B: jax.Array) -> Cache:
  """The cache after a tree verify call, reduced to the kept path.

  root_slot_B: the root's slot (the cache index before the verify call). path_BxD: the kept node
  at depth d + 1 (`TreeVerdict.path_BxD`, -1 past the path). Returns the cache with node
  path[d]'s entries at slot root + d + 1 and the index at root + n + 1, the slot of the token
  emitted after the path (not fed yet), as the chain's commit leaves it. The cache must have
  `copy_slots` (`models.kv_cache.DecodeCache`).
  """
  depth = path_BxD.shape[1]
  dst_BxD = root_slot_B[:, None] + jnp.arange(1, depth + 1, dtype=jnp.int32)[None, :]
  # Past the path a slot is copied onto itself: destinations stay distinct, nothing kept moves.
  src_BxD = jnp.where(path_BxD >= 0, root_slot_B[:, None] + path_BxD, dst_BxD)
  return cache.copy_slots(src_BxD, dst_BxD).rollback(root_slot_B + num_accepted_B + 1)
