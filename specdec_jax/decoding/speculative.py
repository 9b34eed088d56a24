"""Speculative decoding as one jitted `lax.while_loop`: draft -> verify -> accept -> commit.

The host sees only the final tokens and the counters. Each stage is a small pure function:
- `draft_step`: gamma draft `extend` calls, sampling x_i ~ q_i (processed like p);
- `verify_step`: one target `extend` over [last, x_1..x_gamma] -> p_1..p_{gamma+1};
- an acceptance rule (`acceptance.tokenwise` by default) -> accepted count and the next token;
- `commit`: write the accepted tokens and the next token, roll both caches back, count.

When all gamma tokens are accepted the draft never saw x_gamma. Instead of an extra draft call,
the next draft step's first call feeds two tokens [x_gamma, next] (else [next, pad], the pad's slot
invalidated right after), so the draft costs exactly gamma calls per iteration with static shapes.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specdec_jax.decoding import acceptance as acc
from specdec_jax.decoding import state as st
from specdec_jax.decoding.autoregressive import cache_len_needed, last_tokens, prepare
from specdec_jax.decoding.sampling import SamplingConfig, process_logits, sample
from specdec_jax.models.kv_cache import DecodeCache, rollback


def first_draft_call(draft, draft_params, cache: DecodeCache, tokens_BxL: jax.Array,
                     num_B: jax.Array, pending_B: jax.Array) -> tuple[jax.Array, DecodeCache]:
  """The draft's first call of an iteration: logits for x_1 [B, V] and the cache after it.

  It feeds [x_gamma, next] where the draft has not seen x_gamma yet (all were accepted last
  time: `pending_B`), else [next, pad]; one static shape either way, then rolls back past the pad.
  """
  last_B = jnp.take_along_axis(tokens_BxL, (num_B - 1)[:, None], axis=1)[:, 0]
  prev_B = jnp.take_along_axis(tokens_BxL, jnp.maximum(num_B - 2, 0)[:, None], axis=1)[:, 0]
  first_Bx2 = jnp.stack([jnp.where(pending_B, prev_B, last_B),
                         jnp.where(pending_B, last_B, 0)], axis=1)
  index_B = cache.index_B
  logits_Bx2xV, cache = draft.extend(draft_params, cache, first_Bx2)
  cache = rollback(cache, index_B + 1 + pending_B.astype(jnp.int32))
  return jnp.where(pending_B[:, None], logits_Bx2xV[:, 1], logits_Bx2xV[:, 0]), cache


def draft_step(draft, draft_params, cache: DecodeCache, tokens_BxL: jax.Array, num_B: jax.Array,
               pending_B: jax.Array, key: jax.Array, gamma: int, sampling: SamplingConfig
               ) -> tuple[jax.Array, jax.Array, DecodeCache]:
  """Proposes gamma tokens per example. Returns (tokens_BxG, q_BxGxV float32, draft cache)."""
  logits_BxV, cache = first_draft_call(draft, draft_params, cache, tokens_BxL, num_B, pending_B)
  keys = jax.random.split(key, gamma)
  q_BxV = process_logits(logits_BxV, sampling)
  x_B = sample(keys[0], q_BxV)

  def one(carry, key_i):
    cache, x_B = carry
    logits_Bx1xV, cache = draft.extend(draft_params, cache, x_B[:, None])
    q_BxV = process_logits(logits_Bx1xV[:, 0], sampling)
    x_next = sample(key_i, q_BxV)
    return (cache, x_next), (x_next, q_BxV)

  (cache, _), (xs_GxB, qs_GxBxV) = jax.lax.scan(one, (cache, x_B), keys[1:])
  tokens_BxG = jnp.concatenate([x_B[:, None], xs_GxB.T], axis=1)
  q_BxGxV = jnp.concatenate([q_BxV[:, None], jnp.moveaxis(qs_GxBxV, 0, 1)], axis=1)
  return tokens_BxG, q_BxGxV, cache


def verify_step(target, target_params, cache: DecodeCache, last_B: jax.Array,
                draft_tokens_BxG: jax.Array, sampling: SamplingConfig
                ) -> tuple[jax.Array, DecodeCache]:
  """One target call over [last, x_1..x_G]; returns processed p_Bx(G+1)xV (float32)."""
  block_BxG1 = jnp.concatenate([last_B[:, None], draft_tokens_BxG], axis=1)
  logits_BxG1xV, cache = target.extend(target_params, cache, block_BxG1)
  return process_logits(logits_BxG1xV, sampling), cache


def commit(state: st.DecodeState, draft_tokens_BxG: jax.Array, n_B: jax.Array,
           next_B: jax.Array, beta_BxG: jax.Array, target_cache: DecodeCache,
           draft_cache: DecodeCache, eos_id: int, max_decode_len: int) -> st.DecodeState:
  """Writes x_1..x_n, next for active examples; rolls both caches back; updates counters."""
  gamma = draft_tokens_BxG.shape[1]
  active_B = ~state.done_B
  g_G1 = jnp.arange(gamma + 1, dtype=jnp.int32)
  padded_BxG1 = jnp.concatenate([draft_tokens_BxG, jnp.zeros_like(next_B)[:, None]], axis=1)
  new_BxG1 = jnp.where(g_G1[None, :] == n_B[:, None], next_B[:, None], padded_BxG1)
  count_B, done_B = st.emit_count(new_BxG1, n_B + 1, state.num_B, state.done_B, eos_id,
                                  max_decode_len)
  num_B = state.num_B + count_B
  pending_B = jnp.where(active_B, n_B == gamma, state.draft_pending_B)
  c = state.counters
  act = active_B.astype(jnp.int32)
  beta_mask_BxG = (g_G1[None, :gamma] < jnp.minimum(count_B, gamma)[:, None])
  counters = c.replace(
      iterations=c.iterations + 1,
      target_calls_B=c.target_calls_B + act,
      drafted_B=c.drafted_B + gamma * act,
      accepted_B=c.accepted_B + n_B * act,
      emitted_B=c.emitted_B + count_B,
      accepts_per_position_G=c.accepts_per_position_G + jnp.sum(
          (g_G1[None, :gamma] < n_B[:, None]) & active_B[:, None], axis=0, dtype=jnp.int32),
      accepted_length_hist=c.accepted_length_hist + jnp.sum(
          (g_G1[None, :] == n_B[:, None]) & active_B[:, None], axis=0, dtype=jnp.int32),
      beta_sum_B=c.beta_sum_B + jnp.sum(jnp.where(beta_mask_BxG, beta_BxG, 0.0), axis=1),
      beta_count_B=c.beta_count_B + jnp.sum(beta_mask_BxG, axis=1, dtype=jnp.int32))
  last_slot_B = state.base_B + num_B - 1
  return state.replace(
      tokens_BxL=st.write_tokens(state.tokens_BxL, state.num_B, new_BxG1, count_B),
      num_B=num_B, done_B=done_B, counters=counters, draft_pending_B=pending_B,
      target_cache=rollback(target_cache, last_slot_B),
      draft_cache=rollback(draft_cache, last_slot_B - pending_B.astype(jnp.int32)))


def spec_iteration(target, target_params, draft, draft_params, state: st.DecodeState, *,
                   gamma: int, sampling: SamplingConfig, rule: str, max_decode_len: int
                   ) -> st.DecodeState:
  """One draft -> verify -> accept -> commit iteration."""
  rng, k_draft, k_accept = jax.random.split(state.rng, 3)
  x_BxG, q_BxGxV, draft_cache = draft_step(draft, draft_params, state.draft_cache,
                                           state.tokens_BxL, state.num_B, state.draft_pending_B,
                                           k_draft, gamma, sampling)
  p_BxG1xV, target_cache = verify_step(target, target_params, state.target_cache,
                                       last_tokens(state), x_BxG, sampling)
  n_B, next_B = acc.get_rule(rule)(k_accept, x_BxG, q_BxGxV, p_BxG1xV)
  beta_BxG = jnp.sum(jnp.minimum(p_BxG1xV[:, :gamma], q_BxGxV), axis=-1)
  state = state.replace(rng=rng)
  return commit(state, x_BxG, n_B, next_B, beta_BxG, target_cache, draft_cache,
                target.config.eos_id, max_decode_len)


@functools.partial(jax.jit, static_argnames=("target", "draft", "gamma", "sampling", "rule",
                                             "max_decode_len", "cache_len"))
def speculative_decode(target, target_params, draft, draft_params, inputs_BxP: jax.Array,
                       rng: jax.Array, *, gamma: int, sampling: SamplingConfig,
                       max_decode_len: int, rule: str = "tokenwise",
                       cache_len: int | None = None) -> st.DecodeResult:
  """Speculative decoding of a batch; the whole loop is one compiled program."""
  slack = gamma + 2
  state = prepare(target, target_params, inputs_BxP, max_decode_len=max_decode_len, slack=slack,
                  cache_len=cache_len, rng=rng, gamma=gamma)
  draft_cache = draft.prefill(draft_params, inputs_BxP,
                              cache_len or cache_len_needed(draft, inputs_BxP.shape[1],
                                                            max_decode_len, slack))
  state = state.replace(draft_cache=draft_cache,
                        draft_pending_B=jnp.zeros_like(state.done_B))

  def cond(s: st.DecodeState):
    return jnp.any(~s.done_B)  # each example is done at EOS or max_decode_len; >= 1 token/call

  def body(s: st.DecodeState):
    return spec_iteration(target, target_params, draft, draft_params, s, gamma=gamma,
                          sampling=sampling, rule=rule, max_decode_len=max_decode_len)

  return st.finish(jax.lax.while_loop(cond, body, state), max_decode_len)


def generate_speculative(target, target_params, draft, draft_params, inputs_BxP, *, gamma: int,
                         sampling: SamplingConfig, max_decode_len: int, rng=None,
                         rule: str = "tokenwise", cache_len: int | None = None
                         ) -> st.DecodeResult:
  """Validating front door of `speculative_decode`."""
  inputs_BxP = jnp.asarray(inputs_BxP, jnp.int32)
  st.check_decode_args(target_vocab=target.vocab_size, draft_vocab=draft.vocab_size, gamma=gamma,
                       sampling=sampling, max_decode_len=max_decode_len,
                       prompt_len=inputs_BxP.shape[1], cache_len=cache_len,
                       needed_cache_len=cache_len_needed(target, inputs_BxP.shape[1],
                                                         max_decode_len, gamma + 2))
  acc.get_rule(rule)
  rng = jax.random.key(0) if rng is None else rng
  return speculative_decode(target, target_params, draft, draft_params, inputs_BxP, rng,
                            gamma=gamma, sampling=sampling, max_decode_len=max_decode_len,
                            rule=rule, cache_len=cache_len)
