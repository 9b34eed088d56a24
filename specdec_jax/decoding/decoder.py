"""The Decoder: one frozen description of a decode, and the three programs that run it.

Why one object: the autoregressive baseline, the chain, the adaptive loop, the trees, their
sharded variants and the calibration's capped decode are one program (front door, initial state,
one `lax.while_loop` over an iteration, finish) that differ only in the iteration. A `Decoder`
names the target, the draft, the *scheme* (what one iteration does), the *drafter* (how the
draft is asked for tokens), the sampling, the acceptance rule and the lengths; frozen and
hashable, it is the one static argument of each program, so equal decoders share compiled code.

  decoder = Decoder(target, draft, Chain(gamma=4), SamplingConfig(temperature=1.0),
                    max_decode_len=64)
  result = decoder.generate(Params(target_params, draft_params), inputs_BxP, rng)

Research code may drive the pieces itself (`init`, `iteration`, `run`, `finish`). The programs
(`decoder` static): `decode_program` on one device; on a mesh `prefill_program`, whose state is
DONATED to `loop_program` so the loop updates caches and buffer in place (DESIGN.md, "One
Decoder, one loop, all on device").
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Protocol

import flax.linen as nn
import flax.struct
import jax
import numpy as np
from jax.sharding import Mesh

from specdec_jax import sharding as sh
from specdec_jax.decoding import start
from specdec_jax.decoding import state as st
from specdec_jax.decoding.autoregressive import Autoregressive
from specdec_jax.decoding.drafter import drafter_for
from specdec_jax.decoding.sampling import SamplingConfig


class Scheme(Protocol):
  """What one iteration of the loop does (`Autoregressive`, `speculative.Chain`,
  `adaptive.AdaptiveConfig`, the trees). Hashable.

  gamma: draft tokens per iteration at most, sizing the buffer slack and the per-position
    counters (0 without a draft). needs_draft: whether the decoder must have a draft.
  written (with a draft): tokens one iteration writes at most (a feature drafter's pending
    entries). init_stats(batch): the scheme's on-device statistics (`DecodeState.stats`).
  constrain_stats(stats, constrain) (optional): `constrain` (batch-sharding) applied to the
    statistics' per-example leaves. check(decoder) (optional): what it needs of the models.
  iteration(decoder, params, state): one target call's worth of decoding; the draft is asked
    through `decoder.drafter` only, so every scheme serves every draft.
  """

  gamma: int
  needs_draft: bool

  def init_stats(self, batch: int) -> Any: ...

  def iteration(self, decoder: "Decoder", params: "Params", state: st.DecodeState
                ) -> st.DecodeState: ...


@flax.struct.dataclass
class Params:
  """The models' parameters (a pytree): the target's, and the draft's (None without a draft;
  a model-free draft's tables)."""

  target: Any
  draft: Any = None


