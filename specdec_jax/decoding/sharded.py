"""Sharded decoding: the donated-state programs that run speculative and autoregressive decoding
on a mesh (`specdec_jax.sharding` builds the mesh, the rules and the placement).

Why two programs per batch: `_spec_prefill` builds the state (encoders, caches, token buffer, all
sharded) and `_spec_loop` receives that state DONATED, so the `lax.while_loop` updates the caches
and the token buffer in place instead of copying them into fresh buffers. Both use the core's own
pieces (`start.init_state`, `speculative.spec_iteration`, `adaptive.adaptive_iteration`,
`state.run_loop`), so the tokens equal `generate_speculative`'s and `generate_adaptive`'s
(tests/sharding/test_equivalence.py). The vocabulary is gathered before
sampling by `Model.extend` (its logits constraint leaves `vocab` unsharded).

Typical use::

  sm = shard_models(target, target_params, draft, draft_params,
                    mesh_config=MeshConfig(data=1, model_outer=4, model_inner=2), batch_size=8)
  result = sm.speculative(inputs_BxP, rng, gamma=4, sampling=SamplingConfig(), max_decode_len=32)

The run pipeline (`python -m specdec_jax.run` with a gin/mesh/*.gin module) places the target
and every draft once with `place_models` and builds one `ShardedModels` per draft from them.
Model-free drafts run on the mesh too (their tables replicated). Whatever runs on a mesh uses
XLA's own dot; this module adds no per-device kernels.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from specdec_jax import sharding as sh
from specdec_jax.decoding import adaptive as adaptive_lib
from specdec_jax.decoding import autoregressive as ar
from specdec_jax.decoding import speculative as spec
from specdec_jax.decoding import start
from specdec_jax.decoding import state as st
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.models.model import Model


# ---- the front door -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ShardedModels:
  """A target (and optionally a draft) with rules attached and params placed on one mesh."""

  mesh: Mesh
  target: Model
  target_params: Any
  draft: Optional[Model] = None
  draft_params: Any = None

  @property
  def data_rules(self) -> sh.Rules:
    return self.target.axis_rules

  def shard_inputs(self, inputs_BxP, *, process_local: bool = False) -> jax.Array:
    batch = np.shape(inputs_BxP)[0] * (jax.process_count() if process_local else 1)
    sh.validate(self.mesh, self.target, self.target.axis_rules, name="target", batch_size=batch)
    return sh.shard_batch(np.asarray(inputs_BxP, np.int32), self.mesh, self.data_rules,
                       process_local=process_local)

  def speculative(self, inputs_BxP, rng=None, *, gamma: int, sampling: SamplingConfig,
                  max_decode_len: int, rule: str = "tokenwise", cache_len: Optional[int] = None,
                  process_local: bool = False) -> st.DecodeResult:
    """Speculative decoding on the mesh: prefill, then the whole loop on device.

    Two programs per batch: `_spec_prefill` (encoders, caches, token buffer, all sharded) and
    `_spec_loop` (the `lax.while_loop`), which receives that state DONATED, so the loop updates
    the caches and the token buffer in place instead of copying them into fresh buffers.
    """
    state, kw = self._prefilled(inputs_BxP, rng, gamma, sampling, max_decode_len, rule,
                                cache_len, process_local)
    with jax.set_mesh(self.mesh):
      result, _ = _spec_loop(self.target, self.target_params, self.draft, self.draft_params,
                             state, **kw)
      return result

  def adaptive(self, inputs_BxP, rng=None, *, cfg: adaptive_lib.AdaptiveConfig,
               sampling: SamplingConfig, max_decode_len: int, rule: str = "tokenwise",
               cache_len: Optional[int] = None, process_local: bool = False
               ) -> tuple[st.DecodeResult, adaptive_lib.AdaptiveStats]:
    """`adaptive.generate_adaptive` on the mesh: the same two programs, adaptive iteration."""
    state, kw = self._prefilled(inputs_BxP, rng, cfg.gamma_max, sampling, max_decode_len, rule,
                                cache_len, process_local)
    with jax.set_mesh(self.mesh):
      (result, stats), _ = _spec_loop(self.target, self.target_params, self.draft,
                                      self.draft_params, state, adaptive=cfg, **kw)
      return result, stats

  def lower_speculative(self, inputs_BxP, rng=None, *, gamma: int, sampling: SamplingConfig,
                        max_decode_len: int, rule: str = "tokenwise",
                        cache_len: Optional[int] = None):
    """(prefilled state, the lowered loop program), for HLO inspection:
    `lowered.compile()(target_params, draft_params, state)` decodes, returning
    (result, final state); `state` is donated (deleted) by that call."""
    state, kw = self._prefilled(inputs_BxP, rng, gamma, sampling, max_decode_len, rule,
                                cache_len, False)
    with jax.set_mesh(self.mesh):
      lowered = _spec_loop.lower(self.target, self.target_params, self.draft, self.draft_params,
                                 state, **kw)
    return state, lowered

  def _prefilled(self, inputs_BxP, rng, gamma, sampling, max_decode_len, rule, cache_len,
                 process_local):
    """(the sharded state `_spec_loop` takes, its static arguments), after the front door."""
    if self.draft is None:
      raise ValueError("speculative decoding needs a draft; shard_models(..., draft=...)")
    inputs, rng = start.front_door(self.target, inputs_BxP, rng, draft=self.draft, gamma=gamma,
                                   sampling=sampling, max_decode_len=max_decode_len,
                                   cache_len=cache_len, rule=rule)
    inputs = self.shard_inputs(inputs, process_local=process_local)
    with jax.set_mesh(self.mesh):
      state = _spec_prefill(self.target, self.target_params, self.draft, self.draft_params,
                            inputs, sh.replicate_key(self.mesh, rng), gamma=gamma,
                            max_decode_len=max_decode_len, cache_len=cache_len)
    return state, dict(gamma=gamma, sampling=sampling, max_decode_len=max_decode_len, rule=rule)

  def autoregressive(self, inputs_BxP, rng=None, *, sampling: SamplingConfig,
                     max_decode_len: int, cache_len: Optional[int] = None,
                     process_local: bool = False) -> st.DecodeResult:
    """The target's autoregressive decode on the mesh (prefill, then a donated-state loop)."""
    inputs, rng = start.front_door(self.target, inputs_BxP, rng, sampling=sampling,
                                   max_decode_len=max_decode_len, cache_len=cache_len)
    inputs = self.shard_inputs(inputs, process_local=process_local)
    with jax.set_mesh(self.mesh):
      state = _ar_prefill(self.target, self.target_params, inputs,
                          sh.replicate_key(self.mesh, rng), max_decode_len=max_decode_len,
                          cache_len=cache_len)
      result, _ = _ar_loop(self.target, self.target_params, state, sampling=sampling,
                           max_decode_len=max_decode_len)
      return result


