"""Starting a decode: the front door's checks and the one initial-state builder.

Every `Decoder`, calibration and benchmark goes through these functions, so prompts, models and
cache lengths are judged the same way everywhere and the initial state is built once.

Why the slack: a verify call writes gamma + 1 tokens past the last kept one (into the cache, and
into the buffer possibly past `max_decode_len`), and the draft's first call of an iteration may
feed two tokens; `slack(gamma)` = gamma + 2 slots cover both (autoregressive: gamma = 0).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import seam
from specdec_jax.decoding import acceptance
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
  """Refuses a pad id inside a prompt: rows are right-padded, so a pad before a real token would
  end the prompt (decoder-only: the rest silently dropped; T5: masked out of the encoder). Skipped
  for traced or not fully addressable arrays (checked where they were made)."""
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


def check_decoder(decoder) -> None:
  """Raises a ValueError (or TypeError) naming the problem of a `Decoder`, before anything is
  compiled: the models against the seam and each other, the scheme against the draft, the
  sampling settings, the rule and the length."""
  if not isinstance(decoder.sampling, SamplingConfig):
    raise TypeError(f"sampling must be a SamplingConfig, got {type(decoder.sampling).__name__}")
  seam.check(decoder.target, "target")
  if seam.shares_encoder(decoder.target):
    raise ValueError("the target is a shared-encoder draft (no encoder of its own): it cannot "
                     "decode alone; use it as the draft of the target whose encoder it reads")
  needs_draft = decoder.scheme.needs_draft
  if needs_draft and decoder.draft is None:
    raise ValueError(f"the {type(decoder.scheme).__name__} scheme needs a draft; pass draft=...")
  if not needs_draft and decoder.draft is not None:
    raise ValueError(f"the {type(decoder.scheme).__name__} scheme decodes with the target alone "
                     "but a draft was given; choose a speculative scheme (e.g. Chain(gamma))")
  if decoder.draft is not None:
    seam.check_pair(decoder.target, decoder.draft)
  if decoder.drafter is not None:  # what the drafter needs of the pair (a feature draft: states)
    decoder.drafter.check(decoder)
  scheme_check = getattr(decoder.scheme, "check", None)  # a scheme's own needs (tree: masks)
  if scheme_check is not None:
    scheme_check(decoder)
  if not isinstance(decoder.max_decode_len, int) or decoder.max_decode_len < 1:
    raise ValueError(f"max_decode_len must be an integer >= 1, got {decoder.max_decode_len!r}")
  acceptance.get_rule(decoder.rule)


def check_cache_len(decoder, prompt_len: int) -> None:
  """Refuses a fixed `cache_len` too short for a prompt of `prompt_len` tokens."""
  gamma, cache_len = decoder.scheme.gamma, decoder.cache_len
  needed = cache_len_needed(decoder.target, prompt_len, decoder.max_decode_len, gamma)
  if cache_len is not None and needed > cache_len:
    raise ValueError(
        f"prompt of length {prompt_len} plus max_decode_len {decoder.max_decode_len} (+ "
        f"{slack(gamma)} slots of verification slack) needs {needed} cache slots, but the cache "
        f"has {cache_len}; shorten the prompt or raise the cache length")


def front_door(decoder, inputs_BxP, rng=None) -> tuple[Any, jax.Array]:
  """Every check of a decode call that depends on its prompts, then (int32 inputs, rng).
  `inputs_BxP` keeps its placement (a host array stays on the host for a sharded decode to
  place). The decoder itself was checked when it was made (`check_decoder`)."""
  check_cache_len(decoder, np.shape(inputs_BxP)[1])
  check_prompts(inputs_BxP, decoder.target.pad_id)
  if not isinstance(inputs_BxP, jax.Array):
    inputs_BxP = np.asarray(inputs_BxP, np.int32)
  elif inputs_BxP.dtype != jnp.int32:
    inputs_BxP = inputs_BxP.astype(jnp.int32)
  return inputs_BxP, (jax.random.key(0) if rng is None else rng)


# ---- the initial state ---------------------------------------------------------------------------
def primes_draft(decoder) -> bool:
  """Whether the draft starts from the prompt's target states: a drafter that can (`prime`: the
  feature-level drafters) with a decoder-only target, whose prefill feeds the prompt (a T5
  decoder's prefill feeds nothing). The target must then give them (`prefill_with_hidden`)."""
  return (decoder.drafter is not None and hasattr(decoder.drafter, "prime")
          and not seam.is_encoder_decoder(decoder.target))


def init_state(decoder, params, inputs_BxP: jax.Array, rng: jax.Array) -> st.DecodeState:
  """Prefills the target (and the draft) and lays out the buffer, slot 0 the start token
  (traceable). The scheme's `gamma` sizes the slack and the per-position counters."""
  target, draft, gamma = decoder.target, decoder.draft, decoder.scheme.gamma
  batch, plen = inputs_BxP.shape

  def cache_len(model):
    return decoder.cache_len or cache_len_needed(model, plen, decoder.max_decode_len, gamma)

  # A shared-encoder draft decodes on the target's encoder output: encode once, for both.
  encoded = (target.encode(params.target, inputs_BxP)
             if draft is not None and seam.shares_encoder(draft) else None)
  prime = primes_draft(decoder)
  if prime:  # a feature draft reads the prompt's target states, from the same prefill call
    cache, hidden = target.prefill_with_hidden(params.target, inputs_BxP, cache_len(target),
                                               tuple(draft.feature_layers))
  else:
    cache = target.prefill(params.target, inputs_BxP, cache_len(target), encoded=encoded)
  tokens_BxL = jnp.zeros((batch, decoder.max_decode_len + slack(gamma)), jnp.int32)
  tokens_BxL = tokens_BxL.at[:, 0].set(target.start_tokens(inputs_BxP))
  state = st.DecodeState(tokens_BxL=tokens_BxL, num_B=jnp.ones((batch,), jnp.int32),
                         done_B=jnp.zeros((batch,), bool), base_B=cache.index_B,
                         target_cache=cache, rng=rng, counters=st.Counters.zeros(batch, gamma),
                         stats=decoder.scheme.init_stats(batch))
  if draft is None:
    return state
  draft_len = cache_len(draft) + getattr(decoder.drafter, "cache_slack", 0)
  prefill = getattr(decoder.drafter, "prefill", None)  # a self-draft may take the target's cache
  draft_cache = (prefill(decoder, params.draft, inputs_BxP, draft_len, encoded, cache) if prefill
                 else draft.prefill(params.draft, inputs_BxP, draft_len, encoded=encoded))
  carry = decoder.drafter.init_carry(decoder, state, inputs_BxP)
  if prime:
    draft_cache, carry = decoder.drafter.prime(decoder, params.draft, draft_cache, inputs_BxP,
                                               hidden, carry)
  return state.replace(draft_cache=draft_cache, draft_pending_B=jnp.zeros((batch,), bool),
                       bonus_p_BxV=jnp.zeros((batch, target.vocab_size), jnp.float32),
                       draft_carry=carry)
