"""The feature chain scheme: a feature-level draft (EAGLE-3 style) drafts gamma tokens from the
target's own hidden states, and the target's verify call gives the next ones.

A `Decoder` scheme like `speculative.Chain`, composing the same verify rule and `commit`. What
differs is what the draft reads (coordinates: `models/feature_draft.py`; entry j = (g_j, y_{j+1})
predicts y_{j+2}):
- verify is `extend_with_hidden` over [last, x_1..x_G]: p and the target's states h at the
  block's positions from the same call (no second target call);
- after acceptance, the entries of every newly written position (the accepted drafts and the
  next token: count = n + 1 per row) are pending: their fused features fuse(h) ride in the
  state (`FeatureCarry`, the scheme's `stats`) and the draft's cache is rolled back to before
  them (EAGLE's "draft extend": every accepted position, not only the last);
- the next iteration's first draft call feeds those pending entries in one static-shape call of
  G + 1 entries (rolled back past the unused ones); its output at the last pending entry is q
  for x_1, and its output feature stands in for the target's state of the next position: the
  gamma - 1 further calls feed (own feature, x_i), one entry each. So the draft costs gamma calls
  per iteration, as the chain's draft does.
- The first iteration: a decoder-only target's prefill returns the prompt's states
  (`prefill_with_hidden`) and `prime_carry` feeds the prompt's entries, the last one pending,
  so the draft starts from the whole prompt. A T5 request (and a one-token prompt) has no target
  state yet (count 0): the first call feeds (zeros, the start token) and drafts from that;
  verification keeps the output exact whatever it proposes.
alpha here covers the drafted positions only (the chain also scores the bonus position, from an
extra fed token this scheme has no reason to feed); tokens per target call compare directly.

Who picks the scheme: `draft_schemes.chain_for(draft, gamma)`, the one place that tells a
feature-level draft (`is_feature_draft`: it has `extend_features`) from a token draft, and the
feature chain from its parallel variant (`feature_parallel.py`), so the runner's decode, its
calibration decode, its loop timing and the API all build the same program for a draft. `LoneStep` puts the draft's
one-entry step behind `extend` for the lone-extend timer (c).
"""
from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import seam
from specdec_jax.decoding import acceptance as acc
from specdec_jax.decoding import state as st
from specdec_jax.decoding.sampling import SamplingConfig, argmax, process_logits, sample
from specdec_jax.decoding.speculative import GREEDY_RULES, Proposal, commit, greedy_commit


@flax.struct.dataclass
class FeatureCarry:
  """The draft entries the target has verified but the draft has not been fed yet.

  g_BxG1xD: fused target features of up to G + 1 pending entries (zeros at the start).
  count_B: how many are pending (the tokens written by the last iteration; 0 at the start).
  """

  g_BxG1xD: jax.Array
  count_B: jax.Array


def prime_carry(draft, draft_params, cache, inputs_BxP: jax.Array, hidden_BxTxnxD: jax.Array,
                carry: FeatureCarry):
  """Decoder-only: the prompt's entries in the draft's cache, its last one pending: (cache,
  carry).

  `cache`: the draft's `prefill` (index = the start token's slot, len - 1); `hidden_BxTxnxD`:
  the target's states at the prompt's first P - 1 slots (its prefill, `prefill_with_hidden`). Entry s = (fuse(h_s), t_{s+1}) at slot s, as the target verified it;
  entries 0..len - 3 are fed here in one call, entry len - 2 becomes the one pending entry (its
  output is q for the first drafted token, the token after the prompt), so the first iteration
  drafts from the whole prompt, as training saw it (`training.feature_draft`: every entry from
  position 0), not from a start entry alone. A one-token prompt keeps the start entry (count 0).
  Rows are right-padded: the entries past a shorter row's prompt sit at or past its index,
  where nothing reads them before they are overwritten."""
  plen = inputs_BxP.shape[1]
  if plen < 2:
    return cache, carry
  start_B = cache.index_B  # the draft's prefill: the start token's slot, len - 1
  g_BxTxD = draft.fuse(draft_params, hidden_BxTxnxD).astype(jnp.float32)
  if plen > 2:
    _, cache = draft.feed_features(draft_params, cache.rollback(jnp.zeros_like(start_B)),
                                   inputs_BxP[:, 1:plen - 1], g_BxTxD[:, :plen - 2])
    cache = cache.rollback(start_B)
  primed_B = start_B >= 1
  last_BxD = jnp.take_along_axis(g_BxTxD, jnp.clip(start_B - 1, 0, plen - 2)[:, None, None],
                                 axis=1)[:, 0]
  last_BxD = jnp.where(primed_B[:, None], last_BxD, carry.g_BxG1xD[:, 0])
  return cache, FeatureCarry(carry.g_BxG1xD.at[:, 0].set(last_BxD), primed_B.astype(jnp.int32))


