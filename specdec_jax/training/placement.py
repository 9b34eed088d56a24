"""Where the trainer's arrays go: the default device, or their shards on the run's mesh.

Why a class of its own: the train loop and the evaluator place params, optimizer state and
batches the same way, and neither should branch on "sharded or not" at every call.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax.models.model import Model
from specdec_jax.training import sharded as sharded_lib


class Placement:
  """Unsharded (`tm is None`: the default device) or sharded over `tm`'s mesh."""

  def __init__(self, tm: sharded_lib.TrainMesh | None):
    self.tm = tm

  def params(self, model: Model, params):
    if self.tm is None:
      return jax.tree.map(jnp.asarray, params)
    return self.tm.place(params, self.tm.param_shardings(model))

  def opt_state(self, optimizer: optax.GradientTransformation, params):
    if self.tm is None:
      return optimizer.init(params)
    shardings = self.tm.opt_state_shardings(optimizer, params,
                                            jax.tree.map(lambda x: x.sharding, params))
    return jax.jit(optimizer.init, out_shardings=shardings)(params)

  def scalar(self, value, dtype):
    value = np.asarray(value, dtype)
    return jnp.asarray(value) if self.tm is None else self.tm.replicate(value)

  def batch(self, batch_np: dict[str, np.ndarray], split_rows: bool = True):
    if self.tm is None:
      return jax.tree.map(jnp.asarray, batch_np)
    return self.tm.batch(batch_np) if split_rows else self.tm.replicate(batch_np)
