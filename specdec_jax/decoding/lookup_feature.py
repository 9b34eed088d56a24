"""Prompt lookup where it matches, the feature-level draft elsewhere: one drafter, two drafts.

`Decoder(target, feature_draft, Chain(lookup_gamma), drafter=LookupFeatureDrafter(draft_gamma=2))`:
a value of the drafter seam (`decoding.drafter`), not a scheme of its own.

Why: on code the feature draft and prompt lookup propose about as many tokens per target call,
but a lookup step costs almost nothing and a feature-draft step a good part of a target step, so
each wins where the other is weak: the lookup (`decoding.lookup_first`) where the output copies
a long n-gram of the prompt or of itself, the draft where nothing matches. Each iteration's
first tokens come from one of them, chosen before drafting from the history alone
(`LookupFirstOptions.choice`; at batch > 1 the lookup only when every active row matches), and
the lookup continues them up to the chain's gamma either way. The choice depends on the tokens
written so far, not on this iteration's draws, so any acceptance rule stays exact (the lookup's
q is its one-hot, uniform past a miss, as `PromptLookupDraft`'s; a drafted token's q is the
draft's).

One verify width for both (lookup_gamma + 1 tokens); only the draft's side is a `lax.cond`, so
the target's cache never passes through a conditional (on CPU a cond over the whole state copies
it every iteration).

The draft is not called in a lookup iteration. Every verify call returns the target's states,
whichever drafted, and their fused features go into a log per buffer slot (`LookupFeatureCarry`,
laid out as `FeatureDrafter`'s entries); a lookup iteration's verified positions stay pending
there, and the next feature iteration first catches up (`catch_up`). So a lookup iteration costs
one target call, and the draft still sees every verified position with the target's own
features, as in training.
"""
from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.decoding import state as st
from specdec_jax.decoding.drafter import FeatureDrafter, chain_draft, check_feature_pair
from specdec_jax.decoding.feature_entries import FeatureCarry, last_output, prime_carry
from specdec_jax.decoding.lookup_first import LookupFirstOptions, lookup_step


@flax.struct.dataclass
class LookupFeatureCarry:
  """The drafter's per-example state (every leaf [B, ...]).

  g_BxLxD: fused target features per buffer slot (zeros where not verified yet).
  count_B: pending entries, the buffer slots num - count .. num - 1 (0 at a T5 start).
  prompt_BxP: the request's prompt (the lookup's search history), int32, right-padded.
  lookups_B: iterations the lookup drafted while the row was active (the rest: the draft).
  """

  g_BxLxD: jax.Array
  count_B: jax.Array
  prompt_BxP: jax.Array
  lookups_B: jax.Array


# ---- the feature-draft side ------------------------------------------------------------------
def _entries(state: st.DecodeState, g_BxLxD: jax.Array, first_B: jax.Array, width: int):
  """(tokens [B, W], features [B, W, D]) of the entries at buffer slots first..first + W - 1
  (clipped to the buffer: past the pending ones they are junk the caller rolls back over)."""
  idx_BxW = jnp.clip(first_B[:, None] + jnp.arange(width)[None, :], 0,
                     state.tokens_BxL.shape[1] - 1)
  return (jnp.take_along_axis(state.tokens_BxL, idx_BxW, axis=1),
          jnp.take_along_axis(g_BxLxD, idx_BxW[..., None], axis=1))


def catch_up(draft, draft_params, state: st.DecodeState, carry: LookupFeatureCarry, keep: int,
             width: int):
  """Feeds the oldest pending entries in calls of `width` until each active row has at most
  `keep` pending (no call when none is behind): (draft cache at the first pending slot, count)."""
  start_B = state.base_B + state.num_B - 1
  active_B = ~state.done_B

  def behind(c):
    return jnp.any((c[1] > keep) & active_B)

  def feed(c):
    cache, count_B = c
    tokens_BxW, g_BxWxD = _entries(state, carry.g_BxLxD, state.num_B - count_B, width)
    _, cache = draft.feed_features(draft_params, cache.rollback(start_B - count_B), tokens_BxW,
                                   g_BxWxD)
    count_B = count_B - jnp.where(active_B, jnp.clip(count_B - keep, 0, width), 0)
    return cache.rollback(start_B - count_B), count_B

  return jax.lax.while_loop(behind, feed, (state.draft_cache, carry.count_B))


