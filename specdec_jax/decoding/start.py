"""Starting a decode: the one validating front door and the one initial-state builder.

Every loop (autoregressive, fixed-gamma and adaptive speculative, their sharded programs), every
calibration and benchmark goes through these two functions, so a prompt, a pair of models or a
cache length is judged the same way everywhere and the state a loop starts from is built once.

Why the slack: a verify call writes gamma + 1 tokens past the last kept one (into the cache and,
through `write_tokens`, possibly up to gamma + 1 buffer slots past `max_decode_len`), and the
draft's first call of an iteration may feed two tokens. `slack(gamma)` = gamma + 2 slots cover
both; the autoregressive loop is gamma = 0.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import seam
from specdec_jax.decoding import state as st
from specdec_jax.decoding.sampling import SamplingConfig


def slack(gamma: int) -> int:
  """Buffer and cache slots past `max_decode_len` a loop with `gamma` drafts per call needs."""
  return gamma + 2


def cache_len_needed(model: seam.Decodable, prompt_len: int, max_decode_len: int,
                     gamma: int) -> int:
  """Decoder cache slots: the prompt (decoder-only), the output and the verification slack."""
  return (0 if seam.is_encoder_decoder(model) else prompt_len) + max_decode_len + slack(gamma)


# ---- the front door ------------------------------------------------------------------------------
def check_prompts(inputs_BxP, pad_id: int = 0) -> None:
  """Refuses a pad id inside a prompt: rows are right-padded, so a pad followed by a real token
  would be read as the end of the prompt (decoder-only: the tokens after it silently dropped; T5:
  masked out of the encoder). Skipped for traced or not fully addressable arrays (their rows were
  checked where they were made)."""
  if isinstance(inputs_BxP, jax.core.Tracer) or (
      isinstance(inputs_BxP, jax.Array) and not inputs_BxP.is_fully_addressable):
    return
  x = np.asarray(inputs_BxP)
  real_BxP = x != pad_id
  real_after_BxP = np.flip(np.cumsum(np.flip(real_BxP, axis=1), axis=1), axis=1) - real_BxP
  bad = np.argwhere(~real_BxP & (real_after_BxP > 0))
  if bad.size:
    b, i = (int(v) for v in bad[0])
    raise ValueError(
        f"prompt row {b} holds the pad id {pad_id} at position {i}, before real tokens "
        f"({x[b, :i + 2].tolist()}...): prompts are right-padded with {pad_id}, so the rest of "
        f"the row would be dropped; remove id {pad_id} from the prompt ({len(bad)} such position(s) "
        "in this batch)")


def check_decode_args(target: seam.Decodable, *, draft: Optional[seam.Decodable] = None,
                      gamma: int, sampling: SamplingConfig, max_decode_len: int, prompt_len: int,
                      cache_len: int | None) -> None:
  """Raises a ValueError (or TypeError) naming the problem, before anything is compiled.

  gamma: drafts per iteration (the adaptive loop's gamma_max); 0 for the autoregressive loop.
  """
  if not isinstance(sampling, SamplingConfig):
    raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
  seam.check(target, "target")
  if seam.shares_encoder(target):
    raise ValueError("the target is a shared-encoder draft (no encoder of its own): it cannot "
                     "decode alone; use it as the draft of the target whose encoder it reads")
  if draft is not None:
    seam.check_pair(target, draft)
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
      raise ValueError(f"gamma (draft tokens per iteration) must be an integer >= 1, got "
                       f"{gamma!r}")
  if max_decode_len < 1:
    raise ValueError(f"max_decode_len must be >= 1, got {max_decode_len}")
  needed = cache_len_needed(target, prompt_len, max_decode_len, gamma)
  if cache_len is not None and needed > cache_len:
    raise ValueError(
        f"prompt of length {prompt_len} plus max_decode_len {max_decode_len} (+ {slack(gamma)} "
        f"slots of verification slack) needs {needed} cache slots, but the cache has "
        f"{cache_len}; shorten the prompt or raise the cache length")


def front_door(target: seam.Decodable, inputs_BxP, rng=None, *,
               draft: Optional[seam.Decodable] = None, gamma: int = 0,
               sampling: SamplingConfig, max_decode_len: int, cache_len: int | None = None,
               rule: str | None = None) -> tuple[Any, jax.Array]:
  """Every check of a decode call, then (int32 inputs, rng). `inputs_BxP` keeps its placement
  (a host array stays on the host for the sharded programs to place)."""
  from specdec_jax.decoding import acceptance  # pylint: disable=import-outside-toplevel
  check_decode_args(target, draft=draft, gamma=gamma, sampling=sampling,
                    max_decode_len=max_decode_len, prompt_len=np.shape(inputs_BxP)[1],
                    cache_len=cache_len)
  check_prompts(inputs_BxP, target.pad_id)
  if rule is not None:
    acceptance.get_rule(rule)
  if not isinstance(inputs_BxP, jax.Array):
    inputs_BxP = np.asarray(inputs_BxP, np.int32)
  elif inputs_BxP.dtype != jnp.int32:
    inputs_BxP = inputs_BxP.astype(jnp.int32)
  return inputs_BxP, (jax.random.key(0) if rng is None else rng)


# ---- the initial state ---------------------------------------------------------------------------
def init_state(target: seam.Decodable, target_params, inputs_BxP: jax.Array, rng: jax.Array, *,
               max_decode_len: int, gamma: int = 0, cache_len: int | None = None,
               draft: Optional[seam.Decodable] = None, draft_params=None) -> st.DecodeState:
  """Prefills the target (and the draft) and lays out the buffer: slot 0 = the start token.

  Traceable (called inside the jitted programs). `gamma` sizes the slack and the per-position
  counters (0: the autoregressive loop; the adaptive loop passes gamma_max).
  """
  batch, plen = inputs_BxP.shape
  # A shared-encoder draft decodes on the target's encoder output: encode once, for both.
  encoded = (target.encode(target_params, inputs_BxP)
             if draft is not None and seam.shares_encoder(draft) else None)
  cache = target.prefill(target_params, inputs_BxP,
                         cache_len or cache_len_needed(target, plen, max_decode_len, gamma),
                         encoded=encoded)
  tokens_BxL = jnp.zeros((batch, max_decode_len + slack(gamma)), jnp.int32)
  tokens_BxL = tokens_BxL.at[:, 0].set(target.start_tokens(inputs_BxP))
  state = st.DecodeState(tokens_BxL=tokens_BxL, num_B=jnp.ones((batch,), jnp.int32),
                         done_B=jnp.zeros((batch,), bool), base_B=cache.index_B,
                         target_cache=cache, rng=rng, counters=st.Counters.zeros(batch, gamma))
  if draft is None:
    return state
  draft_cache = draft.prefill(draft_params, inputs_BxP,
                              cache_len or cache_len_needed(draft, plen, max_decode_len, gamma),
                              encoded=encoded)
  return state.replace(draft_cache=draft_cache, draft_pending_B=jnp.zeros((batch,), bool),
                       bonus_p_BxV=jnp.zeros((batch, target.vocab_size), jnp.float32))
