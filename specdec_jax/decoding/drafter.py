"""The Drafter seam: how every scheme asks a draft for tokens, whatever the draft reads.

Why one seam: each scheme says *which* tokens to draft and verify (a chain, a per-row length, a
tree level by level); how a draft is called, what the verify call must also return for it, and
how the verified positions reach it again is the draft's business. Two drafters cover every
draft, so each scheme is written once:

- `TokenDrafter`: any `seam.Decodable` (a model, the n-gram tables, prompt lookup); its state is
  its cache. After a fully accepted block it has not seen the last drafted token, which its next
  first call feeds (`token_first_call`); that call's first output is its q at the bonus position.
- `FeatureDrafter`: a feature-level draft (EAGLE style, `models.feature_draft.FeatureDraft`)
  reading the target's states: the verify call returns them (`extend_with_hidden`) and the
  verified positions become the draft's *pending entries* (`FeatureCarry`, in
  `DecodeState.draft_carry`), fed in the next first call; so it is never left pending and scores
  no bonus position. Its options are decoding choices, not schemes: `parallel` (a chain's block
  from one call) and, in `decoding.lookup_feature`, prompt lookup where the history matches.

The protocol (all traceable; `decoder` is the `Decoder`, `dparams` the draft's params):
- `check(decoder)`: what this drafter needs of the pair and the scheme (named errors).
- `init_carry(decoder, state, inputs_BxP)`: its per-row state (None for a token drafter);
  `prime(...)`: with a decoder-only target, that state after the prompt's target states.
- `prefill(decoder, dparams, inputs_BxP, cache_len, encoded, target_cache)` (optional; without
  it the draft prefills the prompt itself): the draft's cache after the prompt. A
  `TokenDrafter(prompt_cache='target')` takes the target's own (a self-draft: see there); one
  with 'shared' has none (None): it drafts in the target's (`shares_target_cache`, a chain's
  `speculative.handoff`).
- `first_call(decoder, dparams, state)` -> (logits for x_1 [B, V], logits at the previous bonus
  position [B, V] or None, output features [B, 1, D] or None, cache rolled back to the last
  verified slot).
- `step(decoder, dparams, cache, tokens_BxT, g_BxTxD, offsets, visible)` -> (logits [B, T, V],
  output features or None, cache): a draft call over T tokens, each fed its parent's output
  feature `g` (a feature drafter); `offsets` / `visible` lay out a tree level.
- `propose(decoder, dparams, state, key)` -> (`Proposal`, cache, carry): a chain's gamma tokens.
- `verify(decoder, tparams, cache, tokens_BxT, offsets, visible)` -> (raw logits, target states
  or None, cache): the one target call.
- `observe(decoder, dparams, before, new, hidden, carry)`: the state after `commit` with the
  newly written positions' target states turned into pending entries.
- `summary(carry)`: the result's `draft_stats` (None but for the lookup-first drafters).
- `chooses_per_batch` (False unless set): one choice per iteration for the whole batch (the
  lookup-first drafters), so a calibration decodes it in the run's batch shape.
- `cache_slack`: draft cache slots past the target's a drafter's widest feed may write into (0
  but for `LookupFeatureDrafter`, whose catch-up feeds `catchup_width` entries from the oldest
  pending one); `start.init_state` sizes the draft's cache with them, so no write falls past its
  end (the kernels' in-place write refuses one; XLA's scatter would drop it).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import seam
from specdec_jax.decoding import prompt_cache
from specdec_jax.decoding import state as st
from specdec_jax.decoding.feature_entries import (FeatureCarry, block_logits, feature_first_call,
                                                  is_feature_draft, next_carry, prime_carry)
from specdec_jax.decoding.sampling import SamplingConfig, argmax, process_logits, sample
from specdec_jax.decoding.token_calls import shared_first_call, token_call, token_first_call


@flax.struct.dataclass
class Proposal:
  """What the draft proposed in one iteration, per row; `commit` needs nothing else of it.

  tokens_BxG: x_1..x_G (entries at positions >= proposed_B are junk the rule never keeps).
  q_BxGxV: the processed q_i (float32); computed for positions < fed_B. None: the temperature-0
    token-id path (no rows).
  proposed_B: tokens proposed (the fixed loop: gamma; the adaptive loop: its g_B <= gamma_max).
  fed_B: draft calls made this iteration. The draft has fed x_1..x_{fed-1}, so after n accepted
    tokens it has not yet seen x_n exactly when n == fed_B (it is then fed next iteration). A
    feature drafter sets gamma + 1: it is never pending.
  bonus_q_BxV: the processed q at the previous iteration's bonus position, from this iteration's
    first draft call (meaningful where the state's draft_pending_B; zeros for a feature drafter).
  """

  tokens_BxG: jax.Array
  q_BxGxV: jax.Array
  proposed_B: jax.Array
  fed_B: jax.Array
  bonus_q_BxV: jax.Array


def take_rows(x_BxLx, idx_BxK: jax.Array):
  """x's rows idx along axis 1 per batch row (None passes through: a token drafter's features)."""
  if x_BxLx is None:
    return None
  return jnp.take_along_axis(x_BxLx, idx_BxK.reshape(idx_BxK.shape + (1,) * (x_BxLx.ndim - 2)),
                             axis=1)


def chain_draft(drafter, decoder, dparams, state: st.DecodeState, key: jax.Array, gamma: int,
                sampling: SamplingConfig) -> tuple[Proposal, Any]:
  """gamma chained draft calls, x_i ~ q_i: the first call, then (x_i, its own feature) one at a
  time. (Proposal, cache)."""
  logits_BxV, bonus_logits_BxV, out_Bx1xD, cache = drafter.first_call(decoder, dparams, state)
  keys = jax.random.split(key, gamma)
  q_BxV = process_logits(logits_BxV, sampling)
  x_B = sample(keys[0], q_BxV)

  def one(c, key_i):
    cache, x_B, g_Bx1xD = c
    logits_Bx1xV, out_Bx1xD, cache = drafter.step(decoder, dparams, cache, x_B[:, None], g_Bx1xD)
    q_BxV = process_logits(logits_Bx1xV[:, 0], sampling)
    x_next = sample(key_i, q_BxV)
    return (cache, x_next, out_Bx1xD), (x_next, q_BxV)

  (cache, _, _), (xs_GxB, qs_GxBxV) = jax.lax.scan(one, (cache, x_B, out_Bx1xD), keys[1:])
  tokens_BxG = jnp.concatenate([x_B[:, None], xs_GxB.T], axis=1)
  q_BxGxV = jnp.concatenate([q_BxV[:, None], jnp.moveaxis(qs_GxBxV, 0, 1)], axis=1)
  gamma_B = jnp.full(x_B.shape, gamma, jnp.int32)
  bonus_q = (jnp.zeros_like(q_BxV) if bonus_logits_BxV is None
             else process_logits(bonus_logits_BxV, sampling))
  return Proposal(tokens_BxG, q_BxGxV, proposed_B=gamma_B,
                  fed_B=gamma_B + int(drafter.feeds_verified), bonus_q_BxV=bonus_q), cache


def greedy_chain_draft(drafter, decoder, dparams, state: st.DecodeState, gamma: int):
  """`chain_draft` at temperature 0, as token ids: (Proposal without q rows, the draft's argmax at
  the previous bonus position [B] or None (a feature drafter scores none), cache). Each x_i is
  `sample(process_logits(.))`'s token at temperature 0 (the first maximal entry)."""
  logits_BxV, bonus_logits_BxV, out_Bx1xD, cache = drafter.first_call(decoder, dparams, state)

  def one(c, _):
    cache, x_B, g_Bx1xD = c
    logits_Bx1xV, out_Bx1xD, cache = drafter.step(decoder, dparams, cache, x_B[:, None], g_Bx1xD)
    x_next = argmax(logits_Bx1xV[:, 0].astype(jnp.float32))
    return (cache, x_next, out_Bx1xD), x_next

  x_B = argmax(logits_BxV.astype(jnp.float32))
  (cache, _, _), xs_GxB = jax.lax.scan(one, (cache, x_B, out_Bx1xD), None, length=gamma - 1)
  gamma_B = jnp.full(x_B.shape, gamma, jnp.int32)
  proposal = Proposal(jnp.concatenate([x_B[:, None], xs_GxB.T], axis=1), None,
                      proposed_B=gamma_B, fed_B=gamma_B + int(drafter.feeds_verified),
                      bonus_q_BxV=None)
  bonus = None if bonus_logits_BxV is None else argmax(bonus_logits_BxV.astype(jnp.float32))
  return proposal, bonus, cache