def first_call(draft, draft_params, state: st.DecodeState, carry: LookupFeatureCarry,
               gamma: int, catchup_width: int):
  """Catches up, then the feature chain's first call over the last <= gamma + 1 pending
  entries: (logits for x_1 [B, V], its output feature [B, D], the cache at the last verified
  slot); what `feature_entries.feature_first_call` gives when nothing is further behind."""
  cache, count_B = catch_up(draft, draft_params, state, carry, gamma + 1, catchup_width)
  start_B = state.base_B + state.num_B - 1
  # count 0 (a T5 start): the start entry, zeros, at slot start; a done row, never caught up,
  # reads its last gamma + 1 entries (junk nobody keeps, but no out-of-range gather).
  c_B = jnp.clip(count_B, 1, gamma + 1)
  tokens_BxG1, g_BxG1xD = _entries(state, carry.g_BxLxD, state.num_B - c_B, gamma + 1)
  out_BxG1xD, cache = draft.feed_features(draft_params, cache.rollback(start_B - count_B),
                                          tokens_BxG1, g_BxG1xD)
  return (*last_output(draft, draft_params, out_BxG1xD, c_B - 1), cache.rollback(start_B))


def log_features(g_BxLxD: jax.Array, num_B: jax.Array, g_BxG1xD: jax.Array) -> jax.Array:
  """The log with a verify call's fused features written at buffer slots num..num + G (the state
  at block position j is the feature of the entry whose token is buffer slot num + j). Entries
  past the kept ones are overwritten before anything reads them; slots past the buffer drop."""
  pos_BxG1 = num_B[:, None] + jnp.arange(g_BxG1xD.shape[1])[None, :]
  b_Bx1 = jnp.arange(g_BxLxD.shape[0])[:, None]
  return g_BxLxD.at[b_Bx1, pos_BxG1].set(g_BxG1xD, mode="drop")


