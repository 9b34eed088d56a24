"""Every gin configurable of the project, registered in one place, and the configs built from it.

Why a module of its own: the entry points (`run`, `train`, `distill_data`, `check_exactness`,
`aot`) read overlapping gin files (a mesh module binds `RunConfig.mesh = @MeshConfig()` for runs
and training alike; a distillation-data recipe includes a training data mixture of `TaskSpec`s;
`aot` compiles either a run or a training job), so each needs every configurable those files may
name. Registering them here, idempotently, lets each entry point call one function instead of
importing another entry point for its registrations (an entry point imports no other one). Library
code below (models, decoding, runner, training, metrics) imports no gin; its config classes are
plain dataclasses that only this module hands to gin.
"""
from __future__ import annotations

from collections.abc import Sequence

import gin

from specdec_jax import gin_utils
from specdec_jax.decoding.adaptive import AdaptiveConfig  # GAMMA = 'adaptive'
from specdec_jax.decoding.speculative import Chain  # GAMMA = @Chain() (runner/schedule.py)
from specdec_jax.decoding.tree.dynamic import DynamicTreeScheme  # GAMMA = 'tree', dynamic
from specdec_jax.decoding.tree.scheme import TreeScheme  # GAMMA = 'tree'
from specdec_jax.decoding.tree.lookup_scheme import LookupTreeScheme  # GAMMA = 'tree', lookup
from specdec_jax.runner.tree_choice import positional_tree  # RunConfig.tree_candidates
from specdec_jax.runner.run_config import RunConfig
from specdec_jax.runner.schedule import (  # GAMMA = @Auto(), @FeatureChain(); RunConfig.feature
    Auto, FeatureChain, FeatureOptions, same)
from specdec_jax.sharding import MeshConfig  # gin/mesh/*.gin: RunConfig.mesh = @MeshConfig()
from specdec_jax.training.train_config import TrainConfig
from specdec_jax.training.data import TaskSpec
from specdec_jax.training.distill_data import DistillDataConfig
from specdec_jax.training.feature_trainer import FeatureTrainConfig

MODULE = "specdec"
CLASSES = (RunConfig, AdaptiveConfig, TreeScheme, DynamicTreeScheme, MeshConfig, TrainConfig,
           TaskSpec, DistillDataConfig, FeatureTrainConfig, positional_tree, LookupTreeScheme,
           Chain, Auto, FeatureChain, FeatureOptions)


def register() -> None:
  """Registers every configurable with gin, under its class name, once per process (an entry
  point may also run as __main__, and tests import several)."""
  for cls in CLASSES:
    try:
      gin.get_configurable(cls.__name__)
    except ValueError:
      gin.external_configurable(cls, name=cls.__name__, module=MODULE)


def parse(gin_files: Sequence[str], gin_bindings: Sequence[str] = (),
          search_paths: Sequence[str] = ()) -> None:
  """Registers, clears gin's config, then parses the files and bindings strictly."""
  register()
  gin.clear_config()
  gin_utils.parse_gin_flags(gin_files, gin_bindings, search_paths)


def is_training_job() -> bool:
  """Whether the parsed config describes a training job (it binds `TrainConfig.model`)."""
  return _binding("TrainConfig.model")[0]


def is_feature_training_job() -> bool:
  """Whether the parsed config trains a feature-level draft (it binds `FeatureTrainConfig.target`)."""
  return _binding("FeatureTrainConfig.target")[0]


def feature_train_config() -> FeatureTrainConfig:
  """The parsed `FeatureTrainConfig` (`training.feature_trainer`)."""
  register()
  return gin.get_configurable("FeatureTrainConfig")()


def _binding(name: str):
  """(bound?, value) of a `Configurable.param` binding."""
  try:
    return True, gin.query_parameter(name)
  except ValueError:
    return False, None


def run_config() -> RunConfig:
  """The `RunConfig` the parsed gin config describes (validated). A field that GAMMA's scheme
  object sets (`@Auto()`, `@FeatureChain()`, a tree, an AdaptiveConfig) and the config also
  binds to another value is refused, even where that binding is the field's default
  (`runner.schedule.lower` sees only values, not which were bound)."""
  register()
  cfg = gin.get_configurable("RunConfig")()
  for field in ("tree", "adaptive", "gamma_max"):  # the shorthands default to None: seen as set
    bound, value = _binding(f"RunConfig.{field}")
    if bound and _plain(value) and not same(value, getattr(cfg, field)):
      raise ValueError(f"RunConfig.{field} is bound to {value!r} in the gin config, but GAMMA's "
                       f"scheme gives it {getattr(cfg, field)!r}: bind it in one place")
  return cfg


def _plain(value) -> bool:
  """A literal gin value (not a reference to a configurable or a macro)."""
  if isinstance(value, (list, tuple)):
    return all(_plain(v) for v in value)
  return value is None or isinstance(value, (bool, int, float, str))


def train_config() -> TrainConfig:
  """The parsed `TrainConfig`; a mesh module's MeshConfig is its mesh unless it binds its own."""
  register()
  kwargs = {}
  if not _binding("TrainConfig.mesh")[0] and _binding("RunConfig.mesh")[1] is not None:
    kwargs["mesh"] = gin.get_configurable("MeshConfig")()
  return gin.get_configurable("TrainConfig")(**kwargs)


def distill_data_config() -> DistillDataConfig:
  """The parsed `DistillDataConfig` (the distillation-data job's settings)."""
  register()
  return gin.get_configurable("DistillDataConfig")()