# ---- token drafts (their calls: decoding/token_calls.py) ----------------------------------
@dataclasses.dataclass(frozen=True)
class TokenDrafter:
  """Drafts with a token draft (`seam.Decodable`): see the module docstring. `prompt_cache`:
  'auto' (the default), 'own' or 'target': whether the draft starts from the target's cache of
  the prompt instead of prefilling it (a self-draft; `decoding.prompt_cache` says why)."""

  prompt_cache: str = "auto"
  greedy_ids = True       # temperature 0 with an exact rule: draft and verify as token ids
  cache_slack = 0         # its feeds fit the verification slack (`start.slack`)

  @property
  def shares_target_cache(self) -> bool:
    """Drafts in the target's cache ('shared'; `speculative.handoff` verifies on its writes)."""
    return self.prompt_cache == "shared"

  @property
  def feeds_verified(self) -> bool:
    """Whether it sees every verified position without feeding it: in the target's cache
    ('shared') the verify call writes them; otherwise it feeds its own tokens, and a fully
    accepted block leaves the last one pending."""
    return self.shares_target_cache

  def check(self, decoder) -> None:
    if is_feature_draft(decoder.draft):
      raise TypeError(f"{type(decoder.draft).__name__} is a feature-level draft (it reads the "
                      "target's states); decode it with FeatureDrafter (the default for it)")
    prompt_cache.check(self.prompt_cache, decoder.target, decoder.draft)
    if self.shares_target_cache and not getattr(decoder.scheme, "chain", False):
      raise ValueError(f"prompt_cache='shared' drafts a chain in the target's cache; the "
                       f"{type(decoder.scheme).__name__} scheme drafts otherwise (use 'target')")

  def prefill(self, decoder, dparams, inputs_BxP, cache_len: int, encoded, target_cache):
    if self.shares_target_cache:
      return None  # no cache of its own
    if prompt_cache.reads_target_cache(self.prompt_cache, decoder.target, decoder.draft):
      return prompt_cache.target_start(target_cache, cache_len)
    return decoder.draft.prefill(dparams, inputs_BxP, cache_len, encoded=encoded)

  def init_carry(self, decoder, state, inputs_BxP):
    del decoder, state, inputs_BxP
    return None

  def first_call(self, decoder, dparams, state):
    if self.shares_target_cache:
      logits_BxV, cache = shared_first_call(decoder.draft, dparams, state)
      return logits_BxV, None, None, cache
    logits_BxV, bonus_BxV, cache = token_first_call(decoder.draft, dparams, state)
    return logits_BxV, bonus_BxV, None, cache

  def step(self, decoder, dparams, cache, tokens_BxT, g_BxTxD=None, offsets=None, visible=None):
    del g_BxTxD  # a token draft reads tokens only
    logits_BxTxV, cache = token_call(decoder.draft, dparams, cache, tokens_BxT, offsets, visible)
    return logits_BxTxV, None, cache

  def propose(self, decoder, dparams, state, key):
    proposal, cache = chain_draft(self, decoder, dparams, state, key, decoder.scheme.gamma,
                                  decoder.sampling)
    return proposal, cache, state.draft_carry

  def verify(self, decoder, tparams, cache, tokens_BxT, offsets=None, visible=None):
    logits_BxTxV, cache = token_call(decoder.target, tparams, cache, tokens_BxT, offsets, visible)
    return logits_BxTxV, None, cache

  def observe(self, decoder, dparams, before, new, hidden, carry):
    del decoder, dparams, before, hidden, carry
    return new

  def summary(self, carry):
    del carry
    return None


