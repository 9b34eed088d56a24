"""Initialise a model from another checkpoint's parameters, wherever path and shape agree.

Why: a new draft architecture rarely has to start from nothing. A shared-encoder draft keeps a
standalone draft's decoder layers, embedding and output head (only its source projection and
cross-attention keys/values now read other states), so it starts from what that draft already
learned about the target language instead of from random weights.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np
from absl import logging


def warm_start(params: Any, source: Any, source_name: str) -> tuple[Any, dict[str, int]]:
  """`params` with every leaf that `source` has at the same path with the same shape replaced.

  Returns (params, counts): counts of leaves copied / kept (missing in `source` or another
  shape). Refuses a source that shares no leaf: that is a wrong checkpoint, not a warm start.
  """
  flat_source = {jax.tree_util.keystr(p): leaf
                 for p, leaf in jax.tree_util.tree_flatten_with_path(source)[0]}
  copied, kept = [], []

  def take(path, leaf):
    name = jax.tree_util.keystr(path)
    other = flat_source.get(name)
    if other is not None and np.shape(other) == np.shape(leaf):
      copied.append(name)
      return np.asarray(other, dtype=np.asarray(leaf).dtype)
    kept.append(name)
    return leaf

  out = jax.tree_util.tree_map_with_path(take, params)
  if not copied:
    raise ValueError(f"init_from {source_name!r} shares no parameter (same path and shape) with "
                     "the model: it is not a checkpoint of a related architecture")
  logging.info("initialised %d parameters from %s; %d keep their init: %s", len(copied),
               source_name, len(kept), ", ".join(kept))
  return out, {"copied": len(copied), "kept": len(kept)}
