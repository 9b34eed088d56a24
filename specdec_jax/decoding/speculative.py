"""The chain scheme: gamma drafted tokens per iteration, draft -> verify -> accept -> commit.

A `Decoder` with `scheme=Chain(gamma)` runs `Chain.iteration` in its one `lax.while_loop`: the
drafter (`decoding.drafter`) proposes gamma tokens x_i ~ q_i (a `Proposal`); one target call
verifies [last, x_1..x_gamma] -> p_1..p_{gamma+1}; an acceptance rule gives the accepted count
and the next token; `commit` writes them, rolls both caches back and counts. The adaptive scheme
and the trees compose the same `commit` with their own draft and verify steps.

At temperature 0 with an exact rule (`GREEDY_RULES`: both keep exactly the leading drafts equal to
the target's argmax, then emit the target's argmax) the iteration carries token ids
(`drafter.greedy_chain_draft`, `greedy_accept`, `greedy_beta`): the same tokens, counters and
state, bit for bit, without the vocabulary-wide one-hot q rows, uniform draws, residuals and
min(p, q) sums, which inside the loop cost a large fraction of a draft call per drafted token.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax.decoding import acceptance as acc
from specdec_jax.decoding import state as st
from specdec_jax.decoding.drafter import Proposal, greedy_chain_draft
from specdec_jax.decoding.sampling import SamplingConfig, argmax, process_logits
from specdec_jax.seam import Cache

__all__ = ["Chain", "Proposal", "commit", "commit_with", "count", "draft_step", "greedy_accept",
           "greedy_commit", "handoff", "verify_step", "write_back", "GREEDY_RULES"]


def draft_step(decoder, draft_params, state: st.DecodeState, key: jax.Array
               ) -> tuple[Proposal, Cache]:
  """The chain's draft side, the drafter's `propose`: (Proposal, draft cache)."""
  proposal, cache, _ = decoder.drafter.propose(decoder, draft_params, state, key)
  return proposal, cache


def greedy_accept(tokens_BxG: jax.Array, target_BxG1: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Token-wise (and block) verification at temperature 0, from the target's argmax tokens
  [B, G + 1]: p_i(x_i) / q_i(x_i) is 1 where x_i is the target's argmax and 0 elsewhere, so the
  rule keeps the leading matches; the residual of two different one-hot rows is the target's,
  and after G matches the bonus draw is the target's argmax. (n [B], next token [B])."""
  n_B = acc.leading_count(tokens_BxG == target_BxG1[:, :-1])
  return n_B, jnp.take_along_axis(target_BxG1, n_B[:, None], axis=1)[:, 0]


def greedy_bonus_beta(state: st.DecodeState, bonus_draft_B: jax.Array | None) -> jax.Array:
  """beta at the previous call's bonus position at temperature 0: the state's one-hot row
  (zeros where not pending) read at the draft's argmax there; 0 for a scheme that scores no bonus
  position (None: its general path's q there is zero)."""
  if bonus_draft_B is None:
    return jnp.zeros(state.num_B.shape, jnp.float32)
  return jnp.take_along_axis(state.bonus_p_BxV, bonus_draft_B[:, None], axis=1)[:, 0]


def greedy_beta(state: st.DecodeState, tokens_BxG: jax.Array, target_BxG1: jax.Array,
                bonus_draft_B: jax.Array | None) -> jax.Array:
  """`commit`'s beta_BxG1 = sum_x min(p, q) at temperature 0: 1 where the draft's and the
  target's argmax agree, else 0; the bonus column as `greedy_bonus_beta`."""
  drafted_BxG = (tokens_BxG == target_BxG1[:, :-1]).astype(jnp.float32)
  return jnp.concatenate([greedy_bonus_beta(state, bonus_draft_B)[:, None], drafted_BxG], axis=1)