# ---- the sharded programs: prefill, then a loop over the donated state ---------------------------
def _constrain_state(state: st.DecodeState, model: Model) -> st.DecodeState:
  """The token buffer and per-example arrays (counters too) batch-sharded (`batch` -> data) by
  `model`'s rules; the caches carry their batch/heads constraints from `Model.prefill`/`extend`.
  Prefill and loop body use the same constraints, so the donated state and the loop's output have
  equal shardings, which is what lets XLA alias them."""
  with nn.logical_axis_rules(model.axis_rules or ()):
    def b(x):
      return nn.with_logical_constraint(x, ("batch",) + (None,) * (x.ndim - 1))
    c = state.counters
    counters = c.replace(**{f.name: b(getattr(c, f.name)) for f in dataclasses.fields(c)
                            if "_B" in f.name})
    return state.replace(tokens_BxL=b(state.tokens_BxL), num_B=b(state.num_B), counters=counters,
                         done_B=b(state.done_B), base_B=b(state.base_B),
                         draft_pending_B=(None if state.draft_pending_B is None
                                          else b(state.draft_pending_B)),
                         bonus_p_BxV=(None if state.bonus_p_BxV is None
                                      else b(state.bonus_p_BxV)))


@functools.partial(jax.jit, static_argnames=("target", "draft", "gamma", "max_decode_len",
                                             "cache_len"))
def _spec_prefill(target, target_params, draft, draft_params, inputs_BxP, rng, *, gamma: int,
                  max_decode_len: int, cache_len: Optional[int]) -> st.DecodeState:
  """What `speculative.speculative_decode` does before its loop, as its own program (the
  adaptive loop passes its gamma_max as gamma)."""
  return _constrain_state(start.init_state(
      target, target_params, inputs_BxP, rng, max_decode_len=max_decode_len, gamma=gamma,
      cache_len=cache_len, draft=draft, draft_params=draft_params), target)


@functools.partial(jax.jit, static_argnames=("target", "draft", "gamma", "sampling", "rule",
                                             "max_decode_len", "adaptive"),
                   donate_argnames=("state",))
