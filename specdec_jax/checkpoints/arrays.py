"""Turning lazily opened arrays into host or sharded device arrays, casting on the way.

Readers hand back leaves that have not been read yet (a tensorstore handle, a memory-mapped
safetensors slice) or small numpy arrays. Reading happens here so a sharded load fetches only the
slices this host's devices own (each host reads its shards, never the whole xxl tree), and the
dtype cast (bf16 on disk -> float32 on CPU) happens per slice instead of on a full copy.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Union

import jax
import numpy as np

try:  # tensorstore is a hard dependency, but keep the import local to where it matters.
  import tensorstore as ts
except ImportError:  # pragma: no cover
  ts = None

# A sharding for every array: one Sharding for all, a nested dict like the params, or a function
# of (path, shape) such as `lambda path, shape: NamedSharding(mesh, rules_for(path))`.
ShardingSpec = Union[None, jax.sharding.Sharding, Mapping[str, Any],
                     Callable[[str, tuple[int, ...]], jax.sharding.Sharding]]


def leaf_dtype(leaf: Any) -> np.dtype:
  if ts is not None and isinstance(leaf, ts.TensorStore):
    return np.dtype(leaf.dtype.numpy_dtype)
  return np.dtype(leaf.dtype)


def read(leaf: Any, index: Any = ...) -> np.ndarray:
  """Reads `leaf[index]` into a numpy array (tensorstore handles are read only for that slice)."""
  if ts is not None and isinstance(leaf, ts.TensorStore):
    view = leaf if index is ... else leaf[index]
    return np.asarray(view.read().result())
  if isinstance(leaf, np.memmap):  # copy out, so params never pin or depend on the mapped file
    return np.array(leaf[index])
  return np.asarray(leaf[index])


def sharding_for(spec: ShardingSpec, path: str, shape: tuple[int, ...]):
  """Looks up the sharding of `path` ('a/b/c') in any of the accepted spec forms."""
  if spec is None or isinstance(spec, jax.sharding.Sharding):
    return spec
  if callable(spec) and not isinstance(spec, Mapping):
    return spec(path, shape)
  node: Any = spec
  for key in path.split("/"):
    if not isinstance(node, Mapping) or key not in node:
      raise KeyError(f"sharding tree has no entry for {path}")
    node = node[key]
  return node


def _cast(x: np.ndarray, dtype) -> np.ndarray:
  if dtype is None or x.dtype == np.dtype(dtype):
    return x
  return x.astype(dtype)


def materialize(leaf: Any, dtype=None, sharding: jax.sharding.Sharding | None = None):
  """One leaf -> numpy array (no sharding) or a jax.Array assembled from per-device slices."""
  if sharding is None:
    return _cast(read(leaf), dtype)
  shape = tuple(leaf.shape)
  out_dtype = np.dtype(dtype) if dtype is not None else leaf_dtype(leaf)
  cache: dict[Any, np.ndarray] = {}

  def fetch(index):
    key = tuple((s.start, s.stop, s.step) for s in index)
    if key not in cache:  # replicated devices share one read
      cache[key] = _cast(read(leaf, index), out_dtype)
    return cache[key]

  return jax.make_array_from_callback(shape, sharding, fetch, dtype=out_dtype)


def materialize_tree(flat: Mapping[str, Any], dtype=None, sharding: ShardingSpec = None,
                     progress: bool = False) -> dict[str, Any]:
  """materialize() over a flat {path: leaf} dict, with an optional tqdm bar."""
  items = list(flat.items())
  if progress:
    from tqdm import tqdm
    items = tqdm(items, desc="arrays", unit="array")
  return {path: materialize(leaf, dtype, sharding_for(sharding, path, tuple(leaf.shape)))
          for path, leaf in items}
