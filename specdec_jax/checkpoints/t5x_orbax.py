"""Newer T5X checkpoints: the train state saved by Orbax (`checkpoint_<step>/state/`).

T5X's `OrbaxCheckpointManagerInterface` writes the train-state dict with
`PyTreeCheckpointHandler(use_ocdbt=True)`: `state/_METADATA` (tree metadata), `manifest.ocdbt` and
data files, one zarr array per leaf keyed by the `.`-joined path (`target.encoder.layers_0...`),
zarr v2 + zstd unless `use_zarr3`. We open the arrays with tensorstore's ocdbt kvstore directly
instead of orbax's restore: that reads only `target.*` (never the optimizer slots), needs no
abstract target tree, and returns lazy handles so sharded loads fetch only local slices.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np
import tensorstore as ts

from specdec_jax.checkpoints import arrays, storage
from specdec_jax.checkpoints.tree import CheckpointError, unflatten

METADATA_FILE = "_METADATA"
_SUFFIXES = {"/.zarray": "zarr", "/zarr.json": "zarr3"}


def state_dir(path: str) -> str:
  """`path` may be `checkpoint_N/` or its `state/` subdirectory (local or a URL)."""
  for candidate in (storage.join(path, "state"), path):
    if storage.exists(storage.join(candidate, METADATA_FILE)):
      return candidate if storage.is_url(candidate) else os.path.abspath(candidate)
  raise CheckpointError(f"no Orbax `state/{METADATA_FILE}` under {path}")


def is_t5x_orbax(path: str) -> bool:
  try:
    state_dir(path)
    return True
  except CheckpointError:
    return False


def _metadata(state: str) -> dict[str, Any]:
  return storage.read_json(storage.join(state, METADATA_FILE), "T5X Orbax metadata")


def _array_names(kvstore: ts.KvStore) -> dict[str, str]:
  """{array key: zarr driver} for every array stored in the kvstore."""
  names = {}
  for raw in kvstore.list().result():
    key = raw.decode()
    for suffix, driver in _SUFFIXES.items():
      if key.endswith(suffix):
        names[key[: -len(suffix)]] = driver
  return names


def open_target(path: str, prefix: str = "target") -> dict[str, Any]:
  """Flat {'encoder/layers_0/...': tensorstore handle} for the arrays under `prefix`."""
  state = state_dir(path)
  meta = _metadata(state)
  base = storage.kvstore_url(state)
  kv_spec = {"driver": "ocdbt", "base": base} if meta.get("use_ocdbt", True) else base
  kvstore = ts.KvStore.open(kv_spec).result()
  names = _array_names(kvstore)
  flat = {}
  for name, driver in sorted(names.items()):
    if not name.startswith(prefix + "."):
      continue
    key = name[len(prefix) + 1:].replace(".", "/")
    spec = {"driver": driver, "kvstore": dict(kv_spec, path=name + "/") if isinstance(kv_spec, dict)
            else base + name + "/"}
    try:
      flat[key] = ts.open(spec, open=True, read=True).result()
    except Exception as e:
      raise CheckpointError(f"cannot open {prefix}/{key} in {state}: {e}") from e
  if not flat:
    found = sorted(names)[:10]
    raise CheckpointError(f"no `{prefix}.*` arrays in the Orbax checkpoint {state}; "
                          f"arrays found: {found}")
  return flat


def load_target(path: str, dtype=None, sharding: arrays.ShardingSpec = None) -> dict[str, Any]:
  return unflatten(arrays.materialize_tree(open_target(path), dtype, sharding))


def write(ckpt_dir: str, target: Mapping[str, Any], step: int = 0,
          param_states: Mapping[str, Any] | None = None) -> str:
  """Saves `{'target': ..., 'state': {'step', 'param_states'}}` to `ckpt_dir/state` as T5X does."""
  import orbax.checkpoint as ocp
  state = {"target": dict(target), "state": {"step": np.asarray(step, np.int32)}}
  if param_states:
    state["state"]["param_states"] = dict(param_states)
  out = os.path.join(os.path.abspath(ckpt_dir), "state")
  with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True)) as ckptr:
    ckptr.save(out, args=ocp.args.PyTreeSave(state), force=True)
  return out