def greedy_commit(state: st.DecodeState, proposal: Proposal, target_BxG1: jax.Array,
                  bonus_draft_B: jax.Array | None, vocab: int, eos_id: int,
                  max_decode_len: int) -> st.DecodeState:
  """Accept and `commit` at temperature 0 from the target's argmax tokens [B, G + 1] (the
  chain's and the feature chain's token-id paths): `greedy_accept`, `greedy_beta`, the kept row
  one-hot at the next token."""
  n_B, next_B = greedy_accept(proposal.tokens_BxG, target_BxG1)
  beta_BxG1 = greedy_beta(state, proposal.tokens_BxG, target_BxG1, bonus_draft_B)
  p_n_BxV = jax.nn.one_hot(next_B, vocab, dtype=jnp.float32)
  return commit_with(state, proposal, n_B, next_B, beta_BxG1, p_n_BxV, eos_id, max_decode_len)


def handoff(drafter, state: st.DecodeState, draft_cache) -> tuple[Cache, Cache | None]:
  """(the cache the target verifies on, the draft cache the loop keeps) after the draft's calls.
  A drafter that drafts in the target's cache (`shares_target_cache`: a self-draft with
  prompt_cache 'shared') hands its writes on, rolled back to the last verified slot: the verify
  call writes every slot the draft wrote before anything reads it, and verifying on that buffer
  rather than the state's lets XLA write it in place (two live versions of one cache would be
  copied every iteration)."""
  if getattr(drafter, "shares_target_cache", False):
    return draft_cache.rollback(state.target_cache.index_B), None
  return state.target_cache, draft_cache


def verify_step(target, target_params, cache: Cache, last_B: jax.Array,
                draft_tokens_BxG: jax.Array, sampling: SamplingConfig
                ) -> tuple[jax.Array, Cache]:
  """One target call over [last, x_1..x_G]; returns processed p_Bx(G+1)xV (float32)."""
  block_BxG1 = jnp.concatenate([last_B[:, None], draft_tokens_BxG], axis=1)
  logits_BxG1xV, cache = target.extend(target_params, cache, block_BxG1)
  return process_logits(logits_BxG1xV, sampling), cache


def commit(state: st.DecodeState, proposal: Proposal, n_B: jax.Array, next_B: jax.Array,
           p_BxG1xV: jax.Array, eos_id: int, max_decode_len: int) -> st.DecodeState:
  """Writes x_1..x_n, next for active examples; rolls both caches back; counts what was written.
  `state` holds the caches after this iteration's draft and verify calls; n_B comes from the rule
  (n <= proposed_B). Tokens past EOS or the length limit are neither written nor counted."""
  gamma = proposal.tokens_BxG.shape[1]
  # beta = sum_x min(p, q) at the previous call's bonus position (its p kept in the state, its q
  # from this call's first draft call), then at each drafted position.
  bonus_beta_B = jnp.sum(jnp.minimum(state.bonus_p_BxV, proposal.bonus_q_BxV), axis=-1)
  drafted_beta_BxG = jnp.sum(jnp.minimum(p_BxG1xV[:, :gamma], proposal.q_BxGxV), axis=-1)
  beta_BxG1 = jnp.concatenate([bonus_beta_B[:, None], drafted_beta_BxG], axis=1)
  p_n_BxV = jnp.take_along_axis(p_BxG1xV, n_B[:, None, None], axis=1)[:, 0]
  return commit_with(state, proposal, n_B, next_B, beta_BxG1, p_n_BxV, eos_id, max_decode_len)


def commit_with(state: st.DecodeState, proposal: Proposal, n_B: jax.Array, next_B: jax.Array,
                beta_BxG1: jax.Array, p_n_BxV: jax.Array, eos_id: int, max_decode_len: int
                ) -> st.DecodeState:
  """`commit` given beta_BxG1 (see `count`) and p_n_BxV (the target's processed distribution at
  position n, kept where the draft is left pending): what the chain and its temperature-0 path
  (which has no q rows to compute them from) share."""
  gamma = proposal.tokens_BxG.shape[1]
  g_G1 = jnp.arange(gamma + 1, dtype=jnp.int32)
  padded_BxG1 = jnp.concatenate([proposal.tokens_BxG, jnp.zeros_like(next_B)[:, None]], axis=1)
  new_BxG1 = jnp.where(g_G1[None, :] == n_B[:, None], next_B[:, None], padded_BxG1)
  count_B, done_B = st.emit_count(new_BxG1, n_B + 1, state.num_B, state.done_B, eos_id,
                                  max_decode_len)
  num_B = state.num_B + count_B
  pending_B = jnp.where(state.done_B, state.draft_pending_B, n_B == proposal.fed_B)
  counters = count(state.counters, ~state.done_B, done_B, state.draft_pending_B, proposal,
                   jnp.minimum(n_B, count_B), count_B, beta_BxG1)
  return write_back(state, num_B, done_B, counters, pending_B, new_BxG1, count_B, p_n_BxV)


