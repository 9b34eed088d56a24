"""How a token draft is called in an iteration: its first call (after a fully accepted block it
has not seen the last drafted token; in the target's cache it never lags) and a call over tokens,
a chain's or a tree level's. `drafter.TokenDrafter` composes them.
"""
from __future__ import annotations

import jax.numpy as jnp

from specdec_jax.decoding import state as st


def token_first_call(draft, dparams, state: st.DecodeState):
  """A token draft's first call of an iteration: (logits for x_1 [B, V], logits at the previous
  bonus position [B, V] (meaningful where pending), the cache after it). It feeds [x_gamma, next]
  where the draft has not seen x_gamma (`draft_pending_B`), else [next, pad]: one static shape,
  then a rollback past the pad; no extra draft call."""
  pending_B = state.draft_pending_B
  last_B = st.last_tokens(state)
  prev_B = jnp.take_along_axis(state.tokens_BxL, jnp.maximum(state.num_B - 2, 0)[:, None],
                               axis=1)[:, 0]
  first_Bx2 = jnp.stack([jnp.where(pending_B, prev_B, last_B),
                         jnp.where(pending_B, last_B, 0)], axis=1)
  index_B = state.draft_cache.index_B
  logits_Bx2xV, cache = draft.extend(dparams, state.draft_cache, first_Bx2)
  cache = cache.rollback(index_B + 1 + pending_B.astype(jnp.int32))
  return (jnp.where(pending_B[:, None], logits_Bx2xV[:, 1], logits_Bx2xV[:, 0]),
          logits_Bx2xV[:, 0], cache)


def shared_first_call(draft, dparams, state: st.DecodeState):
  """A draft in the target's cache ('shared'): its first call feeds the last token at the last
  verified slot, where the target's cache stands (every earlier position is there, the target's
  own): (logits for x_1 [B, V], the target's cache with that slot written by the draft)."""
  logits_Bx1xV, cache = draft.extend(dparams, state.target_cache, st.last_tokens(state)[:, None])
  return logits_Bx1xV[:, 0], cache


def token_call(model, params, cache, tokens_BxT, offsets=None, visible=None):
  """A model's call over tokens: `extend` for a chain, `extend_with_mask` for a tree's layout
  (`offsets` / `visible`): (logits [B, T, V], cache)."""
  if offsets is None:
    return model.extend(params, cache, tokens_BxT)
  return model.extend_with_mask(params, cache, tokens_BxT, offsets, visible)
