"""Adaptive draft length for a feature-level draft: the feature chain (`feature_chain`) drafting
a per-example number of tokens, as `adaptive` does for a token draft, in the same one loop.

Why: a feature-level draft's step costs a quarter to a third of the zoo target's step on this CPU
(c 0.25-0.37, docs/feature_draft.md), so a drafted token the target then rejects is expensive,
and how far the draft can be trusted changes along a sequence. The adaptive scheme's two
controls fit that: the schedule (+2 after a fully accepted block, -1 otherwise) and stopping
once the draft's top probability falls below `confidence_threshold`.

How: the pieces of the two schemes, composed. The first draft call is the feature chain's
(`feature_chain.first_draft_call`: the pending entries with the target's features), then an
inner `while_loop` of (own feature, x_i) calls that exits once every active row has stopped, so
a short block costs fewer draft calls. The target verifies the smallest compiled width >= the
longest active block (`adaptive.at_bucket`) and returns its states there (`extend_with_hidden`;
states past the width are zeros no pending count reaches). Positions >= g_b were not proposed:
`adaptive.masked_accept` (q = 0 there: a certain rejection, then a fresh draw from p at g_b), so
the output follows the target exactly under any rule: g_b depends only on the draft's own
tokens and distributions and on past iterations. The newly written positions' fused features
become the pending entries (`feature_chain.next_carry`), as in the chain.

Statistics: `AdaptiveFeatureStats` holds the chain's `FeatureCarry` (per example) and the
adaptive scheme's `AdaptiveStats` (draft calls, verified width, schedule, proposed lengths).
"""
from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.decoding import state as st
from specdec_jax.decoding.adaptive import (AdaptiveConfig, AdaptiveStats, at_bucket,
                                           draft_until_stopped, masked_accept, next_stats,
                                           pad_positions)
from specdec_jax.decoding.feature_chain import (FeatureCarry, check_feature_pair,
                                                first_draft_call, next_carry, prime_carry,
                                                verify_with_hidden)
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Proposal, commit


@flax.struct.dataclass
class AdaptiveFeatureStats:
  """carry: the feature chain's pending entries (per example); adaptive: the adaptive scheme's
  counters and schedule (`adaptive.AdaptiveStats`)."""

  carry: FeatureCarry
  adaptive: AdaptiveStats


def adaptive_feature_draft(draft, draft_params, state: st.DecodeState, carry: FeatureCarry,
                           sched_B: jax.Array, key: jax.Array, cfg: AdaptiveConfig,
                           sampling: SamplingConfig) -> tuple[Proposal, jax.Array, object]:
  """Up to gamma_max draft tokens per row: the pending entries, then (own feature, x_i) calls
  until every active row has stopped (`adaptive.draft_until_stopped`: its schedule reached, or
  a top probability below the threshold). (Proposal with proposed_B = g_B, draft calls made,
  cache); positions >= g_B hold tokens the rule never keeps."""
  logits_BxV, out_BxD, cache = first_draft_call(draft, draft_params, state, carry)

  def step(aux, x_B):
    cache, out_BxD = aux
    logits_Bx1xV, out_Bx1xD, cache = draft.extend_features(draft_params, cache, x_B[:, None],
                                                           out_BxD[:, None])
    return logits_Bx1xV[:, 0], (cache, out_Bx1xD[:, 0])

  x_BxG, q_BxGxV, g_B, calls, (cache, _) = draft_until_stopped(
      step, (cache, out_BxD), logits_BxV, state.done_B, sched_B, key, cfg, sampling)
  # fed_B = gamma_max + 1: the accepted drafts are fed next iteration with the target's
  # features, so `commit` never marks the draft pending; no bonus q (`feature_chain`).
  return Proposal(x_BxG, q_BxGxV, proposed_B=g_B, fed_B=jnp.full_like(g_B, cfg.gamma_max + 1),
                  bonus_q_BxV=jnp.zeros_like(q_BxGxV[:, 0])), calls, cache


def bucketed_verify_with_hidden(target, target_params, cache, last_B: jax.Array,
                                x_BxG: jax.Array, width: jax.Array, layers, cfg: AdaptiveConfig,
                                sampling: SamplingConfig):
  """`feature_chain.verify_with_hidden` at the smallest compiled width >= `width`: (p [B, G+1, V]
  padded uniform, states [B, G+1, n, D] padded with zeros, cache, the width used)."""
  g1 = cfg.gamma_max + 1

  def branch(w):
    def run(cache, last_B, x_BxG):
      p_BxWxV, hidden_BxWxnxD, cache = verify_with_hidden(target, target_params, cache, last_B,
                                                          x_BxG[:, :w], layers, sampling)
      return (pad_positions(p_BxWxV, g1, 1.0 / p_BxWxV.shape[2]),
              pad_positions(hidden_BxWxnxD, g1), cache)
    return run

  (p_BxG1xV, hidden_BxG1xnxD, cache), w_used = at_bucket(cfg, width, branch, cache, last_B,
                                                         x_BxG)
  return p_BxG1xV, hidden_BxG1xnxD, cache, w_used


