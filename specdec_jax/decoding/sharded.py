"""Sharded decoding: the donated-state programs that run speculative and autoregressive decoding
on a mesh (`specdec_jax.sharding` builds the mesh, the rules and the placement).

Why two programs per batch: `_spec_prefill` builds the state (encoders, caches, token buffer, all
sharded) and `_spec_loop` receives that state DONATED, so the `lax.while_loop` updates the caches
and the token buffer in place instead of copying them into fresh buffers. Both use the core's own
pieces (`autoregressive.prepare`, `speculative.spec_iteration`), so the tokens equal
`generate_speculative`'s (tests/sharding/test_equivalence.py). The vocabulary is gathered before
sampling by `Model.extend` (its logits constraint leaves `vocab` unsharded).

Typical use::

  sm = shard_models(target, target_params, draft, draft_params,
                    mesh_config=MeshConfig(data=1, model_outer=4, model_inner=2), batch_size=8)
  result = sm.speculative(inputs_BxP, rng, gamma=4, sampling=SamplingConfig(), max_decode_len=32)

The run pipeline (`python -m specdec_jax.run` with a gin/mesh/*.gin module) builds the same
`ShardedModels` from `sharding.shard_for_run`'s placed models, one per draft.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from specdec_jax import sharding as sh
from specdec_jax.decoding import acceptance as acc
from specdec_jax.decoding import autoregressive as ar
from specdec_jax.decoding import speculative as spec
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
    """(the sharded state `_spec_loop` takes, its static arguments), after `_check`."""
    inputs, rng, kw = self._check(inputs_BxP, rng, gamma, sampling, max_decode_len, rule,
                                  cache_len, process_local)
    with jax.set_mesh(self.mesh):
      state = _spec_prefill(self.target, self.target_params, self.draft, self.draft_params,
                            inputs, rng, gamma=gamma, max_decode_len=max_decode_len,
                            cache_len=cache_len)
    return state, kw

  def _check(self, inputs_BxP, rng, gamma, sampling, max_decode_len, rule, cache_len,
             process_local):
    """Shape checks (before any compile), then the inputs and key placed on the mesh."""
    if self.draft is None:
      raise ValueError("speculative decoding needs a draft; shard_models(..., draft=...)")
    plen = np.shape(inputs_BxP)[1]
    st.check_decode_args(target_vocab=self.target.vocab_size, draft_vocab=self.draft.vocab_size,
                         gamma=gamma, sampling=sampling, max_decode_len=max_decode_len,
                         prompt_len=plen, cache_len=cache_len,
                         needed_cache_len=ar.cache_len_needed(self.target, plen, max_decode_len,
                                                              gamma + 2))
    acc.get_rule(rule)
    inputs = self.shard_inputs(inputs_BxP, process_local=process_local)
    kw = dict(gamma=gamma, sampling=sampling, max_decode_len=max_decode_len, rule=rule)
    return inputs, sh.replicate_key(self.mesh, rng), kw

  def autoregressive(self, inputs_BxP, rng=None, *, sampling: SamplingConfig,
                     max_decode_len: int, cache_len: Optional[int] = None,
                     process_local: bool = False) -> st.DecodeResult:
    """The target's autoregressive decode on the mesh (prefill, then a donated-state loop)."""
    plen = np.shape(inputs_BxP)[1]
    st.check_decode_args(target_vocab=self.target.vocab_size, draft_vocab=None, gamma=None,
                         sampling=sampling, max_decode_len=max_decode_len, prompt_len=plen,
                         cache_len=cache_len,
                         needed_cache_len=ar.cache_len_needed(self.target, plen, max_decode_len,
                                                              2))
    inputs = self.shard_inputs(inputs_BxP, process_local=process_local)
    rng = sh.replicate_key(self.mesh, rng)
    with jax.set_mesh(self.mesh):
      state = _ar_prefill(self.target, self.target_params, inputs, rng,
                          max_decode_len=max_decode_len, cache_len=cache_len)
      result, _ = _ar_loop(self.target, self.target_params, state, sampling=sampling,
                           max_decode_len=max_decode_len)
      return result


# ---- the sharded programs: prefill, then a loop over the donated state ---------------------------
def _constrain_state(state: st.DecodeState, model: Model) -> st.DecodeState:
  """The token buffer and per-example vectors (counters too) batch-sharded (`batch` -> data) by
  `model`'s rules; the caches carry their batch/heads constraints from `Model.prefill`/`extend`.
  Prefill and loop body use the same constraints, so the donated state and the loop's output have
  equal shardings, which is what lets XLA alias them."""
  with nn.logical_axis_rules(model.axis_rules or ()):
    def b(x):
      return nn.with_logical_constraint(x, ("batch",) + (None,) * (x.ndim - 1))
    c = state.counters
    counters = c.replace(**{f.name: b(getattr(c, f.name)) for f in dataclasses.fields(c)
                            if f.name.endswith("_B")})
    return state.replace(tokens_BxL=b(state.tokens_BxL), num_B=b(state.num_B), counters=counters,
                         done_B=b(state.done_B), base_B=b(state.base_B),
                         draft_pending_B=(None if state.draft_pending_B is None
                                          else b(state.draft_pending_B)))