@dataclasses.dataclass(frozen=True)
class Decoder:
  """A decode, described: checked when made (`start.check_decoder`), static in every program.

  target / draft: seam models (`specdec_jax.seam.Decodable`); draft None with the
  `Autoregressive` scheme. scheme: the iteration (`Scheme`). sampling: applied alike to p and q.
  rule: the acceptance rule's name (`acceptance.ACCEPTANCE_RULES`). max_decode_len: tokens per
  example at most. cache_len: decoder cache slots (None: what the prompt needs). mesh: decode on
  this mesh (models placed with `specdec_jax.sharding.shard_models`); None: one device. drafter:
  how the draft is asked for tokens (`decoding.drafter`; None: `TokenDrafter()`, or
  `FeatureDrafter()` for a feature-level draft); its options are decoding choices, so they live
  here, not in the model.
  """

  target: Any
  draft: Any = None
  scheme: Any = Autoregressive()
  sampling: SamplingConfig = SamplingConfig()
  rule: str = "tokenwise"
  max_decode_len: int = 32
  cache_len: Optional[int] = None
  mesh: Optional[Mesh] = None
  drafter: Any = None

  def __post_init__(self):
    object.__setattr__(self, "drafter", drafter_for(self.draft, self.drafter))
    start.check_decoder(self)

  @property
  def gamma(self) -> int:
    return self.scheme.gamma

  # ---- the pieces ------------------------------------------------------------------------------
  def init(self, params: Params, inputs_BxP: jax.Array, rng: jax.Array) -> st.DecodeState:
    """Both prefills and the token buffer (traceable)."""
    return self._constrain(start.init_state(self, params, inputs_BxP, rng))

  def iteration(self, params: Params, state: st.DecodeState) -> st.DecodeState:
    """One iteration of the scheme: one target call (traceable)."""
    return self.scheme.iteration(self, params, state)

  def run(self, params: Params, state: st.DecodeState,
          max_iterations: Optional[jax.Array] = None) -> st.DecodeState:
    """The while loop until every example is done, or after `max_iterations` (traceable)."""
    return st.run_loop(state, functools.partial(self.iteration, params), self._constrain,
                       max_iterations)

  def finish(self, state: st.DecodeState) -> st.DecodeResult:
    result = st.finish(state, self.max_decode_len)
    if self.drafter is None:
      return result
    return result.replace(draft_stats=self.drafter.summary(state.draft_carry))

  # ---- the front door ----------------------------------------------------------------------------
  def generate(self, params: Params, inputs_BxP, rng: Optional[jax.Array] = None, *,
               max_iterations: Optional[int] = None, process_local: bool = False
               ) -> st.DecodeResult:
    """Decodes a batch of right-padded prompts [B, P] (int32, pad 0) after the front door's
    checks; the whole loop runs on device. `max_iterations`: stop after that many target calls
    (the calibration's timing; None: to the end). `process_local` (a mesh with several
    processes): `inputs_BxP` holds only this process's rows."""
    inputs_BxP, rng = start.front_door(self, inputs_BxP, rng)
    if self.mesh is None:
      return decode_program(self, params, inputs_BxP, rng, max_iterations)
    with jax.set_mesh(self.mesh):
      state = prefill_program(self, params, self.place_inputs(inputs_BxP, process_local),
                              sh.replicate_key(self.mesh, rng))
      return loop_program(self, params, state, max_iterations)[0]

  def lower(self, params: Params, inputs_BxP, rng: Optional[jax.Array] = None):
    """The lowered program(s) for HLO inspection. One device: `decode_program`'s lowering. On a
    mesh: (the prefilled state, the lowered loop); `lowered.compile()(params, state, None)`
    decodes, returning (result, final state), and deletes the donated `state`."""
    inputs_BxP, rng = start.front_door(self, inputs_BxP, rng)
    if self.mesh is None:
      return decode_program.lower(self, params, inputs_BxP, rng, None)
    with jax.set_mesh(self.mesh):
      state = prefill_program(self, params, self.place_inputs(inputs_BxP, False),
                              sh.replicate_key(self.mesh, rng))
      return state, loop_program.lower(self, params, state, None)

  def place_inputs(self, inputs_BxP, process_local: bool = False) -> jax.Array:
    """The prompts as a global array batch-sharded over the mesh (by the target's rules); a
    global array that spans other processes' devices (the runner's `global_batch`) is already
    placed and is taken as it is (it cannot be read back to this host)."""
    batch = np.shape(inputs_BxP)[0] * (jax.process_count() if process_local else 1)
    sh.validate(self.mesh, self.target, self.target.axis_rules, name="target", batch_size=batch)
    if isinstance(inputs_BxP, jax.Array) and not inputs_BxP.is_fully_addressable:
      return inputs_BxP
    return sh.shard_batch(np.asarray(inputs_BxP, np.int32), self.mesh, self.target.axis_rules,
                          process_local=process_local)

  def _constrain(self, state: st.DecodeState) -> st.DecodeState:
    """On a mesh, the buffer, per-example arrays, counters, drafter carry and per-example
    statistics batch-sharded by the target's rules (the caches constrain themselves). Prefill and
    loop body apply the same constraints, so the donated state and the loop's output have equal
    shardings, which lets XLA alias them. The identity on one device."""
    if self.mesh is None:
      return state
    with nn.logical_axis_rules(self.target.axis_rules or ()):
      def b(x):
        return None if x is None else nn.with_logical_constraint(
            x, ("batch",) + (None,) * (x.ndim - 1))
      c = state.counters
      counters = c.replace(**{f.name: b(getattr(c, f.name)) for f in dataclasses.fields(c)
                              if "_B" in f.name})
      stats = state.stats
      if hasattr(self.scheme, "constrain_stats"):
        stats = self.scheme.constrain_stats(stats, b)
      return state.replace(tokens_BxL=b(state.tokens_BxL), num_B=b(state.num_B),
                           counters=counters, done_B=b(state.done_B), base_B=b(state.base_B),
                           draft_pending_B=b(state.draft_pending_B),
                           bonus_p_BxV=b(state.bonus_p_BxV), stats=stats,
                           draft_carry=jax.tree.map(b, state.draft_carry))


# ---- the programs ----------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("decoder",))
def decode_program(decoder: Decoder, params: Params, inputs_BxP: jax.Array, rng: jax.Array,
                   max_iterations: Optional[jax.Array]) -> st.DecodeResult:
  """The whole decode of a batch as one program (one device)."""
  state = decoder.init(params, inputs_BxP, rng)
  return decoder.finish(decoder.run(params, state, max_iterations))


@functools.partial(jax.jit, static_argnames=("decoder",))
def prefill_program(decoder: Decoder, params: Params, inputs_BxP: jax.Array, rng: jax.Array
                    ) -> st.DecodeState:
  """The sharded decode's first program: the initial state, laid out for `loop_program`."""
  return decoder.init(params, inputs_BxP, rng)


@functools.partial(jax.jit, static_argnames=("decoder",), donate_argnames=("state",))
def loop_program(decoder: Decoder, params: Params, state: st.DecodeState,
                 max_iterations: Optional[jax.Array]
                 ) -> tuple[st.DecodeResult, st.DecodeState]:
  """The sharded decode's loop over a donated state: (result, final state). The final state is
  returned because an output of the donated input's shape and sharding is what lets XLA alias
  the two, so the while loop runs in the donated buffers."""
  final = decoder.run(params, state, max_iterations)
  return decoder.finish(final), final