@dataclasses.dataclass(frozen=True)
class LookupFeatureDrafter(FeatureDrafter, LookupFirstOptions):
  """A feature-level drafter that lets prompt lookup draft first (the module docstring); decodes
  with `Chain(lookup_gamma)`. Its options: `LookupFirstOptions` (draft_gamma: the feature
  draft's tokens) and catchup_width, entries per catch-up call. Hashable."""

  catchup_width: int = 16

  greedy_ids = False  # FeatureDrafter's True yields to the lookup's one-hot q rows

  def __post_init__(self):
    self.check_options()
    v = self.catchup_width
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
      raise ValueError(f"catchup_width must be an integer >= 1, got {v!r}")
    if self.parallel:
      raise ValueError("the lookup-or-feature drafter drafts with the feature chain where the "
                       "lookup does not match; the parallel block is not combined with it")

  @property
  def cache_slack(self) -> int:
    """Draft cache slots past the target's: a catch-up call writes `catchup_width` entries from
    the oldest pending one and the first call `draft_gamma + 1`, both from where the draft fell
    behind, so near the buffer's end (or in a finished row, fed but never kept) a block reaches
    past the last slot the verification slack covers (`drafter` module docstring)."""
    return self.catchup_width + self.draft_gamma + 1

  def check(self, decoder) -> None:
    check_feature_pair(decoder, type(self).__name__)
    if not getattr(decoder.scheme, "chain", False):
      raise ValueError(f"LookupFeatureDrafter drafts a chain (Chain(lookup_gamma)); the "
                       f"{type(decoder.scheme).__name__} scheme drafts otherwise")
    self.check_options(decoder.scheme)

  def init_carry(self, decoder, state, inputs_BxP) -> LookupFeatureCarry:
    """An empty feature log as long as the buffer, nothing pending, the prompt for the lookup."""
    batch, length = state.tokens_BxL.shape
    zi = jnp.zeros((batch,), jnp.int32)
    return LookupFeatureCarry(jnp.zeros((batch, length, decoder.draft.width), jnp.float32), zi,
                              inputs_BxP.astype(jnp.int32), zi)

  def prime(self, decoder, dparams, cache, inputs_BxP, hidden_BxTxnxD,
            carry: LookupFeatureCarry):
    """Decoder-only targets: the prompt's entries fed, the last pending at buffer slot 0
    (`feature_entries.prime_carry`)."""
    cache, primed = prime_carry(decoder.draft, dparams, cache, inputs_BxP, hidden_BxTxnxD,
                                FeatureCarry(carry.g_BxLxD[:, :1], carry.count_B))
    return cache, carry.replace(g_BxLxD=carry.g_BxLxD.at[:, :1].set(primed.g_BxG1xD),
                                count_B=primed.count_B)

  def first_call(self, decoder, dparams, state):
    """Catches up on the entries lookup iterations left pending, then the feature chain's first
    call (`first_call` above); no bonus position."""
    logits_BxV, out_BxD, cache = first_call(decoder.draft, dparams, state, state.draft_carry,
                                            self.draft_gamma, self.catchup_width)
    return logits_BxV, None, out_BxD[:, None], cache

  def propose(self, decoder, dparams, state, key):
    """Lookup, or the feature draft's draft_gamma tokens continued by the lookup
    (`LookupFirstOptions.choice`): (Proposal of the chain's gamma tokens, draft cache, the carry
    with this iteration's choice counted: pending entries kept only where the lookup drafted,
    `observe` adds the written)."""
    sampling, carry = decoder.sampling, state.draft_carry
    k_draft, k_lookup = jax.random.split(key)
    hist, first, use_lookup = self.choice(decoder.target, state, carry.prompt_BxP)
    batch, vocab = hist.pos_B.shape[0], decoder.target.vocab_size

    def by_draft(_):
      proposal, cache = chain_draft(self, decoder, dparams, state, k_draft, self.draft_gamma,
                                    sampling)
      return proposal.tokens_BxG, proposal.q_BxGxV, cache

    def skip(_):
      return (jnp.zeros((batch, self.draft_gamma), jnp.int32),
              jnp.zeros((batch, self.draft_gamma, vocab), jnp.float32), state.draft_cache)

    # Only the draft's side is conditional (the module docstring).
    x_BxF, q_BxFxV, draft_cache = jax.lax.cond(use_lookup, skip, by_draft, None)
    proposal = lookup_step(hist, k_lookup, decoder.scheme.gamma, self.ngrams, vocab,
                           sampling, first=first,
                           drafted=(jnp.broadcast_to(~use_lookup, (batch,)), x_BxF, q_BxFxV))
    active_B = ~state.done_B
    carry = carry.replace(count_B=jnp.where(use_lookup, carry.count_B, 0),
                          lookups_B=carry.lookups_B + (active_B & use_lookup).astype(jnp.int32))
    return proposal, draft_cache, carry

  def observe(self, decoder, dparams, before, new, hidden_BxG1xnxD, carry):
    """The verified features logged, the pending count moved; the draft's cache parked at the
    last slot verified before (never read: every feed first rolls back to the first pending)."""
    g_BxG1xD = decoder.draft.fuse(dparams, hidden_BxG1xnxD).astype(jnp.float32)
    active_B = ~before.done_B
    length = carry.g_BxLxD.shape[1]
    carry = carry.replace(
        g_BxLxD=log_features(carry.g_BxLxD, jnp.where(active_B, before.num_B, length), g_BxG1xD),
        count_B=jnp.where(active_B, carry.count_B + new.num_B - before.num_B,
                          before.draft_carry.count_B))
    return new.replace(draft_carry=carry,
                       draft_cache=new.draft_cache.rollback(before.base_B + before.num_B - 1))

  def summary(self, carry: LookupFeatureCarry):
    """The lookup iterations per row (`metrics.acceptance_stats`: `lookup_iterations`)."""
    return {"lookups_B": carry.lookups_B}