@functools.partial(jax.jit, static_argnames=("target", "draft", "gamma", "max_decode_len",
                                             "cache_len"))
def _spec_prefill(target, target_params, draft, draft_params, inputs_BxP, rng, *, gamma: int,
                  max_decode_len: int, cache_len: Optional[int]) -> st.DecodeState:
  """What `speculative.speculative_decode` does before its loop, as its own program."""
  slack = gamma + 2
  state = ar.prepare(target, target_params, inputs_BxP, max_decode_len=max_decode_len,
                     slack=slack, cache_len=cache_len, rng=rng, gamma=gamma)
  draft_cache = draft.prefill(draft_params, inputs_BxP, cache_len or ar.cache_len_needed(
      draft, inputs_BxP.shape[1], max_decode_len, slack))
  state = state.replace(draft_cache=draft_cache, draft_pending_B=jnp.zeros_like(state.done_B))
  return _constrain_state(state, target)


@functools.partial(jax.jit, static_argnames=("target", "draft", "gamma", "sampling", "rule",
                                             "max_decode_len"), donate_argnames=("state",))
def _spec_loop(target, target_params, draft, draft_params, state: st.DecodeState, *,
               gamma: int, sampling: SamplingConfig, max_decode_len: int, rule: str
               ) -> tuple[st.DecodeResult, st.DecodeState]:
  """`speculative.speculative_decode`'s loop (same iteration function) over a donated state.

  Returns the final state too: an output of the donated input's shape and sharding is what lets
  XLA alias the two, so the while loop runs in the donated buffers (no copy of the caches).
  """
  def cond(s):
    return jnp.any(~s.done_B)

  def body(s):
    return _constrain_state(spec.spec_iteration(
        target, target_params, draft, draft_params, s, gamma=gamma, sampling=sampling,
        rule=rule, max_decode_len=max_decode_len), target)

  final = jax.lax.while_loop(cond, body, state)
  return st.finish(final, max_decode_len), final


@functools.partial(jax.jit, static_argnames=("model", "max_decode_len", "cache_len"))
def _ar_prefill(model, params, inputs_BxP, rng, *, max_decode_len: int,
                cache_len: Optional[int]) -> st.DecodeState:
  state = ar.prepare(model, params, inputs_BxP, max_decode_len=max_decode_len, slack=2,
                     cache_len=cache_len, rng=rng)
  return _constrain_state(state, model)


@functools.partial(jax.jit, static_argnames=("model", "sampling", "max_decode_len"),
                   donate_argnames=("state",))
def _ar_loop(model, params, state: st.DecodeState, *, sampling: SamplingConfig,
             max_decode_len: int) -> tuple[st.DecodeResult, st.DecodeState]:
  """`autoregressive.autoregressive_decode`'s loop (same step function) over a donated state."""
  def cond(s):
    return jnp.any(~s.done_B)

  def body(s):
    return _constrain_state(ar.ar_step(model, params, s, sampling, model.config.eos_id,
                                       max_decode_len), model)

  final = jax.lax.while_loop(cond, body, state)
  return st.finish(final, max_decode_len), final


def shard_models(target: Model, target_params, draft: Optional[Model] = None,
                 draft_params=None, mesh: Optional[Mesh] = None, *,
                 mesh_config: sh.MeshConfig = sh.MeshConfig(), batch_size: Optional[int] = None
                 ) -> ShardedModels:
  """Attaches each model's rules, validates the mesh, and places the params.

  Validation happens first, on shapes only, so a bad mesh fails before any transfer or compile.
  `params` may be host (numpy) or device arrays; with several processes each must pass the same.
  """
  mesh = sh.make_mesh(mesh_config) if mesh is None else mesh
  t_rules, d_rules = mesh_config.rules_for("target"), mesh_config.rules_for("draft")
  # Both validated before either is placed: a bad mesh fails before any transfer or compile.
  sh.validate(mesh, target, t_rules, name="target", batch_size=batch_size)
  if draft is not None:
    sh.validate(mesh, draft, d_rules, name="draft", batch_size=batch_size)
  target, tp = sh.shard_model(target, target_params, mesh, t_rules, name="target")
  dp = None
  if draft is not None:
    draft, dp = sh.shard_model(draft, draft_params, mesh, d_rules, name="draft")
  return ShardedModels(mesh, target, tp, draft, dp)