def write_back(state: st.DecodeState, num_B, done_B, counters: st.Counters, pending_B,
               new_BxK: jax.Array, count_B, p_last_BxV: jax.Array) -> st.DecodeState:
  """The loop state after a verified block, chain or tree (`tree.commit.commit_tree`): the new
  tokens written, both caches rolled back to the slot after the last kept token (the draft's one
  further while its last token is pending), the bonus distribution kept for a pending draft."""
  last_slot_B = state.base_B + num_B - 1
  return state.replace(
      tokens_BxL=st.write_tokens(state.tokens_BxL, state.num_B, new_BxK, count_B),
      num_B=num_B, done_B=done_B, counters=counters, draft_pending_B=pending_B,
      bonus_p_BxV=jnp.where(pending_B[:, None], p_last_BxV, 0.0),
      target_cache=state.target_cache.rollback(last_slot_B),
      draft_cache=None if state.draft_cache is None else  # None: it drafts in the target's
      state.draft_cache.rollback(last_slot_B - pending_B.astype(jnp.int32)))


def count(c: st.Counters, active_B: jax.Array, done_B: jax.Array, pending_B: jax.Array,
          proposal, kept_B: jax.Array, count_B: jax.Array, beta_BxG1: jax.Array
          ) -> st.Counters:
  """The counters after one target call, chain or tree, over the request's tokens only: in the
  call that ends an example (EOS or the length limit), proposals past its end are neither drafted
  nor accepted (so a draft identical to the target accepts every token it drafted).

  proposal: the `Proposal`, or anything with its `proposed_B` and `fed_B` (a tree passes its
    depth D for both: a per-path rate, `tree.commit.commit_tree`). accepts per position and the
    length histogram use the counters' own widths (a tree's N - 1 and N, of which D and D + 1 fill).
  beta_BxG1: sum_x min(p, q) at the previous call's bonus position (column 0, counted where the
    row was pending) and at the drafted positions (columns 1..G, a tree's path nodes by depth,
    counted where written and where the draft computed q: below fed_B, or below proposed_B for a
    scheme that never leaves its draft pending). So alpha covers every position a draft scored.
  """
  gamma = beta_BxG1.shape[1] - 1
  g_G1 = jnp.arange(gamma + 1, dtype=jnp.int32)
  g_P = jnp.arange(c.accepts_per_position_BxG.shape[1], dtype=jnp.int32)
  g_H = jnp.arange(c.accepted_length_hist_BxG1.shape[1], dtype=jnp.int32)
  act_B = active_B.astype(jnp.int32)
  ends_B = done_B & active_B
  drafted_B = jnp.where(ends_B, jnp.minimum(proposal.proposed_B, count_B), proposal.proposed_B)
  # A scheme that never leaves its draft pending (fed_B > gamma: the feature schemes) computed no
  # q past its proposed tokens: the adaptive feature chain's position g_b, written by a fresh
  # draw from p after g_b accepted drafts, is no drafted position.
  scored_B = jnp.where(proposal.fed_B > gamma, proposal.proposed_B, proposal.fed_B)
  drafted_mask_BxG = ((g_G1[None, :gamma] < jnp.minimum(count_B, gamma)[:, None])
                      & (g_G1[None, :gamma] < scored_B[:, None]))
  beta_mask_BxG1 = jnp.concatenate([(pending_B & active_B)[:, None], drafted_mask_BxG], axis=1)
  return c.replace(
      iterations=c.iterations + 1,
      target_calls_B=c.target_calls_B + act_B,
      drafted_B=c.drafted_B + drafted_B * act_B,
      accepted_B=c.accepted_B + kept_B,
      emitted_B=c.emitted_B + count_B,
      accepts_per_position_BxG=c.accepts_per_position_BxG + (
          g_P[None, :] < kept_B[:, None]).astype(jnp.int32),
      accepted_length_hist_BxG1=c.accepted_length_hist_BxG1 + (
          (g_H[None, :] == kept_B[:, None]) & active_B[:, None]).astype(jnp.int32),
      beta_sum_B=c.beta_sum_B + jnp.sum(jnp.where(beta_mask_BxG1, beta_BxG1, 0.0), axis=1),
      beta_count_B=c.beta_count_B + jnp.sum(beta_mask_BxG1, axis=1, dtype=jnp.int32))