def first_draft_call(draft, draft_params, state: st.DecodeState, carry: FeatureCarry):
  """Feeds the pending entries; (logits for x_1 [B, V], its output feature [B, D], cache)."""
  g1 = carry.g_BxG1xD.shape[1]
  count_B = carry.count_B
  c_B = jnp.maximum(count_B, 1)
  idx_BxG1 = jnp.clip(state.num_B[:, None] - c_B[:, None] + jnp.arange(g1)[None, :], 0,
                      state.tokens_BxL.shape[1] - 1)
  tokens_BxG1 = jnp.take_along_axis(state.tokens_BxL, idx_BxG1, axis=1)
  start_B = state.base_B + state.num_B - 1
  cache = state.draft_cache.rollback(start_B - count_B)
  out_BxG1xD, cache = draft.feed_features(draft_params, cache, tokens_BxG1, carry.g_BxG1xD)
  return (*last_output(draft, draft_params, out_BxG1xD, c_B - 1), cache.rollback(start_B))


def last_output(draft, draft_params, out_BxTxD: jax.Array, last_B: jax.Array):
  """(logits [B, V], output feature [B, D]) at entry last_B of a call's output features: the
  head applied to that entry alone (`FeatureDraft.logits` after `feed_features`), not to
  every fed one: on CPU the head is most of a draft step."""
  out_BxD = jnp.take_along_axis(out_BxTxD, last_B[:, None, None], axis=1)[:, 0]
  return draft.logits(draft_params, out_BxD[:, None])[:, 0], out_BxD


def draft_step(draft, draft_params, state: st.DecodeState, carry: FeatureCarry, key: jax.Array,
               gamma: int, sampling: SamplingConfig) -> tuple[Proposal, object]:
  """gamma draft calls: the pending entries, then (own feature, x_i) one at a time."""
  logits_BxV, out_BxD, cache = first_draft_call(draft, draft_params, state, carry)
  return chain_from(draft, draft_params, logits_BxV, out_BxD, cache, key, gamma, sampling)


def chain_from(draft, draft_params, logits_BxV: jax.Array, out_BxD: jax.Array, cache,
               key: jax.Array, gamma: int, sampling: SamplingConfig) -> tuple[Proposal, object]:
  """The chain after the draft's first call of an iteration (its logits for x_1 and output
  feature, the cache rolled back to the last verified slot): x_1 ~ q_1, then gamma - 1 calls
  fed (own feature, x_i). Shared with the lookup-or-feature scheme (`lookup_feature.py`), whose
  first call may first catch up on entries prompt lookup's iterations left pending."""
  keys = jax.random.split(key, gamma)
  q_BxV = process_logits(logits_BxV, sampling)
  x_B = sample(keys[0], q_BxV)

  def one(c, key_i):
    cache, x_B, g_BxD = c
    logits_Bx1xV, out_Bx1xD, cache = draft.extend_features(draft_params, cache, x_B[:, None],
                                                           g_BxD[:, None])
    q_BxV = process_logits(logits_Bx1xV[:, 0], sampling)
    x_next = sample(key_i, q_BxV)
    return (cache, x_next, out_Bx1xD[:, 0]), (x_next, q_BxV)

  (cache, _, _), (xs_GxB, qs_GxBxV) = jax.lax.scan(one, (cache, x_B, out_BxD), keys[1:])
  tokens_BxG = jnp.concatenate([x_B[:, None], xs_GxB.T], axis=1)
  q_BxGxV = jnp.concatenate([q_BxV[:, None], jnp.moveaxis(qs_GxBxV, 0, 1)], axis=1)
  gamma_B = jnp.full(x_B.shape, gamma, jnp.int32)
  # fed_B = gamma + 1: the accepted drafts are always fed next iteration with the target's
  # features, so `commit` never marks the draft pending; no bonus q (see the module docstring).
  return Proposal(tokens_BxG, q_BxGxV, proposed_B=gamma_B, fed_B=gamma_B + 1,
                  bonus_q_BxV=jnp.zeros_like(q_BxV)), cache


