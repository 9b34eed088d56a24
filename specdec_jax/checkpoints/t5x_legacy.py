"""T5X's legacy checkpoint format (the one the public T5 v1.1 checkpoints use), without t5x.

A `checkpoint_<step>/` directory holds one msgpack file `checkpoint`
(`{'version': 3, 'optimizer': {'target': ..., 'state': ...}}`, flax's ext types: ndarray code 1,
numpy scalar code 3, `__msgpack_chunked_array__` for >1 GiB arrays) whose leaves are either inline
arrays or tensorstore specs pointing at one zarr v2 directory per array (gzip from the legacy
writer, zstd from jax's array serialisation). t5x is not on PyPI, so this reads the format natively
with flax's msgpack codec and tensorstore, and keeps only `target` (optimizer slots are useless for
inference and, with Adafactor, add a third to the read). The writer produces the same layout so
tests can exercise the zarr path, and users can hand our weights back to T5X.
"""
from __future__ import annotations

import copy
import os
from typing import Any, Mapping

import flax.serialization
import numpy as np
import tensorstore as ts

from specdec_jax.checkpoints import arrays, storage
from specdec_jax.checkpoints.tree import CheckpointError, flatten, unflatten

CHECKPOINT_FILE = "checkpoint"
_MAX_CHUNK_BYTES = 2**26  # T5X's _choose_chunk_shape bound (64 MiB per chunk).


def checkpoint_file(path: str) -> str:
  """`path` may be the checkpoint directory or the msgpack file itself (local or a URL)."""
  if storage.is_url(path):
    for candidate in (storage.join(path, CHECKPOINT_FILE), path):
      if storage.exists(candidate):
        return candidate
  else:
    if os.path.isdir(path):
      path = os.path.join(path, CHECKPOINT_FILE)
    if os.path.isfile(path):
      return path
  raise CheckpointError(f"no T5X msgpack checkpoint at {path}")


def is_t5x_legacy(path: str) -> bool:
  """T5X's own test: top-level keys exactly {version, optimizer} (read from the msgpack header)."""
  try:
    file = checkpoint_file(path)
  except CheckpointError:
    return False
  if storage.is_url(file):
    head = (storage.read_bytes(file) or b"")[:64]
  else:
    with open(file, "rb") as f:
      head = f.read(64)
  # A 2-entry msgpack map starts with 0x82; its first key is `version` or `optimizer`.
  return head[:1] == b"\x82" and (b"version" in head[:12] or b"optimizer" in head[:12])


def read_msgpack(path: str) -> dict[str, Any]:
  raw = storage.read_bytes(checkpoint_file(path))
  state = flax.serialization.msgpack_restore(raw)
  if not isinstance(state, dict) or set(state) != {"version", "optimizer"}:
    raise CheckpointError(f"{path} is not a T5X checkpoint: top-level keys "
                          f"{sorted(state) if isinstance(state, dict) else type(state)}")
  version = int(np.asarray(state["version"]))
  if version < 3:
    raise CheckpointError(f"T5X checkpoint version {version} stores bfloat16 as uint16; "
                          "re-save it with a current T5X (version 3)")
  return state


def _is_spec(leaf: Any) -> bool:
  return isinstance(leaf, Mapping) and "driver" in leaf and ("kvstore" in leaf or "path" in leaf)


def resolve_spec(spec: Mapping[str, Any], ckpt_dir: str) -> dict[str, Any]:
  """Makes a stored spec openable from where the checkpoint is now.

  The stored kvstore path is relative to the checkpoint directory (`target.encoder...kernel`), or
  a top-level `path` in specs from tensorstore < 0.1.14; the stored driver says where it was
  written (gcs with a dummy bucket, file, gfile). Chunks and compressor are dropped so the
  `.zarray` on disk decides, as T5X does on restore.
  """
  spec = copy.deepcopy(dict(spec))
  kv = spec.pop("kvstore", None)
  if isinstance(kv, str):
    kv = {"driver": "file", "path": kv}
  kv = dict(kv or {})
  top = spec.pop("path", None)
  rel = os.path.join(kv.get("path", ""), top) if top else kv.get("path", "")
  name = os.path.basename(rel.rstrip("/"))
  if storage.is_url(ckpt_dir):  # e.g. gs://t5-data/...: a kvstore URL tensorstore parses
    spec["kvstore"] = storage.join(ckpt_dir, name) + "/"
  else:
    candidate = rel if os.path.isabs(rel) and os.path.isdir(rel) else os.path.join(ckpt_dir, rel)
    if not os.path.isdir(candidate):  # written elsewhere (another bucket, an absolute path)
      candidate = os.path.join(ckpt_dir, name)
    spec["kvstore"] = {"driver": "file", "path": os.path.abspath(candidate) + "/"}
  meta = dict(spec.get("metadata") or {})
  meta.pop("chunks", None)
  meta.pop("compressor", None)
  spec["metadata"] = meta
  spec.setdefault("driver", "zarr")
  return spec


