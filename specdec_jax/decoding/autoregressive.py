"""The autoregressive scheme: one target `extend` per token, the baseline every speedup divides.

The `Decoder`'s default scheme (no draft) runs in the same loop, from the same initial state, with
the same `extend`, logits processing, sampling, EOS handling and buffer as the speculative
schemes, so a measured speedup compares like with like.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax.decoding import state as st
from specdec_jax.decoding.sampling import SamplingConfig, process_logits, sample


def ar_step(model, params, state: st.DecodeState, sampling: SamplingConfig,
            max_decode_len: int) -> st.DecodeState:
  """Feeds the last token, samples the next one, commits it for active examples."""
  rng, key = jax.random.split(state.rng)
  logits_Bx1xV, cache = model.extend(params, state.target_cache,
                                    st.last_tokens(state)[:, None])
  tok_Bx1 = sample(key, process_logits(logits_Bx1xV[:, 0], sampling))[:, None]
  count_B, done_B = st.emit_count(tok_Bx1, jnp.ones_like(state.num_B), state.num_B,
                                  state.done_B, model.eos_id, max_decode_len)
  num_B = state.num_B + count_B
  c = state.counters
  counters = c.replace(iterations=c.iterations + 1,
                       target_calls_B=c.target_calls_B + (~state.done_B).astype(jnp.int32),
                       emitted_B=c.emitted_B + count_B)
  return state.replace(
      tokens_BxL=st.write_tokens(state.tokens_BxL, state.num_B, tok_Bx1, count_B),
      num_B=num_B, done_B=done_B, rng=rng, counters=counters,
      target_cache=cache.rollback(state.base_B + num_B - 1))


@dataclasses.dataclass(frozen=True)
class Autoregressive:
  """The target alone, one token per iteration (a `Decoder` scheme; see `speculative.Chain`)."""

  gamma = 0
  needs_draft = False

  def init_stats(self, batch: int):
    del batch
    return None

  def iteration(self, decoder, params, state: st.DecodeState) -> st.DecodeState:
    return ar_step(decoder.target, params.target, state, decoder.sampling,
                   decoder.max_decode_len)
