"""The autoregressive baseline: one target `extend` per token in one jitted `lax.while_loop`.

It shares `extend`, logits processing, sampling, EOS/length handling and the buffer with the
speculative loop, so a measured speedup compares like with like.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from specdec_jax.decoding import start
from specdec_jax.decoding import state as st
from specdec_jax.decoding.sampling import SamplingConfig, process_logits, sample


def ar_step(model, params, state: st.DecodeState, sampling: SamplingConfig, eos_id: int,
            max_decode_len: int) -> st.DecodeState:
  """Feeds the last token, samples the next one, commits it for active examples."""
  rng, key = jax.random.split(state.rng)
  logits_Bx1xV, cache = model.extend(params, state.target_cache,
                                    st.last_tokens(state)[:, None])
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
      target_cache=cache.rollback(state.base_B + num_B - 1))


@functools.partial(jax.jit, static_argnames=("model", "sampling", "max_decode_len", "cache_len"))
def autoregressive_decode(model, params, inputs_BxP: jax.Array, rng: jax.Array, *,
                          sampling: SamplingConfig, max_decode_len: int,
                          cache_len: int | None = None) -> st.DecodeResult:
  """Decodes up to max_decode_len tokens per example; one compiled program."""
  state = start.init_state(model, params, inputs_BxP, rng, max_decode_len=max_decode_len,
                           cache_len=cache_len)

  def step(s: st.DecodeState, extra):
    return ar_step(model, params, s, sampling, model.eos_id, max_decode_len), extra

  final, _ = st.run_loop(state, None, step)
  return st.finish(final, max_decode_len)


def generate_autoregressive(model, params, inputs_BxP, *, sampling: SamplingConfig,
                            max_decode_len: int, rng=None, cache_len: int | None = None
                            ) -> st.DecodeResult:
  """Validating front door of `autoregressive_decode`."""
  inputs_BxP, rng = start.front_door(model, inputs_BxP, rng, sampling=sampling,
                                     max_decode_len=max_decode_len, cache_len=cache_len)
  return autoregressive_decode(model, params, inputs_BxP, rng, sampling=sampling,
                               max_decode_len=max_decode_len, cache_len=cache_len)
