"""The autoregressive baseline: one target `extend` per token in one jitted `lax.while_loop`.

It shares `extend`, logits processing, sampling, EOS/length handling and the buffer with the
speculative loop, so a measured speedup compares like with like.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specdec_jax.decoding import state as st
from specdec_jax.decoding.sampling import SamplingConfig, process_logits, sample
from specdec_jax.models.kv_cache import rollback


def prepare(model, params, inputs_BxP: jax.Array, *, max_decode_len: int, slack: int,
            cache_len: int | None, rng: jax.Array, gamma: int = 1):
  """Prefill and the initial state (shared with the speculative loop)."""
  batch, plen = inputs_BxP.shape
  base = 0 if model.config.is_encoder_decoder else plen
  needed = base + max_decode_len + slack
  cache = model.prefill(params, inputs_BxP, cache_len or needed)
  tokens = jnp.zeros((batch, max_decode_len + slack), jnp.int32)
  tokens = tokens.at[:, 0].set(model.start_tokens(inputs_BxP))
  return st.DecodeState(tokens_BxL=tokens, num_B=jnp.ones((batch,), jnp.int32),
                        done_B=jnp.zeros((batch,), bool), base_B=cache.index_B,
                        target_cache=cache, rng=rng, counters=st.Counters.zeros(batch, gamma))


def cache_len_needed(model, prompt_len: int, max_decode_len: int, slack: int) -> int:
  return (0 if model.config.is_encoder_decoder else prompt_len) + max_decode_len + slack


def last_tokens(state: st.DecodeState) -> jax.Array:
  return jnp.take_along_axis(state.tokens_BxL, (state.num_B - 1)[:, None], axis=1)[:, 0]


def ar_step(model, params, state: st.DecodeState, sampling: SamplingConfig, eos_id: int,
            max_decode_len: int) -> st.DecodeState:
  """Feeds the last token, samples the next one, commits it for active examples."""
  rng, key = jax.random.split(state.rng)
  logits_Bx1xV, cache = model.extend(params, state.target_cache, last_tokens(state)[:, None])
  tok_Bx1 = sample(key, process_logits(logits_Bx1xV[:, 0], sampling))[:, None]
  count_B, done_B = st.emit_count(tok_Bx1, jnp.ones_like(state.num_B), state.num_B,
                                  state.done_B, eos_id, max_decode_len)
  num_B = state.num_B + count_B
  c = state.counters
  counters = c.replace(iterations=c.iterations + 1,
                       target_calls_B=c.target_calls_B + (~state.done_B).astype(jnp.int32),
                       emitted_B=c.emitted_B + count_B)
  return state.replace(
      tokens_BxL=st.write_tokens(state.tokens_BxL, state.num_B, tok_Bx1, count_B),
      num_B=num_B, done_B=done_B, rng=rng, counters=counters,
      target_cache=rollback(cache, state.base_B + num_B - 1))


@functools.partial(jax.jit, static_argnames=("model", "sampling", "max_decode_len", "cache_len"))
def autoregressive_decode(model, params, inputs_BxP: jax.Array, rng: jax.Array, *,
                          sampling: SamplingConfig, max_decode_len: int,
                          cache_len: int | None = None) -> st.DecodeResult:
  """Decodes up to max_decode_len tokens per example; one compiled program."""
  state = prepare(model, params, inputs_BxP, max_decode_len=max_decode_len, slack=2,
                  cache_len=cache_len, rng=rng)
  eos = model.config.eos_id

  def cond(s: st.DecodeState):
    return jnp.any(~s.done_B)  # every example stops at EOS or at max_decode_len

  def body(s: st.DecodeState):
    return ar_step(model, params, s, sampling, eos, max_decode_len)

  return st.finish(jax.lax.while_loop(cond, body, state), max_decode_len)


def generate_autoregressive(model, params, inputs_BxP, *, sampling: SamplingConfig,
                            max_decode_len: int, rng=None, cache_len: int | None = None
                            ) -> st.DecodeResult:
  """Validating front door of `autoregressive_decode`."""
  inputs_BxP = jnp.asarray(inputs_BxP, jnp.int32)
  st.check_decode_args(target_vocab=model.vocab_size, draft_vocab=None, gamma=None,
                       sampling=sampling, max_decode_len=max_decode_len,
                       prompt_len=inputs_BxP.shape[1], cache_len=cache_len,
                       needed_cache_len=cache_len_needed(model, inputs_BxP.shape[1],
                                                         max_decode_len, 2))
  rng = jax.random.key(0) if rng is None else rng
  return autoregressive_decode(model, params, inputs_BxP, rng, sampling=sampling,
                               max_decode_len=max_decode_len, cache_len=cache_len)
