"""The loop state every scheme shares, the buffer and counter updates, and the loop itself.

The token buffer holds each example's decoder stream from its start token (slot 0: BOS for T5, the
last prompt token for a decoder-only LM) followed by what has been generated. `num_B` counts valid
slots, so slot `num_B - 1` is the last token, not yet fed to the target. A model's cache slot for
buffer slot j is `base_B + j`, where `base_B` is the cache index right after prefill.
"""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.seam import Cache


@flax.struct.dataclass
class Counters:
  """On-device statistics. Per example (`_B...`) so that rows which are not requests (the padding
  of a short last batch on a data-parallel mesh) can be left out on the host; `iterations` is the
  loop's own count. Every count describes tokens that were WRITTEN: a draft token accepted by the
  rule but cut at EOS or the length limit is not counted as accepted.
  """

  iterations: jax.Array              # [] loop iterations (one target call each)
  drafted_B: jax.Array               # [B] draft tokens proposed while the example was active
  accepted_B: jax.Array              # [B] draft tokens accepted and written
  emitted_B: jax.Array               # [B] tokens written to the buffer
  target_calls_B: jax.Array          # [B] target calls while the example was active
  accepts_per_position_BxG: jax.Array  # [B, G] target calls whose draft position i was kept
  accepted_length_hist_BxG1: jax.Array  # [B, G + 1] target calls that kept exactly n drafts
  beta_sum_B: jax.Array              # [B] sum over generated positions of sum_x min(p, q)
  beta_count_B: jax.Array            # [B] number of positions in beta_sum_B

  @classmethod
  def zeros(cls, batch: int, gamma: int) -> "Counters":
    zi = jnp.zeros((batch,), jnp.int32)
    return cls(iterations=jnp.zeros((), jnp.int32), drafted_B=zi, accepted_B=zi, emitted_B=zi,
               target_calls_B=zi, accepts_per_position_BxG=jnp.zeros((batch, gamma), jnp.int32),
               accepted_length_hist_BxG1=jnp.zeros((batch, gamma + 1), jnp.int32),
               beta_sum_B=jnp.zeros((batch,), jnp.float32), beta_count_B=zi)


@flax.struct.dataclass
class DecodeState:
  """Carry of the decode `while_loop`s.

  tokens_BxL: int32 buffer (slot 0 = start token; L = max_decode_len + gamma + 2 slack).
  num_B: valid slots per example. done_B: EOS emitted or length reached; done rows never write.
  base_B: cache slot of buffer slot 0. target_cache / draft_cache: the models' caches.
  draft_pending_B: the draft has not yet seen buffer slot num_B - 2 (all gamma accepted last time).
  bonus_p_BxV: where draft_pending_B, the target's processed p at the bonus position; with the
    draft's q there (its next first call) it gives that position's beta.
  stats: the scheme's own on-device statistics (`Scheme.init_stats`), returned with the result.
  draft_carry: the drafter's own per-row state (`decoding.drafter`: None for a token draft; a
    feature-level draft's pending entries), batch-sharded on a mesh.
  """

  tokens_BxL: jax.Array
  num_B: jax.Array
  done_B: jax.Array
  base_B: jax.Array
  target_cache: Cache
  rng: jax.Array
  counters: Counters
  draft_cache: Cache | None = None
  draft_pending_B: jax.Array | None = None
  bonus_p_BxV: jax.Array | None = None
  stats: Any = None
  draft_carry: Any = None


@flax.struct.dataclass
class DecodeResult:
  """tokens_BxN: generated tokens (N = max_decode_len), 0 after each example's end.
  stats: the scheme's statistics (the adaptive loop's `AdaptiveStats`), else None.
  draft_stats: the drafter's (`Drafter.summary`: the lookup-or-feature drafter's lookup
    iterations per row), else None."""

  tokens_BxN: jax.Array
  lengths_B: jax.Array
  counters: Counters
  stats: Any = None
  draft_stats: Any = None


def finish(state: DecodeState, max_decode_len: int) -> DecodeResult:
  gen = state.tokens_BxL[:, 1:1 + max_decode_len]
  lengths_B = state.num_B - 1
  gen = jnp.where(jnp.arange(max_decode_len)[None, :] < lengths_B[:, None], gen, 0)
  return DecodeResult(gen, lengths_B, state.counters, state.stats)


def write_tokens(tokens_BxL: jax.Array, num_B: jax.Array, new_BxT: jax.Array,
                 count_B: jax.Array) -> jax.Array:
  """Writes the first count_B[b] of new_BxT[b] at slots num_B[b]...; the rest is dropped."""
  t = new_BxT.shape[1]
  j_T = jnp.arange(t, dtype=jnp.int32)
  pos_BxT = jnp.where(j_T[None, :] < count_B[:, None], num_B[:, None] + j_T[None, :],
                      tokens_BxL.shape[1])  # out of range -> dropped
  b_Bx1 = jnp.arange(tokens_BxL.shape[0])[:, None]
  return tokens_BxL.at[b_Bx1, pos_BxT].set(new_BxT, mode="drop")


def emit_count(new_BxT: jax.Array, offered_B: jax.Array, num_B: jax.Array, done_B: jax.Array,
               eos_id: int, max_decode_len: int) -> tuple[jax.Array, jax.Array]:
  """How many of the offered tokens each example keeps (up to and including the first EOS,
  within the length limit, none once done), and whether it is done afterwards."""
  t = new_BxT.shape[1]
  j_T = jnp.arange(t, dtype=jnp.int32)
  is_eos_BxT = (new_BxT == eos_id) & (j_T[None, :] < offered_B[:, None])
  first_eos_B = jnp.min(jnp.where(is_eos_BxT, j_T[None, :], t), axis=1)
  room_B = max_decode_len - (num_B - 1)
  count_B = jnp.minimum(jnp.minimum(offered_B, first_eos_B + 1), room_B)
  count_B = jnp.where(done_B, 0, jnp.maximum(count_B, 0))
  hit_eos_B = first_eos_B < count_B
  done_B = done_B | hit_eos_B | (num_B - 1 + count_B >= max_decode_len)
  return count_B.astype(jnp.int32), done_B


def last_tokens(state: DecodeState) -> jax.Array:
  """[B] the last valid buffer token of each example (not yet fed to the target)."""
  return jnp.take_along_axis(state.tokens_BxL, (state.num_B - 1)[:, None], axis=1)[:, 0]


def run_loop(state: DecodeState, step, constrain=lambda s: s,
             max_iterations: jax.Array | None = None) -> DecodeState:
  """The one `lax.while_loop` every decode runs: `step(state) -> state` until every example is
  done (each iteration writes >= 1 token per active example, so it ends). `constrain` re-applies
  a sharded program's layout to the carry. `max_iterations` (traced, so one compile serves every
  cap; None costs nothing) stops the loop after that many iterations by marking every row done:
  the calibration times a decode with no iteration (cap 0) against the full one."""
  if max_iterations is None:
    return jax.lax.while_loop(lambda s: jnp.any(~s.done_B), lambda s: constrain(step(s)), state)
  left = jnp.asarray(max_iterations, jnp.int32)
  state = state.replace(done_B=state.done_B | (left <= 0))

  def body(c):
    s, left = c
    s = step(s)
    return constrain(s.replace(done_B=s.done_B | (left <= 1))), left - 1

  return jax.lax.while_loop(lambda c: jnp.any(~c[0].done_B), body, (state, left))[0]
