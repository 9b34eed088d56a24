"""How a feature-level draft's entries are laid out and fed (the `FeatureDrafter`'s pieces).

Why a module of its own: a feature draft (EAGLE style) is fed *entries*, (the target's fused
state at a position, the token after it), not tokens. The pending entries after a verify call
(`FeatureCarry`, `next_carry`), the prompt's (`prime_carry`), an iteration's first call
(`feature_first_call`) and the parallel block's masks (`block_entries`) are one idea: the entry
layout, the same one training builds (`training.feature_trainer`, `training.feature_blocks`).
"""
from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import seam
from specdec_jax.decoding import state as st


def is_feature_draft(draft) -> bool:
  """Whether `draft` drafts from the target's features (`extend_features`), not from tokens."""
  return hasattr(draft, "extend_features")



@flax.struct.dataclass
class FeatureCarry:
  """The draft entries the target has verified but the draft has not been fed yet.

  g_BxG1xD: fused target features of up to G + 1 pending entries (zeros at the start).
  count_B: how many are pending (the tokens written by the last iteration; 0 at the start).
  """

  g_BxG1xD: jax.Array
  count_B: jax.Array


def prime_carry(draft, dparams, cache, inputs_BxP: jax.Array, hidden_BxTxnxD: jax.Array,
                carry: FeatureCarry):
  """Decoder-only: the prompt's entries in the draft's cache, its last one pending: (cache,
  carry). `cache`: the draft's `prefill` (index = the start token's slot, len - 1);
  `hidden_BxTxnxD`: the target's states at the prompt's first P - 1 slots (`prefill_with_hidden`).
  Entry s = (fuse(h_s), t_{s+1}) at slot s, as the target verified it; entries 0..len - 3 are fed
  here in one call and entry len - 2 stays pending (its output is q for the first drafted token),
  so the first iteration drafts from the whole prompt, as training saw it. A one-token prompt
  keeps the start entry (count 0). Entries past a shorter (right-padded) row's prompt sit at or
  past its index, where nothing reads them before they are overwritten."""
  plen = inputs_BxP.shape[1]
  if plen < 2:
    return cache, carry
  start_B = cache.index_B  # the draft's prefill: the start token's slot, len - 1
  g_BxTxD = draft.fuse(dparams, hidden_BxTxnxD).astype(jnp.float32)
  if plen > 2:
    _, cache = draft.feed_features(dparams, cache.rollback(jnp.zeros_like(start_B)),
                                   inputs_BxP[:, 1:plen - 1], g_BxTxD[:, :plen - 2])
    cache = cache.rollback(start_B)
  primed_B = start_B >= 1
  last_BxD = jnp.take_along_axis(g_BxTxD, jnp.clip(start_B - 1, 0, plen - 2)[:, None, None],
                                 axis=1)[:, 0]
  last_BxD = jnp.where(primed_B[:, None], last_BxD, carry.g_BxG1xD[:, 0])
  return cache, FeatureCarry(carry.g_BxG1xD.at[:, 0].set(last_BxD), primed_B.astype(jnp.int32))


def last_output(draft, dparams, out_BxTxD: jax.Array, last_B: jax.Array):
  """(logits [B, V], output feature [B, D]) at entry last_B of a call's output features: the
  head applied to that entry alone (`FeatureDraft.logits` after `feed_features`), not to
  every fed one: on CPU the head is most of a draft step."""
  out_BxD = jnp.take_along_axis(out_BxTxD, last_B[:, None, None], axis=1)[:, 0]
  return draft.logits(dparams, out_BxD[:, None])[:, 0], out_BxD


def feature_first_call(draft, dparams, state: st.DecodeState, carry: FeatureCarry):
  """Feeds the pending entries; (logits for x_1 [B, V], its output feature [B, D], cache)."""
  g1 = carry.g_BxG1xD.shape[1]
  count_B = carry.count_B
  c_B = jnp.maximum(count_B, 1)
  idx_BxG1 = jnp.clip(state.num_B[:, None] - c_B[:, None] + jnp.arange(g1)[None, :], 0,
                      state.tokens_BxL.shape[1] - 1)
  tokens_BxG1 = jnp.take_along_axis(state.tokens_BxL, idx_BxG1, axis=1)
  start_B = state.base_B + state.num_B - 1
  cache = state.draft_cache.rollback(start_B - count_B)
  out_BxG1xD, cache = draft.feed_features(dparams, cache, tokens_BxG1, carry.g_BxG1xD)
  return (*last_output(draft, dparams, out_BxG1xD, c_B - 1), cache.rollback(start_B))


