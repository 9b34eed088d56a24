"""Abstract models, parameters and inputs: shapes, dtypes and shardings, no weights.

Why: ahead-of-time compilation needs only `jax.ShapeDtypeStruct`s that carry the sharding each
array will have, and the paper configs name gs:// checkpoints this host cannot (and must not need
to) read. A model's config comes, in this order, from a preset name, from the checkpoint's own
metadata when it is local (the specdec `model_config.json`, a Hugging Face `config.json`, or a T5X
checkpoint's array shapes, read without the arrays), or, for a checkpoint that cannot be read here,
from the preset the gin files pair with it (`T5_1_1_XXL_CHECKPOINT` / `T5_1_1_XXL_PRESET`) or a
preset name in its path. The first two are `checkpoints.loader.model_config`, the half of the one
model loader that reads no weight. Parameters take the dtype the runner casts them to
(`checkpoints.loader.in_compute_dtype`) and the shardings `sharding.param_shardings` gives them.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from specdec_jax import sharding as sh
from specdec_jax.checkpoints import feature_draft_io as feature_ckpt
from specdec_jax.checkpoints import loader
from specdec_jax.models.model_config import PRESETS, ModelConfig
from specdec_jax.models.feature_draft_config import FeatureDraftConfig
from specdec_jax.models.model import Model

# The preset a gin macro pair gives a feature-level draft's checkpoint that cannot be read here
# (`*_FEATURE_CHECKPOINT` / `*_FEATURE_PRESET = 'feature_draft'`): the draft
# `FeatureDraftConfig.for_target` shapes for the run's target (EAGLE-3's one decoder layer of the
# target's width, heads and MLP, reading its low / middle / high states).
FEATURE_PRESET = "feature_draft"


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
  """A model's config and where it came from (reported beside every program)."""
  config: ModelConfig
  source: str
  preset: Optional[str] = None  # the preset the config came from, if any


def resolve_config(spec: str, *, presets: Mapping[str, str] = (), dtype: Optional[str] = None,
                   vocab_size: Optional[int] = None) -> ResolvedModel:
  """The config `spec` (a preset name or a checkpoint path) loads as, without reading weights.

  presets: checkpoint path -> preset name, for checkpoints that cannot be read here (gs://).
  vocab_size: the vocabulary a random-init preset is resized to (the runner's rule for presets
    decoding text); ignored for checkpoints.
  """
  if loader.is_preset(spec):
    return ResolvedModel(loader.preset_config(spec, dtype=dtype, vocab_size=vocab_size),
                         f"preset {spec}", spec)
  if loader.local_path(spec) is not None:
    return ResolvedModel(loader.model_config(spec, dtype=dtype), f"metadata of {spec}")
  preset = dict(presets).get(spec) or _preset_in_path(spec)
  if preset is None:
    raise ValueError(
        f"checkpoint {spec!r} cannot be read here and names no preset: bind a *_PRESET macro "
        f"beside its *_CHECKPOINT macro in gin, or pass a preset name ({', '.join(sorted(PRESETS))})")
  return ResolvedModel(loader.preset_config(preset, dtype=dtype),
                       f"preset {preset} (for {spec}, not read)", preset)


@dataclasses.dataclass(frozen=True)
class ResolvedFeature:
  """A feature-level draft's config and where it came from."""
  config: FeatureDraftConfig
  source: str


def resolve_feature(spec: str, target: ModelConfig, *, presets: Mapping[str, str] = (),
                    dtype: Optional[str] = None) -> Optional[ResolvedFeature]:
  """The feature-level draft `spec` names, without reading weights: a local export's
  `feature_draft_config.json`, or `FEATURE_PRESET` bound to an unreadable checkpoint (shaped for
  `target`); None when `spec` is no feature draft. `dtype`: the run's compute dtype."""
  path = loader.local_path(spec)
  if path is not None and feature_ckpt.is_feature_draft(path):
    with open(os.path.join(path, feature_ckpt.CONFIG_FILE), encoding="utf-8") as f:
      config = FeatureDraftConfig.from_json(f.read())
    source = f"{feature_ckpt.CONFIG_FILE} of {spec}"
  elif dict(presets).get(spec) == FEATURE_PRESET:
    config = FeatureDraftConfig.for_target(target)
    source = f"FeatureDraftConfig.for_target(the target) (for {spec}, not read)"
  else:
    return None
  return ResolvedFeature(config.replace(dtype=dtype) if dtype else config, source)


def _preset_in_path(spec: str) -> Optional[str]:
  parts = spec.replace("\\", "/").rstrip("/").split("/")
  found = [p for p in parts if p in PRESETS]
  return found[-1] if found else None


def abstract_params(model: Model, mesh: Mesh, dtype: Optional[str] = None):
  """ShapeDtypeStructs of the model's params with their mesh shardings; floating leaves in
  `dtype` (None: float32, as `Model.init` and the trainer keep them)."""
  shardings = sh.param_shardings(model, mesh)
  target = jnp.dtype(dtype or jnp.float32)

  def one(x, s):
    dt = target if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype
    return jax.ShapeDtypeStruct(x.shape, dt, sharding=s)
  return jax.tree.map(one, model.param_shapes(), shardings)


def abstract_tables(tables: Mapping[str, Any], mesh: Mesh):
  """A model-free draft's tables, replicated on every chip as `sharded.place_models` puts them."""
  rep = NamedSharding(mesh, P())
  return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=rep) for k, v in tables.items()}


def abstract_batch(shape: tuple[int, ...], dtype, mesh: Mesh, rules: sh.Rules):
  """A [B, ...] array batch-sharded over the axes `batch` maps to (`sharding.shard_batch`)."""
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype),
                              sharding=sh.batch_sharding(mesh, rules, len(shape)))


def abstract_key(mesh: Mesh):
  """A PRNG key replicated on every chip (`sharding.replicate_key`)."""
  return jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=NamedSharding(mesh, P()))


def abstract_scalar(dtype, mesh: Mesh):
  return jax.ShapeDtypeStruct((), jnp.dtype(dtype), sharding=NamedSharding(mesh, P()))


def like_outputs(compiled) -> Any:
  """ShapeDtypeStructs of a compiled program's outputs, with the shardings it produces them in:
  what the next program (the loop after its prefill) receives."""
  shapes = compiled.out_info
  return jax.tree.map(lambda s, sh_: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh_),
                      shapes, compiled.output_shardings)