def _spec_loop(target, target_params, draft, draft_params, state: st.DecodeState, *,
               gamma: int, sampling: SamplingConfig, max_decode_len: int, rule: str,
               adaptive: Optional[adaptive_lib.AdaptiveConfig] = None):
  """The speculative loop (the same iteration functions as one device) over a donated state.

  Returns (result, final state); with `adaptive` (gamma = its gamma_max) ((result, stats), final
  state). The final state is returned because an output of the donated input's shape and
  sharding is what lets XLA alias the two, so the while loop runs in the donated buffers.
  """
  def fixed(s, extra):
    return spec.spec_iteration(target, target_params, draft, draft_params, s, gamma=gamma,
                               sampling=sampling, rule=rule, max_decode_len=max_decode_len), extra

  def adapt(s, stats):
    return adaptive_lib.adaptive_iteration(target, target_params, draft, draft_params, s, stats,
                                           cfg=adaptive, sampling=sampling, rule=rule,
                                           max_decode_len=max_decode_len)

  if adaptive is None:
    final, _ = st.run_loop(state, None, fixed, lambda s: _constrain_state(s, target))
    return st.finish(final, max_decode_len), final
  final, stats = st.run_loop(state, adaptive_lib.AdaptiveStats.zeros(state.num_B.shape[0],
                                                                     adaptive),
                             adapt, lambda s: _constrain_state(s, target))
  return (st.finish(final, max_decode_len), stats), final


@functools.partial(jax.jit, static_argnames=("model", "max_decode_len", "cache_len"))
def _ar_prefill(model, params, inputs_BxP, rng, *, max_decode_len: int,
                cache_len: Optional[int]) -> st.DecodeState:
  return _constrain_state(start.init_state(model, params, inputs_BxP, rng,
                                           max_decode_len=max_decode_len, cache_len=cache_len),
                          model)


@functools.partial(jax.jit, static_argnames=("model", "sampling", "max_decode_len"),
                   donate_argnames=("state",))
def _ar_loop(model, params, state: st.DecodeState, *, sampling: SamplingConfig,
             max_decode_len: int) -> tuple[st.DecodeResult, st.DecodeState]:
  """`autoregressive.autoregressive_decode`'s loop (same step function) over a donated state."""
  def step(s, extra):
    return ar.ar_step(model, params, s, sampling, model.eos_id, max_decode_len), extra

  final, _ = st.run_loop(state, None, step, lambda s: _constrain_state(s, model))
  return st.finish(final, max_decode_len), final


def place_models(mesh: Mesh, mesh_config: sh.MeshConfig, target: Model, target_params,
                 drafts: dict, *, batch_size: Optional[int] = None):
  """(target, params, drafts) with rules attached and params placed on `mesh`.

  `drafts` maps a key to (Model, params) or to (model-free draft, tables): model drafts get the
  draft rules (fewer chips); a model-free draft's tables are replicated on every device (with
  several processes a table on one local device could not feed the global program). Everything
  is validated, on shapes only, before anything is placed: a bad mesh fails before any transfer
  or compile. `params` may be host (numpy) or device arrays; with several processes each must
  pass the same.
  """
  t_rules, d_rules = mesh_config.rules_for("target"), mesh_config.rules_for("draft")
  sh.validate(mesh, target, t_rules, name="target", batch_size=batch_size)
  for k, (d, _) in drafts.items():
    if isinstance(d, Model):
      sh.validate(mesh, d, d_rules, name=f"draft {k}", batch_size=batch_size)
  target, target_params = sh.shard_model(target, target_params, mesh, t_rules, name="target")
  replicated = NamedSharding(mesh, P())
  out = {}
  for k, (d, dp) in drafts.items():
    if isinstance(d, Model):
      out[k] = sh.shard_model(d, dp, mesh, d_rules, name="draft")
    else:
      out[k] = (d, sh.place(dp, jax.tree.map(lambda _: replicated, dp)))
  return target, target_params, out


def shard_models(target: Model, target_params, draft=None, draft_params=None,
                 mesh: Optional[Mesh] = None, *, mesh_config: sh.MeshConfig = sh.MeshConfig(),
                 batch_size: Optional[int] = None) -> ShardedModels:
  """A `ShardedModels` for one target and (optionally) one draft: `place_models` on `mesh` (made
  from `mesh_config` when not given)."""
  mesh = sh.make_mesh(mesh_config) if mesh is None else mesh
  drafts = {} if draft is None else {"draft": (draft, draft_params)}
  target, tp, drafts = place_models(mesh, mesh_config, target, target_params, drafts,
                                    batch_size=batch_size)
  return ShardedModels(mesh, target, tp, *drafts.get("draft", (None, None)))