@dataclasses.dataclass(frozen=True)
class AdaptiveFeatureChain:
  """A per-example draft length (`config`: the adaptive scheme's `AdaptiveConfig`) with a
  feature-level draft of output width `width`. Hashable: a static part of the `Decoder`.
  `draft_schemes.scheme_for(draft, AdaptiveConfig(...))` makes one for a feature draft."""

  config: AdaptiveConfig = AdaptiveConfig()
  width: int = 0

  needs_draft = True

  def __post_init__(self):
    if not isinstance(self.config, AdaptiveConfig):
      raise TypeError(f"config must be an AdaptiveConfig, got {type(self.config).__name__}")
    if self.width < 1:
      raise ValueError(f"width (the feature draft's width) must be >= 1, got {self.width}; "
                       "use AdaptiveFeatureChain.for_draft(draft, config)")

  @classmethod
  def for_draft(cls, draft, config: AdaptiveConfig) -> "AdaptiveFeatureChain":
    return cls(config=config, width=draft.width)

  @property
  def gamma(self) -> int:
    """Buffers, slack and counters are sized for gamma_max."""
    return self.config.gamma_max

  def init_stats(self, batch: int) -> AdaptiveFeatureStats:
    carry = FeatureCarry(jnp.zeros((batch, self.gamma + 1, self.width), jnp.float32),
                         jnp.zeros((batch,), jnp.int32))
    return AdaptiveFeatureStats(carry, AdaptiveStats.zeros(batch, self.config))

  def constrain_stats(self, stats: AdaptiveFeatureStats, constrain) -> AdaptiveFeatureStats:
    """On a mesh (`Decoder._constrain`): the pending entries and the schedule are per example
    (batch-sharded); the call counts and the length histogram are sums (left as they are)."""
    return stats.replace(carry=jax.tree.map(constrain, stats.carry),
                         adaptive=stats.adaptive.replace(
                             gamma_B=constrain(stats.adaptive.gamma_B)))

  def prime(self, draft, draft_params, cache, inputs_BxP, hidden_BxTxnxD, stats):
    """Decoder-only targets: the draft starts from the prompt's target states, as the chain's
    (`feature_chain.prime_carry`)."""
    cache, carry = prime_carry(draft, draft_params, cache, inputs_BxP, hidden_BxTxnxD,
                               stats.carry)
    return cache, stats.replace(carry=carry)

  def check(self, decoder) -> None:
    """A feature-level draft and a target that gives its states (`start.check_decoder`)."""
    check_feature_pair(decoder, type(self).__name__)

  def iteration(self, decoder, params, state: st.DecodeState) -> st.DecodeState:
    """Draft g_b tokens per row -> verify the bucket's width with states -> masked accept ->
    commit -> the written positions' features pending; the schedule and counters advance."""
    cfg, stats = self.config, state.stats
    rng, k_draft, k_accept = jax.random.split(state.rng, 3)
    active_B = ~state.done_B
    proposal, calls, draft_cache = adaptive_feature_draft(
        decoder.draft, params.draft, state, stats.carry, stats.adaptive.gamma_B, k_draft, cfg,
        decoder.sampling)
    g_B = proposal.proposed_B
    p_BxG1xV, hidden_BxG1xnxD, target_cache, w_used = bucketed_verify_with_hidden(
        decoder.target, params.target, state.target_cache, st.last_tokens(state),
        proposal.tokens_BxG, jnp.max(jnp.where(active_B, g_B, 1)), decoder.draft.feature_layers,
        cfg, decoder.sampling)
    n_B, next_B = masked_accept(decoder.rule, k_accept, proposal.tokens_BxG, proposal.q_BxGxV,
                                p_BxG1xV, g_B)
    new = commit(state.replace(rng=rng, target_cache=target_cache, draft_cache=draft_cache),
                 proposal, n_B, next_B, p_BxG1xV, decoder.target.eos_id, decoder.max_decode_len)
    g_BxG1xD = decoder.draft.fuse(params.draft, hidden_BxG1xnxD).astype(jnp.float32)
    return new.replace(
        stats=AdaptiveFeatureStats(next_carry(state, new, g_BxG1xD, stats.carry),
                                   next_stats(stats.adaptive, calls, w_used, n_B, g_B, active_B,
                                              cfg)),
        draft_cache=draft_cache.rollback(state.base_B + state.num_B - 1))