def open_target(path: str) -> dict[str, Any]:
  """Flat {path: leaf} of the `target` tree; zarr-backed leaves are opened, not read."""
  file = checkpoint_file(path)
  ckpt_dir = storage.dirname(file)
  state = read_msgpack(file)
  target = state["optimizer"].get("target")
  if not isinstance(target, Mapping):
    raise CheckpointError(f"{file} has no optimizer/target tree")
  flat = {}
  for key, leaf in _flatten_specs(target).items():
    if _is_spec(leaf):
      spec = resolve_spec(leaf, ckpt_dir)
      try:
        flat[key] = ts.open(spec, open=True, read=True).result()
      except Exception as e:  # tensorstore raises ValueError with its own text
        raise CheckpointError(f"cannot open array target/{key} at {spec['kvstore']}: {e}") from e
    else:
      flat[key] = np.asarray(leaf)
  return flat


def _flatten_specs(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """Like tree.flatten, but a tensorstore spec dict is a leaf."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping) and not _is_spec(value):
      out.update(_flatten_specs(value, f"{prefix}{key}/"))
    else:
      out[f"{prefix}{key}"] = value
  return out


def load_target(path: str, dtype=None, sharding: arrays.ShardingSpec = None) -> dict[str, Any]:
  """Nested `target` tree of numpy arrays (or sharded jax.Arrays), optionally cast."""
  return unflatten(arrays.materialize_tree(open_target(path), dtype, sharding))


def choose_chunk_shape(shape: tuple[int, ...], itemsize: int) -> list[int]:
  """T5X's rule: shrink the largest dimension to its next smaller divisor until the chunk holds at
  most 64 MiB, so chunks always tile the array exactly (no partial edge chunks)."""
  chunk = list(shape) or []
  limit = max(1, _MAX_CHUNK_BYTES // itemsize)
  while chunk and int(np.prod(chunk)) > limit:
    dim = int(np.argmax(chunk))
    n = chunk[dim]
    divisors = [d for d in range(n - 1, 0, -1) if n % d == 0]
    chunk[dim] = divisors[0] if divisors else 1
  return [max(1, c) for c in chunk]


def write(ckpt_dir: str, target: Mapping[str, Any], step: int = 0, inline: bool = False,
          compressor: str = "gzip") -> str:
  """Writes `target` as T5X would: msgpack `checkpoint` + one zarr v2 dir per array.

  `inline=True` stores arrays inside the msgpack instead (as T5X's test checkpoint does).
  Returns the path of the msgpack file.
  """
  os.makedirs(ckpt_dir, exist_ok=True)
  specs = {}
  for key, value in flatten(target).items():
    arr = np.asarray(value)
    if inline:
      specs[key] = arr
      continue
    name = "target." + key.replace("/", ".")
    comp = {"id": "gzip", "level": 1} if compressor == "gzip" else {"id": compressor}
    spec = {"driver": "zarr", "dtype": arr.dtype.name,
            "kvstore": {"driver": "file", "path": name},
            "metadata": {"compressor": comp, "shape": list(arr.shape),
                         "chunks": choose_chunk_shape(arr.shape, arr.dtype.itemsize)}}
    full = dict(spec, kvstore={"driver": "file", "path": os.path.join(os.path.abspath(ckpt_dir), name)})
    store = ts.open(full, create=True, delete_existing=True).result()
    store.write(arr).result()
    specs[key] = spec
  state = {"version": 3,
           "optimizer": {"target": unflatten(specs),
                         "state": {"step": np.asarray(step, np.int32), "param_states": {}}}}
  file = os.path.join(ckpt_dir, CHECKPOINT_FILE)
  with open(file, "wb") as f:
    f.write(flax.serialization.msgpack_serialize(state))
  return file
