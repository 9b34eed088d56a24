"""Prompt lookup where it matches, a self-draft elsewhere: `LookupTokenDrafter`.

`Decoder(target, self_draft, Chain(lookup_gamma), drafter=LookupTokenDrafter(draft_gamma=5))`:
a value of the drafter seam (`decoding.drafter`), the token-draft sibling of
`lookup_feature.LookupFeatureDrafter`; the lookup side is theirs in common
(`decoding.lookup_first`).

Why: a self-draft (the target's checkpoint in int8 panels) accepts ~99 % of its tokens but each
of its calls costs about half a target step, while prompt lookup costs nothing and, where the
output copies an n-gram of the prompt or of itself (code repeating its signature and names, a
summary quoting its document), proposes tokens the target keeps. Each iteration's first tokens
come from one of them, chosen before drafting from the history alone
(`LookupFirstOptions.choice`), and the lookup continues them up to the chain's gamma either
way; exact for every rule as the lookup-or-feature drafter is (`lookup_first`'s docstring).

It drafts in the target's cache (`TokenDrafter(prompt_cache='shared')`; a self-draft only): each
draft call reads every verified position's target entries, so an iteration the lookup drafted
leaves the draft nothing to catch up: the next one feeds the last token and goes on. The draft
side is a `while_loop` of 0 (lookup) or `draft_gamma` calls rather than a `lax.cond`: the cache
it writes is the target's, and a conditional over it would copy it every iteration (on CPU),
where a loop's carry is written in place.
"""
from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.decoding import state as st
from specdec_jax.decoding.drafter import TokenDrafter
from specdec_jax.decoding.lookup_first import LookupFirstOptions, lookup_step
from specdec_jax.decoding.sampling import SamplingConfig, process_logits, sample


@flax.struct.dataclass
class LookupTokenCarry:
  """prompt_BxP: the request's prompt (the lookup's history), int32, right-padded.
  lookups_B: iterations the lookup drafted while the row was active (the rest: the draft)."""

  prompt_BxP: jax.Array
  lookups_B: jax.Array


def draft_calls(draft, dparams, cache, last_B: jax.Array, calls: jax.Array, width: int,
                key: jax.Array, sampling: SamplingConfig):
  """`calls` (0 or `width`, traced) chained draft calls from the last verified token, x_i ~ q_i:
  (tokens [B, width], q [B, width, V], the cache after them); zeros where no call was made."""
  keys = jax.random.split(key, width)
  batch, vocab = last_B.shape[0], draft.vocab_size

  def body(c):
    i, cache, x_B, x_BxW, q_BxWxV = c
    logits_Bx1xV, cache = draft.extend(dparams, cache, x_B[:, None])
    q_BxV = process_logits(logits_Bx1xV[:, 0], sampling)
    x_B = sample(keys[i], q_BxV)
    return (i + 1, cache, x_B, jax.lax.dynamic_update_slice(x_BxW, x_B[:, None], (0, i)),
            jax.lax.dynamic_update_slice(q_BxWxV, q_BxV[:, None], (0, i, 0)))

  init = (jnp.zeros((), jnp.int32), cache, last_B, jnp.zeros((batch, width), jnp.int32),
          jnp.zeros((batch, width, vocab), jnp.float32))
  _, cache, _, x_BxW, q_BxWxV = jax.lax.while_loop(lambda c: c[0] < calls, body, init)
  return x_BxW, q_BxWxV, cache


@dataclasses.dataclass(frozen=True)
class LookupTokenDrafter(TokenDrafter, LookupFirstOptions):
  """A self-draft that lets prompt lookup draft first (the module docstring); decodes with
  `Chain(lookup_gamma)`. Its options: `LookupFirstOptions` (draft_gamma: the self-draft's
  tokens). Always in the target's cache (prompt_cache 'shared'). Hashable."""

  prompt_cache: str = "shared"

  greedy_ids = False  # TokenDrafter's True yields to the lookup's one-hot q rows

  def __post_init__(self):
    self.check_options()
    if self.prompt_cache != "shared":
      raise ValueError(f"LookupTokenDrafter drafts in the target's cache (prompt_cache "
                       f"'shared'), got {self.prompt_cache!r}: a draft with a cache of its own "
                       "would have to catch up after every lookup iteration")

  def check(self, decoder) -> None:
    super().check(decoder)  # a self-draft's cache layout, a chain
    self.check_options(decoder.scheme)

  def init_carry(self, decoder, state, inputs_BxP) -> LookupTokenCarry:
    del decoder
    return LookupTokenCarry(inputs_BxP.astype(jnp.int32), jnp.zeros_like(state.num_B))

  def propose(self, decoder, dparams, state, key):
    """Lookup, or the draft's draft_gamma tokens continued by the lookup
    (`LookupFirstOptions.choice`): (Proposal of the chain's gamma tokens, the target's cache
    with the draft's writes, the carry with this iteration's choice counted)."""
    sampling, carry = decoder.sampling, state.draft_carry
    k_draft, k_lookup = jax.random.split(key)
    hist, first, use_lookup = self.choice(decoder.target, state, carry.prompt_BxP)
    calls = jnp.where(use_lookup, 0, self.draft_gamma)
    x_BxF, q_BxFxV, cache = draft_calls(decoder.draft, dparams, state.target_cache,
                                        st.last_tokens(state), calls, self.draft_gamma, k_draft,
                                        sampling)
    batch = hist.pos_B.shape[0]
    proposal = lookup_step(hist, k_lookup, decoder.scheme.gamma, self.ngrams,
                           decoder.target.vocab_size, sampling, first=first,
                           drafted=(jnp.broadcast_to(~use_lookup, (batch,)), x_BxF, q_BxFxV))
    active_B = ~state.done_B
    carry = carry.replace(lookups_B=carry.lookups_B + (active_B & use_lookup).astype(jnp.int32))
    return proposal, cache, carry

  def observe(self, decoder, dparams, before, new, hidden, carry):
    del decoder, dparams, before, hidden
    return new.replace(draft_carry=carry)

  def summary(self, carry: LookupTokenCarry):
    """The lookup iterations per row (`metrics.acceptance_stats`: `lookup_iterations`)."""
    return {"lookups_B": carry.lookups_B}