# The rules whose temperature-0 result `greedy_accept` computes: the registered exact rules (a
# rule registered for a test, e.g. the exactness checker's deliberately wrong ones, keeps the
# general path and shows what it does).
GREEDY_RULES = ("tokenwise", "block")


@dataclasses.dataclass(frozen=True)
class Chain:
  """Draft a chain of `gamma` tokens per iteration, verify them in one target call.

  A decoding scheme (`decoder.Scheme`) with any drafter (`decoding.drafter`); `gamma` sizes the
  buffer slack and the per-position counters. Hashable: a static part of the Decoder.
  """

  gamma: int = 4

  def __post_init__(self):
    if not isinstance(self.gamma, int) or isinstance(self.gamma, bool) or self.gamma < 1:
      raise ValueError(f"gamma (draft tokens per iteration) must be an integer >= 1, got "
                       f"{self.gamma!r}")

  needs_draft = True
  chain = True  # a drafter's chain-only options (the parallel block) apply

  @property
  def written(self) -> int:
    """Tokens one iteration writes at most (a feature drafter's pending entries)."""
    return self.gamma + 1

  def init_stats(self, batch: int):
    del batch
    return None

  def iteration(self, decoder, params, state: st.DecodeState) -> st.DecodeState:
    """One draft -> verify -> accept -> commit iteration, then the drafter observes the verified
    positions (a feature drafter's pending entries)."""
    drafter = decoder.drafter
    rng, k_draft, k_accept = jax.random.split(state.rng, 3)
    if drafter.greedy_ids and decoder.sampling.greedy and decoder.rule in GREEDY_RULES:
      return self._greedy_iteration(decoder, params, state.replace(rng=rng))
    proposal, draft_cache, carry = drafter.propose(decoder, params.draft, state, k_draft)
    verify_on, draft_cache = handoff(drafter, state, draft_cache)
    block_BxG1 = jnp.concatenate([st.last_tokens(state)[:, None], proposal.tokens_BxG], axis=1)
    logits_BxG1xV, hidden, target_cache = drafter.verify(decoder, params.target, verify_on,
                                                         block_BxG1)
    p_BxG1xV = process_logits(logits_BxG1xV, decoder.sampling)
    n_B, next_B = acc.get_rule(decoder.rule)(k_accept, proposal.tokens_BxG, proposal.q_BxGxV,
                                             p_BxG1xV)
    new = commit(state.replace(rng=rng, target_cache=target_cache, draft_cache=draft_cache),
                 proposal, n_B, next_B, p_BxG1xV, decoder.target.eos_id, decoder.max_decode_len)
    return drafter.observe(decoder, params.draft, state, new, hidden, carry)

  def _greedy_iteration(self, decoder, params, state: st.DecodeState) -> st.DecodeState:
    """`iteration` at temperature 0 with an exact rule, as token ids (the module docstring):
    the same tokens, counters and state as the general path."""
    drafter = decoder.drafter
    proposal, bonus_draft_B, draft_cache = greedy_chain_draft(drafter, decoder, params.draft,
                                                              state, self.gamma)
    verify_on, draft_cache = handoff(drafter, state, draft_cache)
    block_BxG1 = jnp.concatenate([st.last_tokens(state)[:, None], proposal.tokens_BxG], axis=1)
    logits_BxG1xV, hidden, target_cache = drafter.verify(decoder, params.target, verify_on,
                                                         block_BxG1)
    new = greedy_commit(state.replace(target_cache=target_cache, draft_cache=draft_cache),
                        proposal, argmax(logits_BxG1xV.astype(jnp.float32)), bonus_draft_B,
                        logits_BxG1xV.shape[-1], decoder.target.eos_id, decoder.max_decode_len)
    return drafter.observe(decoder, params.draft, state, new, hidden, state.draft_carry)