# ---- feature drafts (their entries: decoding/feature_entries.py) -------------------------------
def check_feature_pair(decoder, who: str) -> None:
  """Raises a TypeError naming what a feature drafter misses: a feature-level draft, a target
  with `extend_with_hidden` and, decoder-only, `prefill_with_hidden` (the prompt's states)."""
  if not is_feature_draft(decoder.draft):
    raise TypeError(f"{who} drafts with a feature-level draft (extend_features), got "
                    f"{type(decoder.draft).__name__} (a token draft decodes with TokenDrafter, "
                    "the default for it)")
  needs = ["extend_with_hidden"] + ([] if seam.is_encoder_decoder(decoder.target)
                                    else ["prefill_with_hidden"])
  missing = [m for m in needs if not hasattr(decoder.target, m)]
  if missing:
    raise TypeError(f"{who} needs a target with {' and '.join(missing)} (the target's "
                    f"states), {type(decoder.target).__name__} has none")


def parallel_draft(draft, dparams, state: st.DecodeState, carry: FeatureCarry, key: jax.Array,
                   gamma: int, sampling: SamplingConfig, mask_id: int):
  """One draft call: the pending entries and the masks; x_i ~ q_i, each from its own marginal."""
  logits_BxGxV, cache = block_logits(draft, dparams, state, carry, gamma, mask_id)
  q_BxGxV = process_logits(logits_BxGxV, sampling)
  keys = jax.random.split(key, gamma)
  tokens_BxG = jnp.stack([sample(keys[i], q_BxGxV[:, i]) for i in range(gamma)], axis=1)
  gamma_B = jnp.full(state.num_B.shape, gamma, jnp.int32)
  return Proposal(tokens_BxG, q_BxGxV, proposed_B=gamma_B, fed_B=gamma_B + 1,
                  bonus_q_BxV=jnp.zeros_like(q_BxGxV[:, 0])), cache