def greedy_draft_step(draft, draft_params, state: st.DecodeState, carry: FeatureCarry,
                      gamma: int) -> tuple[Proposal, object]:
  """`draft_step` at temperature 0 as token ids (`speculative.greedy_draft_step`'s twin): each
  x_i is the draft's argmax, the token `sample(process_logits(.))` gives there, without the
  one-hot q rows (Proposal.q_BxGxV None; `verify_commit` then takes the token-id path)."""
  logits_BxV, out_BxD, cache = first_draft_call(draft, draft_params, state, carry)

  def one(c, _):
    cache, x_B, g_BxD = c
    logits_Bx1xV, out_Bx1xD, cache = draft.extend_features(draft_params, cache, x_B[:, None],
                                                           g_BxD[:, None])
    x_next = argmax(logits_Bx1xV[:, 0].astype(jnp.float32))
    return (cache, x_next, out_Bx1xD[:, 0]), x_next

  x_B = argmax(logits_BxV.astype(jnp.float32))
  (cache, _, _), xs_GxB = jax.lax.scan(one, (cache, x_B, out_BxD), None, length=gamma - 1)
  gamma_B = jnp.full(x_B.shape, gamma, jnp.int32)
  return Proposal(jnp.concatenate([x_B[:, None], xs_GxB.T], axis=1), None, proposed_B=gamma_B,
                  fed_B=gamma_B + 1, bonus_q_BxV=None), cache


def verify_with_hidden(target, target_params, cache, last_B: jax.Array,
                       draft_tokens_BxG: jax.Array, layers, sampling: SamplingConfig):
  """One target call over [last, x_1..x_G]: (processed p [B, G+1, V], states [B, G+1, n, D],
  cache)."""
  block_BxG1 = jnp.concatenate([last_B[:, None], draft_tokens_BxG], axis=1)
  logits_BxG1xV, hidden, cache = target.extend_with_hidden(target_params, cache, block_BxG1,
                                                           layers)
  return process_logits(logits_BxG1xV, sampling), hidden, cache


@dataclasses.dataclass(frozen=True)
class FeatureChain:
  """Draft `gamma` tokens per iteration with a feature-level draft of output width `width`
  (`models.feature_draft.FeatureDraft`; `for_draft` reads it), verify them in one target call
  that also returns the target's states. Hashable: a static part of the `Decoder`."""

  gamma: int = 4
  width: int = 0

  needs_draft = True
  stats_batched = True  # FeatureCarry is per example: batch-sharded on a mesh (`Decoder`)
  # Temperature 0 with an exact rule: draft and verify as token ids (`greedy_draft_step`); a
  # subclass whose `propose` drafts otherwise (the parallel draft) sets False.
  greedy_ids = True

  def __post_init__(self):
    if not isinstance(self.gamma, int) or isinstance(self.gamma, bool) or self.gamma < 1:
      raise ValueError(f"gamma must be an integer >= 1, got {self.gamma!r}")
    if self.width < 1:
      raise ValueError(f"width (the feature draft's width) must be >= 1, got {self.width}; "
                       "use FeatureChain.for_draft(draft, gamma)")

  @classmethod
  def for_draft(cls, draft, gamma: int) -> "FeatureChain":
    return cls(gamma=gamma, width=draft.width)

  def init_stats(self, batch: int) -> FeatureCarry:
    return FeatureCarry(jnp.zeros((batch, self.gamma + 1, self.width), jnp.float32),
                        jnp.zeros((batch,), jnp.int32))

  def prime(self, draft, draft_params, cache, inputs_BxP, hidden_BxTxnxD, carry):
    """Decoder-only targets: the draft starts from the prompt's target states (`prime_carry`;
    `start.init_state` calls it with the target's `prefill_with_hidden`)."""
    return prime_carry(draft, draft_params, cache, inputs_BxP, hidden_BxTxnxD, carry)

  def propose(self, draft, draft_params, state, carry, key, sampling):
    """The iteration's draft tokens and their q: gamma chained calls (`draft_step`)."""
    return draft_step(draft, draft_params, state, carry, key, self.gamma, sampling)

  def check(self, decoder) -> None:
    """A feature-level draft and a target that gives its states (`start.check_decoder`)."""
    check_feature_pair(decoder, type(self).__name__)

  def iteration(self, decoder, params, state: st.DecodeState) -> st.DecodeState:
    """Draft (pending entries, then own features) -> verify with states -> accept -> commit,
    then the newly written positions' fused target features become the pending entries."""
    draft = decoder.draft
    rng, k_draft, k_accept = jax.random.split(state.rng, 3)
    carry = state.stats
    if self.greedy_ids and decoder.sampling.greedy and decoder.rule in GREEDY_RULES:
      proposal, draft_cache = greedy_draft_step(draft, params.draft, state, carry, self.gamma)
    else:
      proposal, draft_cache = self.propose(draft, params.draft, state, carry, k_draft,
                                           decoder.sampling)
    new, g_BxG1xD = verify_commit(decoder, params, state.replace(rng=rng), proposal,
                                  draft_cache, k_accept)
    return new.replace(stats=next_carry(state, new, g_BxG1xD, carry),
                       draft_cache=draft_cache.rollback(state.base_B + state.num_B - 1))


