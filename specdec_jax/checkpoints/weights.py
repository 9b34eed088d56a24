"""One front door for weights: `load_checkpoint(path_or_preset) -> (config, params)`.

Runs and gin files name a checkpoint by path only; this module recognises which of the four
on-disk formats it is (or a preset name for random-init models), reads it into the T5X parameter
tree, puts it in the layout the config asks for (per-layer or scanned) and validates it against the
config before any model code runs, so a wrong checkpoint fails with the T5X path of the offending
array rather than deep inside a jitted einsum.

The weight readers, not the model loader: `checkpoints/loader.py` turns a name into a `Model` and
its params and calls this module for the weights.
"""
from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from specdec_jax.checkpoints import arrays, hf, orbax_io, storage, t5x_legacy, t5x_orbax
from specdec_jax.checkpoints.tree import (CheckpointError, check_vocab_compatible, flatten,
                                          infer_config, to_layout, unflatten, validate)
from specdec_jax.models.model_config import PRESETS, ModelConfig, get_preset

__all__ = ["load_checkpoint", "detect_format", "check_vocab_compatible", "FORMATS"]

FORMATS = ("specdec", "t5x", "t5x_orbax", "hf", "preset")


def detect_format(path: str) -> str:
  """Names the format of `path`; raises CheckpointError listing what was found otherwise."""
  if storage.is_url(path):  # gs://...: only the formats whose marker file can be probed
    for fmt, probe in (("specdec", orbax_io.is_orbax_dir), ("t5x_orbax", t5x_orbax.is_t5x_orbax),
                       ("t5x", t5x_legacy.is_t5x_legacy)):
      if probe(path):
        return fmt
    raise CheckpointError(f"no {orbax_io.CONFIG_FILE}, state/_METADATA or T5X `checkpoint` "
                          f"msgpack at {path} (HF checkpoints must be local directories)")
  if not os.path.exists(path):
    if path in PRESETS:
      return "preset"
    raise CheckpointError(f"checkpoint {path!r} does not exist and is not a preset "
                          f"(presets: {sorted(PRESETS)})")
  if os.path.isdir(path) and orbax_io.is_orbax_dir(path):
    return "specdec"
  if t5x_orbax.is_t5x_orbax(path):
    return "t5x_orbax"
  if t5x_legacy.is_t5x_legacy(path):
    return "t5x"
  if hf.is_hf(path):
    return "hf"
  found = sorted(os.listdir(path))[:30] if os.path.isdir(path) else [os.path.basename(path)]
  raise CheckpointError(
      f"unknown checkpoint format at {path}: found {found}. Expected one of: a specdec_jax dir "
      f"({orbax_io.CONFIG_FILE} + {orbax_io.PARAMS_DIR}/), a T5X legacy dir (msgpack "
      f"`checkpoint` with version/optimizer), a T5X Orbax dir (state/_METADATA), or an HF dir "
      f"({hf.CONFIG_FILE} + one of {list(hf.WEIGHT_FILES)})")


def _resolve_config(config: ModelConfig | None, preset: str | None) -> ModelConfig | None:
  if config is not None and preset is not None:
    raise ValueError("pass either config or preset, not both")
  return get_preset(preset) if preset is not None else config


def open_flat(path: str, fmt: str | None = None, config: ModelConfig | None = None
              ) -> tuple[ModelConfig, dict[str, Any]]:
  """(config, flat tree of unread leaves) for the T5X and HF formats."""
  fmt = fmt or detect_format(path)
  if fmt == "hf":
    hf_config, flat = hf.load(path)
    return config or hf_config, flat
  if fmt == "t5x":
    flat = t5x_legacy.open_target(path)
  elif fmt == "t5x_orbax":
    flat = t5x_orbax.open_target(path)
  else:
    raise CheckpointError(f"open_flat does not read format {fmt!r}")
  return config or infer_config(flat), flat


def load_checkpoint(path_or_preset: str, dtype=None, sharding: arrays.ShardingSpec = None, *,
                    config: ModelConfig | None = None, preset: str | None = None,
                    scan_layers: bool | None = None, seed: int = 0, progress: bool = False
                    ) -> tuple[ModelConfig, dict[str, Any]]:
  """Loads weights from any supported format as `(ModelConfig, nested params)`.

  Args:
    path_or_preset: a checkpoint path (format detected), or a preset name for random init.
    dtype: cast floating weights on load (e.g. float32 on CPU for bf16 checkpoints); None keeps them.
    sharding: None (host numpy arrays), one Sharding, a params-shaped dict of them, or
      `fn(path, shape) -> Sharding`; each host then reads only its devices' slices.
    config / preset: the model config for formats that store none (T5X); inferred from the array
      shapes when both are None. For formats that store one, a given config is checked against it.
    scan_layers: override the layout (stacked `layers` vs per-layer `layers_{i}`).
    seed: random-init seed when `path_or_preset` is a preset.
  """
  config = _resolve_config(config, preset)
  fmt = detect_format(path_or_preset)
  if fmt == "preset":
    cfg = config or get_preset(path_or_preset)
    cfg = cfg if scan_layers is None else cfg.replace(scan_layers=scan_layers)
    return cfg, _random_init(cfg, seed, dtype, sharding)
  if fmt == "specdec":
    stored = orbax_io.read_config(path_or_preset)
    if config is not None and not same_architecture(config, stored):
      raise CheckpointError(f"config passed for {path_or_preset} differs from its "
                            f"{orbax_io.CONFIG_FILE}:\n given  {config}\n stored {stored}")
    cfg = (config or stored)
    cfg = cfg.replace(scan_layers=stored.scan_layers if scan_layers is None else scan_layers)
    if cfg.scan_layers == stored.scan_layers:
      return orbax_io.restore(path_or_preset, dtype, sharding, config=cfg)
    _, params = orbax_io.restore(path_or_preset, dtype, None, config=stored)
    flat = to_layout(flatten(params), cfg.scan_layers)
  else:
    cfg, flat = open_flat(path_or_preset, fmt, config)
    if scan_layers is not None:
      cfg = cfg.replace(scan_layers=scan_layers)
    if cfg.scan_layers:  # stacking needs whole arrays: read to host first
      flat = to_layout(arrays.materialize_tree(flat, dtype, None, progress), True)
    validate(flat, cfg, source=f"{fmt} checkpoint {path_or_preset}")
  return cfg, unflatten(arrays.materialize_tree(flat, dtype, sharding, progress))


def same_architecture(a: ModelConfig, b: ModelConfig) -> bool:
  """Equal up to run-time choices (activation dtype, layer layout, dropout)."""
  return a.replace(dtype=b.dtype, scan_layers=b.scan_layers, dropout_rate=b.dropout_rate) == b


def _random_init(cfg: ModelConfig, seed: int, dtype, sharding) -> dict[str, Any]:
  import jax
  # The model initialises unrolled layers; a scanned layout is stacked afterwards.
  params = jax.device_get(_jitted_init(cfg.replace(scan_layers=False))(jax.random.key(seed)))
  flat = to_layout({k: np.asarray(v) for k, v in flatten(params).items()}, cfg.scan_layers)
  return unflatten(arrays.materialize_tree(flat, dtype, sharding))


@functools.lru_cache(maxsize=8)
def _jitted_init(cfg: ModelConfig):
  """One compiled init per config (eager flax init is many times slower than compiling it)."""
  import jax
  from specdec_jax.models.model import build_model
  return jax.jit(build_model(cfg).init)