@dataclasses.dataclass(frozen=True)
class FeatureDrafter:
  """Drafts with a feature-level draft from the target's states (the module docstring).

  parallel: a chain's whole block from one draft call (mask entries of token `mask_id`; None:
  the draft's own `FeatureDraft.mask_id`, the token its block training used); chains only.
  Hashable.
  """

  parallel: bool = False
  mask_id: Optional[int] = None

  feeds_verified = True  # the verified positions are fed again with the target's states
  cache_slack = 0  # its feeds (pending entries, a chain's block) fit the verification slack

  @property
  def greedy_ids(self) -> bool:
    """Temperature 0 as token ids, except the parallel block (drawn from its q rows)."""
    return not self.parallel

  def check(self, decoder) -> None:
    check_feature_pair(decoder, type(self).__name__)
    if self.parallel and not getattr(decoder.scheme, "chain", False):
      raise ValueError(f"FeatureDrafter(parallel=True) drafts a chain's block in one call; the "
                       f"{type(decoder.scheme).__name__} scheme drafts otherwise (use Chain)")

  def init_carry(self, decoder, state, inputs_BxP) -> FeatureCarry:
    del inputs_BxP
    batch = state.num_B.shape[0]
    return FeatureCarry(jnp.zeros((batch, decoder.scheme.written, decoder.draft.width),
                                  jnp.float32), jnp.zeros((batch,), jnp.int32))

  def prime(self, decoder, dparams, cache, inputs_BxP, hidden_BxTxnxD, carry):
    return prime_carry(decoder.draft, dparams, cache, inputs_BxP, hidden_BxTxnxD, carry)

  def first_call(self, decoder, dparams, state):
    logits_BxV, out_BxD, cache = feature_first_call(decoder.draft, dparams, state,
                                                    state.draft_carry)
    return logits_BxV, None, out_BxD[:, None], cache

  def step(self, decoder, dparams, cache, tokens_BxT, g_BxTxD, offsets=None, visible=None):
    return decoder.draft.extend_features(dparams, cache, tokens_BxT, g_BxTxD, offsets=offsets,
                                         visible=visible)

  def propose(self, decoder, dparams, state, key):
    gamma, sampling = decoder.scheme.gamma, decoder.sampling
    if self.parallel:
      mask_id = self.mask_id if self.mask_id is not None else getattr(
          decoder.draft, "mask_id", decoder.draft.pad_id)
      proposal, cache = parallel_draft(decoder.draft, dparams, state, state.draft_carry, key,
                                       gamma, sampling, int(mask_id))
    else:
      proposal, cache = chain_draft(self, decoder, dparams, state, key, gamma, sampling)
    return proposal, cache, state.draft_carry

  def verify(self, decoder, tparams, cache, tokens_BxT, offsets=None, visible=None):
    return decoder.target.extend_with_hidden(tparams, cache, tokens_BxT,
                                             decoder.draft.feature_layers, offsets=offsets,
                                             visible=visible)

  def observe(self, decoder, dparams, before, new, hidden_BxKxnxD, carry):
    """The newly written positions' fused target states become the pending entries; the draft's
    cache is parked at the last slot verified before (the next first call feeds from there)."""
    g_BxKxD = decoder.draft.fuse(dparams, hidden_BxKxnxD).astype(jnp.float32)
    return new.replace(draft_carry=next_carry(before, new, g_BxKxD, carry),
                       draft_cache=new.draft_cache.rollback(before.base_B + before.num_B - 1))

  def summary(self, carry):
    del carry
    return None


def drafter_for(draft, drafter=None):
  """The drafter a decode uses: `drafter` if given, else the draft kind's default (None: none)."""
  if drafter is not None or draft is None:
    return drafter
  return FeatureDrafter() if is_feature_draft(draft) else TokenDrafter()