def next_carry(state: st.DecodeState, new: st.DecodeState, g_BxG1xD: jax.Array,
               carry: FeatureCarry) -> FeatureCarry:
  """The pending entries after an iteration (`state` before it, `new` after `commit`): every
  newly written position's fused target feature, for the rows that were active."""
  active_B = ~state.done_B
  return FeatureCarry(jnp.where(active_B[:, None, None], g_BxG1xD, carry.g_BxG1xD),
                      jnp.where(active_B, new.num_B - state.num_B, carry.count_B))


def verify_commit(decoder, params, state: st.DecodeState, proposal: Proposal, draft_cache,
                  key: jax.Array) -> tuple[st.DecodeState, jax.Array]:
  """The feature schemes' verify -> accept -> commit: (the state after `commit`, the fused
  target features of the block's positions [B, G + 1, D], float32). `state` holds this
  iteration's rng; `draft_cache` is the draft's after its calls. A proposal without q rows
  (`greedy_draft_step`) is verified as token ids (`speculative.greedy_commit`): the same tokens,
  counters and state, the bonus column's beta 0 as the general path's zero bonus q gives it."""
  target, tokens_BxG = decoder.target, proposal.tokens_BxG
  state = state.replace(draft_cache=draft_cache)
  if proposal.q_BxGxV is None:
    block_BxG1 = jnp.concatenate([st.last_tokens(state)[:, None], tokens_BxG], axis=1)
    logits_BxG1xV, hidden, target_cache = target.extend_with_hidden(
        params.target, state.target_cache, block_BxG1, decoder.draft.feature_layers)
    new = greedy_commit(state.replace(target_cache=target_cache), proposal,
                        argmax(logits_BxG1xV.astype(jnp.float32)), None,
                        logits_BxG1xV.shape[-1], target.eos_id, decoder.max_decode_len)
  else:
    p_BxG1xV, hidden, target_cache = verify_with_hidden(
        target, params.target, state.target_cache, st.last_tokens(state), tokens_BxG,
        decoder.draft.feature_layers, decoder.sampling)
    n_B, next_B = acc.get_rule(decoder.rule)(key, tokens_BxG, proposal.q_BxGxV, p_BxG1xV)
    new = commit(state.replace(target_cache=target_cache), proposal, n_B, next_B, p_BxG1xV,
                 target.eos_id, decoder.max_decode_len)
  return new, decoder.draft.fuse(params.draft, hidden).astype(jnp.float32)


def check_feature_pair(decoder, scheme: str) -> None:
  """Raises a TypeError naming what a feature scheme misses: a feature-level draft, a target
  with `extend_with_hidden` and, decoder-only, `prefill_with_hidden` (the prompt's states)."""
  if not is_feature_draft(decoder.draft):
    raise TypeError(f"{scheme} drafts with a feature-level draft (extend_features), got "
                    f"{type(decoder.draft).__name__} (a token draft's schemes: Chain, "
                    "TreeScheme)")
  needs = ["extend_with_hidden"] + ([] if seam.is_encoder_decoder(decoder.target)
                                    else ["prefill_with_hidden"])
  missing = [m for m in needs if not hasattr(decoder.target, m)]
  if missing:
    raise TypeError(f"{scheme} needs a target with {' and '.join(missing)} (the target's "
                    f"states), {type(decoder.target).__name__} has none")


def is_feature_draft(draft) -> bool:
  """Whether `draft` drafts from the target's features (`extend_features`), not from tokens."""
  return hasattr(draft, "extend_features")


@dataclasses.dataclass(frozen=True)
class LoneStep(seam.Delegate):
  """A feature-level draft whose `extend` is one `extend_features` call with zero features.

  Why: the lone-extend timer (`timing.measure_costs_many`, the record's `c`) times a draft's
  T = 1 step through `extend`, which a feature draft refuses. The step costs the same whatever
  the features hold (the fusion is part of the verify side), so zeros time it exactly."""

  def extend(self, params, cache, tokens_BxT):
    g_BxTxD = jnp.zeros(tokens_BxT.shape + (self.base.width,), jnp.float32)
    logits_BxTxV, _, cache = self.base.extend_features(params, cache, tokens_BxT, g_BxTxD)
    return logits_BxTxV, cache


def timed_as_extend(draft):
  """`draft` as the lone-extend timer drives it (`LoneStep` for a feature draft)."""
  return LoneStep(draft) if is_feature_draft(draft) else draft
