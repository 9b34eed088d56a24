"""Sharded training: the target's logical-axis rules on one mesh, every state array in shards.

Why: fine-tuning T5 v1.1 XXL (11B) holds float32 params, gradients and optimizer state that fit no
single TPU v4 chip (32 GB), so training uses the decoding mesh (`sharding.MeshConfig`, bound by
gin/mesh/*.gin) and the *target* rules (t5x's 1-D partitioning: heads, mlp, vocab and joined_kv over
the model axes, the batch over `data`). A model trained here is laid out exactly as it is served.

- Everything is checked on shapes before anything is compiled (`sharding.validate`): a mesh axis
  that does not divide the model or the (micro)batch raises a ValueError naming both sizes.
- Optimizer-state leaves get the sharding of the parameter they belong to; Adafactor's factored
  statistics (a row or column vector of a kernel) keep the sharding of the axes they still have.
  So no device ever holds a full copy of a large array (AdamW's moments included).
- Arrays are placed with `sharding.place` (works with several processes: each keeps its shards),
  so every host may compute the same full batch from (seed, step) and keep only its rows.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from specdec_jax import sharding as sh
from specdec_jax.models.model import Model


@dataclasses.dataclass(frozen=True)
class TrainMesh:
  """The mesh a run trains on and the logical-axis rules of the trained model (and its teacher)."""
  mesh: Mesh
  rules: sh.Rules

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, P())

  def param_shardings(self, model: Model):
    return sh.param_shardings(model, self.mesh, self.rules)

  def place(self, tree, shardings):
    return sh.place(tree, shardings)

  def replicate(self, tree):
    """Host values (scalars, eval batches of any size) on every device of the mesh."""
    return sh.place(tree, jax.tree.map(lambda _: self.replicated, tree))

  def batch(self, batch_np: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """A training batch with its rows split over the data axis (the same full batch everywhere)."""
    return {k: sh.shard_batch(v, self.mesh, self.rules) for k, v in batch_np.items()}

  def opt_state_shardings(self, optimizer: optax.GradientTransformation, params, param_sh):
    """Per optimizer-state leaf: its parameter's sharding, restricted to the axes it kept."""
    abstract = jax.eval_shape(optimizer.init, params)
    return optax.tree_utils.tree_map_params(
        optimizer, lambda leaf, p, s: self._like_param(leaf.shape, p.shape, s), abstract, params,
        param_sh, transform_non_params=lambda _: self.replicated)

  def _like_param(self, shape, param_shape, param_sharding: NamedSharding) -> NamedSharding:
    spec = tuple(param_sharding.spec) + (None,) * (len(param_shape) - len(param_sharding.spec))
    if tuple(shape) == tuple(param_shape):
      return param_sharding
    for i in range(len(param_shape)):  # factored statistics: the parameter minus one axis
      if tuple(shape) == tuple(param_shape[:i]) + tuple(param_shape[i + 1:]):
        return NamedSharding(self.mesh, P(*(spec[:i] + spec[i + 1:])))
    return self.replicated  # e.g. Adafactor's (1,)-shaped placeholders


def setup(config: sh.MeshConfig, model: Model, *, batch_size: int, name: str = "model",
          teacher: Model | None = None) -> tuple[TrainMesh, Model, Model | None]:
  """(mesh, model, teacher) with the target rules attached; validated before any compile.

  `batch_size` is the per-microbatch batch, the array the data axis actually splits.
  """
  mesh = sh.make_mesh(config)
  rules = config.rules_for("target")
  sh.validate(mesh, model, rules, name=name, batch_size=batch_size)
  model = sh.with_rules(model, rules)
  if teacher is not None:
    sh.validate(mesh, teacher, rules, name="teacher", batch_size=batch_size)
    teacher = sh.with_rules(teacher, rules)
  return TrainMesh(mesh, rules), model, teacher


def state_shardings(state):
  """The sharding of every array in a placed train state (the train step keeps them)."""
  return jax.tree.map(lambda x: x.sharding, state)
