"""The project's own checkpoint format: Orbax arrays plus `model_config.json` beside them.

```
DIR/model_config.json   ModelConfig.to_json(): a run needs only DIR, never a preset name
DIR/params/             orbax PyTreeCheckpointHandler (OCDBT), the T5X `target` tree
```
Restoring goes through Orbax with per-array `ArrayRestoreArgs(sharding=...)`, so on a multi-host
mesh each host reads only the slices its devices own, and with a dtype so bf16 weights stored for
TPU come back as float32 on CPU (XLA:CPU bf16 matvecs are ~20x slower) without a host copy.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp

from specdec_jax import paths
from specdec_jax.checkpoints import arrays, storage
from specdec_jax.checkpoints.tree import CheckpointError, check_finite, flatten, to_layout, unflatten, validate
from specdec_jax.models.model_config import ModelConfig

CONFIG_FILE = "model_config.json"
PARAMS_DIR = "params"


def is_orbax_dir(path: str) -> bool:
  if storage.is_url(path):
    return storage.exists(storage.join(path, CONFIG_FILE))
  return (os.path.isfile(os.path.join(path, CONFIG_FILE))
          and os.path.isdir(os.path.join(path, PARAMS_DIR)))


def read_config(path: str) -> ModelConfig:
  file = storage.join(path, CONFIG_FILE)
  if not storage.exists(file):
    raise CheckpointError(f"no {CONFIG_FILE} in {path}")
  return config_from_dict(storage.read_json(file, "model config"), file)


def config_from_dict(raw: Any, source: str) -> ModelConfig:
  """`ModelConfig.from_dict` with errors that name `source` (the file the dict came from)."""
  if not isinstance(raw, dict):
    raise CheckpointError(f"{source}: expected a JSON object of ModelConfig fields, got "
                          f"{type(raw).__name__}")
  try:
    return ModelConfig.from_dict(raw)
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"{source} is not a valid model config: {e}") from None


def _abs(path: str) -> str:
  return path if storage.is_url(path) else os.path.abspath(path)


def _checkpointer() -> ocp.Checkpointer:
  return ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True))


def save(path: str, config: ModelConfig, params: Mapping[str, Any], dtype=None,
         force: bool = True) -> str:
  """Writes params (nested dict, numpy or jax arrays) and the config; validates shapes first.

  `dtype` casts floating arrays before writing (e.g. bfloat16 for a TPU serving copy); the config
  is stored as given (its `dtype` is the activation dtype, independent of the stored weights).
  """
  paths.check_writable(path, "a checkpoint")  # the shipped zoo is read-only
  flat = to_layout(flatten(params), config.scan_layers)
  validate(flat, config, source="params to save")
  check_finite(flat, f"the params to save to {path}")  # nothing written
  if dtype is not None:
    flat = {k: (v.astype(dtype) if np.issubdtype(np.dtype(v.dtype), np.floating)
                or np.dtype(v.dtype) == np.dtype(jax.numpy.bfloat16) else v)
            for k, v in flat.items()}
  path = _abs(path)
  if not storage.is_url(path):
    os.makedirs(path, exist_ok=True)
  with _checkpointer() as ckptr:
    ckptr.save(storage.join(path, PARAMS_DIR), args=ocp.args.PyTreeSave(unflatten(flat)),
               force=force)
  if jax.process_index() == 0:  # written last: its presence marks a complete checkpoint
    storage.write_text(storage.join(path, CONFIG_FILE), config.to_json())
  return path


def metadata(path: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """Flat {path: (shape, dtype)} of the stored arrays, read without loading any array."""
  with _checkpointer() as ckptr:
    tree = ckptr.metadata(storage.join(_abs(path), PARAMS_DIR)).item_metadata.tree
  return {k: (tuple(m.shape), np.dtype(m.dtype)) for k, m in flatten(tree).items()}


def restore(path: str, dtype=None, sharding: arrays.ShardingSpec = None,
            config: ModelConfig | None = None) -> tuple[ModelConfig, dict[str, Any]]:
  """-> (config, nested params): numpy arrays without `sharding`, else jax.Arrays laid out so.

  `sharding` is one `jax.sharding.Sharding`, a nested dict like the params, or a function
  `(path, shape) -> Sharding` (paths like 'decoder/layers_0/mlp/wo/kernel').
  """
  path = _abs(path)
  if not is_orbax_dir(path):
    found = sorted(os.listdir(path)) if os.path.isdir(path) else "nothing"
    raise CheckpointError(f"{path} is not a specdec_jax checkpoint (needs {CONFIG_FILE} and "
                          f"{PARAMS_DIR}/); found {found}")
  config = config or read_config(path)
  meta = metadata(path)
  validate({k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in meta.items()}, config,
           source=f"checkpoint {path}")
  restore_args = {}
  for key, (shape, stored) in meta.items():
    target = np.dtype(dtype) if dtype is not None else stored
    sh = arrays.sharding_for(sharding, key, shape)
    if sh is None:
      restore_args[key] = ocp.RestoreArgs(restore_type=np.ndarray, dtype=target)
    else:
      restore_args[key] = ocp.ArrayRestoreArgs(sharding=sh, global_shape=shape, dtype=target)
  with _checkpointer() as ckptr:
    params = ckptr.restore(storage.join(path, PARAMS_DIR),
                           args=ocp.args.PyTreeRestore(restore_args=unflatten(restore_args)))
  return config, params