def next_carry(before: st.DecodeState, new: st.DecodeState, g_BxKxD: jax.Array,
               carry: FeatureCarry) -> FeatureCarry:
  """The pending entries after an iteration (`before` it, `new` after `commit`): every newly
  written position's fused target feature (rows K of the block or path), for the rows that were
  active."""
  active_B = ~before.done_B
  return FeatureCarry(jnp.where(active_B[:, None, None], g_BxKxD, carry.g_BxG1xD),
                      jnp.where(active_B, new.num_B - before.num_B, carry.count_B))


def block_entries(state: st.DecodeState, carry: FeatureCarry, gamma: int, mask_id: int):
  """(tokens [B, N], features [B, N, D], first output index [B]) of the parallel draft's one
  call, N = G + 1 + G - 1: the pending entries, then gamma - 1 masks (token `mask_id`, feature
  zeros; `FeatureDrafter.parallel`)."""
  g1 = carry.g_BxG1xD.shape[1]
  n = g1 + gamma - 1
  c_B = jnp.maximum(carry.count_B, 1)
  j_1xN = jnp.arange(n)[None, :]
  idx_BxN = jnp.clip(state.num_B[:, None] - c_B[:, None] + j_1xN, 0,
                     state.tokens_BxL.shape[1] - 1)
  pending_BxN = j_1xN < c_B[:, None]
  tokens_BxN = jnp.where(pending_BxN, jnp.take_along_axis(state.tokens_BxL, idx_BxN, axis=1),
                         mask_id)
  g_BxNxD = jnp.concatenate(
      [carry.g_BxG1xD, jnp.zeros(carry.g_BxG1xD.shape[:1] + (gamma - 1,)
                                 + carry.g_BxG1xD.shape[2:], carry.g_BxG1xD.dtype)], axis=1)
  return tokens_BxN, jnp.where(pending_BxN[..., None], g_BxNxD, 0.0), c_B - 1


def block_logits(draft, dparams, state: st.DecodeState, carry: FeatureCarry, gamma: int,
                 mask_id: int):
  """The parallel draft's one call: (raw logits of q_1..q_G [B, G, V], the draft cache rolled
  back to the last verified slot); its own function so a test can hold the training-time block
  loss (`training/feature_blocks.py`) to exactly these logits. Per row (c pending entries):
  entries 0..c-1 pending, c..c+G-2 masks, the rest padding (causal: nothing reads it); q_k is the
  output at entry c + k - 2. Each x_i is drawn from its q_i alone: a distribution that ignores
  x_<i is still one of x_i given x_<i, so the rules stay exact. It writes up to 2G draft-cache
  slots past the rollback point; slots past the cache's end are dropped."""
  tokens_BxN, g_BxNxD, first_B = block_entries(state, carry, gamma, mask_id)
  start_B = state.base_B + state.num_B - 1
  cache = state.draft_cache.rollback(start_B - carry.count_B)
  logits_BxNxV, _, cache = draft.extend_features(dparams, cache, tokens_BxN, g_BxNxD)
  sel_BxG = first_B[:, None] + jnp.arange(gamma)[None, :]
  return jnp.take_along_axis(logits_BxNxV, sel_BxG[..., None], axis=1), cache.rollback(start_B)


@dataclasses.dataclass(frozen=True)
class LoneStep(seam.Delegate):
  """A feature-level draft whose `extend` is one `extend_features` call with zero features.
  Why: the lone-extend timer (`timing.measure_costs_many`) times a draft's step through `extend`,
  which a feature draft refuses; the step costs the same whatever the features hold (the fusion
  is part of the verify side), so zeros time it exactly."""

  def extend(self, params, cache, tokens_BxT):
    g_BxTxD = jnp.zeros(tokens_BxT.shape + (self.base.width,), jnp.float32)
    logits_BxTxV, _, cache = self.base.extend_features(params, cache, tokens_BxT, g_BxTxD)
    return logits_BxTxV, cache


def timed_as_extend(draft):
  """`draft` as the lone-extend timer drives it (`LoneStep` for a feature draft)."""
  return LoneStep(draft) if is_feature_draft(draft) else draft
