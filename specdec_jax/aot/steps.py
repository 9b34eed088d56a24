"""The roofline's compiled steps: one target step, the verify calls and one step per model draft.

Why compile them at all when the roofline (`aot.roofline`) is computed from the models' shapes:
the compiled programs say what a chip actually holds (`memory_analysis`: the arguments a step is
passed, its total, whether it fits) and what XLA counts (`cost_analysis`), and the roofline prints
both beside its own arithmetic as a cross-check. Each step is `Model.extend`, as the loop calls it,
on a cache laid out as the prefill leaves it, on the configured mesh.

Each program's record carries the shapes the roofline needs (batch, prompt and cache lengths, the
chips the model is split over, its config), so a committed aot.json is enough to recompute it.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping

import jax
import numpy as np

from specdec_jax.aot import abstract
from specdec_jax.aot.programs import Program
from specdec_jax.aot.roofline import DRAFT_STEP, TARGET_STEP, VERIFY


@functools.partial(jax.jit, static_argnames=("model",))
def _extend(model, params, cache, tokens_BxT):
  """One `Model.extend` call as the loop makes it (draft step: T = 1; verify: T = gamma + 1)."""
  return model.extend(params, cache, tokens_BxT)


def abstract_cache(model, params, batch: int, prompt_len: int, cache_len: int, mesh):
  """The cache `model.prefill` leaves, as sharded ShapeDtypeStructs, without compiling a prefill:
  shapes from `jax.eval_shape`, shardings from the model's rules on the logical axes
  `Model.prefill` constrains each leaf to (`models.model.CACHE_AXES`: K [B, H, K, S] and V
  [B, H, S, K] by batch and heads, the per-example index and encoder mask by batch)."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  from jax.sharding import PartitionSpec as P  # pylint: disable=import-outside-toplevel
  from specdec_jax.models.model import CACHE_AXES  # pylint: disable=import-outside-toplevel
  inputs = abstract.abstract_batch((batch, prompt_len), np.int32, mesh, model.axis_rules)
  shapes = jax.eval_shape(lambda p, x: model.prefill(p, x, cache_len), params, inputs)

  def one(path, x):
    axes = CACHE_AXES.get(getattr(path[-1], "name", None), (None,) * x.ndim)
    spec = P(*(("layers",) * (x.ndim - len(axes)) + axes))
    sharding = nn.logical_to_mesh_sharding(spec, mesh, list(model.axis_rules))
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  return jax.tree_util.tree_map_with_path(one, shapes)


def model_chips(model, mesh) -> int:
  """The chips a model's heads (and with them its weights and caches) are split over: the product
  of the mesh axes its 'heads' rule names (1 unsharded)."""
  axes = dict(model.axis_rules or ()).get("heads") or ()
  axes = (axes,) if isinstance(axes, str) else tuple(axes)
  return math.prod(int(mesh.shape[a]) for a in axes)


def step_programs(setup, drafts: Mapping[str, tuple], *, gamma: int, max_tokens: int, mesh
                  ) -> list[Program]:
  """target_step (T = 1), verify[T] for T = 2..max_tokens and draft_step per model draft, each
  an `extend` on the cache its prefill leaves (slots for `max_decode_len` and gamma's slack).

  setup: the run's `programs.DecodeSetup` (target, its abstract params, batch and lengths).
  drafts: name -> (draft Model, its abstract params).
  """
  from specdec_jax.decoding import start  # pylint: disable=import-outside-toplevel
  batch, prompt_len, max_decode_len = setup.batch, setup.prompt_len, setup.max_decode_len

  def cache_len(model):
    return start.cache_len_needed(model, prompt_len, max_decode_len, gamma)

  def program(name, kind, model, params, t, **extra):
    def call(_):
      cache = abstract_cache(model, params, batch, prompt_len, cache_len(model), mesh)
      tokens = abstract.abstract_batch((batch, t), np.int32, mesh, model.axis_rules)
      return _extend, (model, params, cache, tokens), {}
    info = dict(tokens=t, batch=batch, prompt_len=prompt_len, cache_len=cache_len(model),
                model_chips=model_chips(model, mesh), model_config=model.config.to_dict(), **extra)
    return Program(name, kind, call, info=info)

  target, target_params = setup.target, setup.target_params
  progs = [program(f"{TARGET_STEP}[T=1]", TARGET_STEP, target, target_params, 1)]
  progs += [program(f"{VERIFY}[T={t}]", VERIFY, target, target_params, t)
            for t in range(2, max_tokens + 1)]
  progs += [program(f"{DRAFT_STEP}[draft={name}]", DRAFT_STEP, draft, dparams, 1, draft=name)
            for name, (draft, dparams) in drafts.items()]
  return progs
