"""The lookup side of the lookup-first drafters: prompt lookup where the history matches.

Why its own module: two drafters draft with prompt lookup where the last n-gram matches and with
a draft elsewhere (`lookup_feature.LookupFeatureDrafter`: a feature-level draft;
`lookup_token.LookupTokenDrafter`: a self-draft drafting in the target's cache). Both search the
same history, make the same choice before drafting and continue the draft's tokens with the same
chained lookups, so any acceptance rule stays exact: the choice reads the tokens written so far,
never this iteration's draws, and the lookup's q is its one-hot (uniform past a miss), as
`PromptLookupDraft`'s.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specdec_jax import seam
from specdec_jax.decoding import state as st
from specdec_jax.decoding.drafter import Proposal
from specdec_jax.decoding.sampling import SamplingConfig, process_logits, sample
from specdec_jax.models.model_free import best_match


class History(NamedTuple):
  """What the lookup searches, in `model_free.match_scores`' coordinates: the context (T5's
  source, pads -1; [B, 0] for a decoder-only target), the stream (`tokens_BxS`) and the slot of
  its last token (`pos_B`)."""

  context_BxC: jax.Array
  tokens_BxS: jax.Array
  pos_B: jax.Array


def history(target, state: st.DecodeState, prompt_BxP: jax.Array) -> History:
  """The lookup's history in the target's cache coordinates: T5, the source and the output;
  decoder-only, the prompt then the output (slot s < base: the prompt's; s >= base: buffer slot
  s - base), so an n-gram may span both, as in `PromptLookupDraft`'s history."""
  if seam.is_encoder_decoder(target):
    context = jnp.where(prompt_BxP != target.pad_id, prompt_BxP, -1)
    return History(context, state.tokens_BxL, state.num_B - 1)
  plen, length = prompt_BxP.shape[1], state.tokens_BxL.shape[1]
  s_S = jnp.arange(plen + length, dtype=jnp.int32)
  from_out_BxS = s_S[None, :] >= state.base_B[:, None]
  out_BxS = jnp.take_along_axis(state.tokens_BxL,
                                jnp.clip(s_S[None, :] - state.base_B[:, None], 0, length - 1),
                                axis=1)
  prompt_BxS = jnp.pad(prompt_BxP, ((0, 0), (0, length)))
  return History(jnp.zeros((prompt_BxP.shape[0], 0), jnp.int32),
                 jnp.where(from_out_BxS, out_BxS, prompt_BxS), state.base_B + state.num_B - 1)


def lookup_step(hist: History, key, gamma: int, ngrams: tuple[int, int], vocab_size: int,
                sampling: SamplingConfig, *, first=None, drafted=None) -> Proposal:
  """gamma chained lookups, each on the history extended by the tokens drawn before it: q_i is
  the one-hot of the match's continuation, uniform where none, x_i ~ q_i; what the chain of a
  `PromptLookupDraft` (fallback 'uniform') proposes from the same history.

  ngrams: (max_ngram, min_ngram) of the match. first: the first lookup's (ngram_Bx1,
  proposal_Bx1) when the caller has it (the scheme's choice reads it). drafted: (use_B,
  tokens_BxF, q_BxFxV): where use_B, the first F positions are those tokens, drawn by another
  draft from those q, and the lookup continues after them."""
  context_BxC, hist_BxS, pos_B = hist
  b_B = jnp.arange(hist_BxS.shape[0])
  keys = jax.random.split(key, gamma)
  # q of a match is process_logits of its one-hot logits (one logit 1e9 above the rest), which
  # is the one-hot itself (at any temperature below ~1e7 nothing else survives the softmax;
  # top-k and top-p keep the one); q of no match is process_logits of a row of zeros, the same
  # row for every row: computed once. Why not per row: top-p's 31 masked sums over the
  # vocabulary (~49k entries for SmolLM2) at every position, every iteration, also where the
  # self-draft's tokens replace them.
  nomatch_1xV = process_logits(jnp.zeros((1, vocab_size), jnp.float32), sampling)
  xs, qs = [], []
  for i in range(gamma):  # gamma is small and static
    ngram_Bx1, prop_Bx1 = (first if i == 0 and first is not None else
                           best_match(context_BxC, hist_BxS, (pos_B + i)[:, None], *ngrams))
    q_BxV = jnp.where(ngram_Bx1 > 0, jax.nn.one_hot(prop_Bx1[:, 0], vocab_size,
                                                    dtype=jnp.float32), nomatch_1xV)
    x_B = sample(keys[i], q_BxV)
    if drafted is not None and i < drafted[1].shape[1]:
      use_B, tokens_BxF, q_BxFxV = drafted
      x_B = jnp.where(use_B, tokens_BxF[:, i], x_B)
      q_BxV = jnp.where(use_B[:, None], q_BxFxV[:, i], q_BxV)
    hist_BxS = hist_BxS.at[b_B, pos_B + i + 1].set(x_B, mode="drop")
    xs.append(x_B)
    qs.append(q_BxV)
  gamma_B = jnp.full(pos_B.shape, gamma, jnp.int32)
  # fed_B = gamma + 1: neither drafter is ever left pending (the feature draft is fed the
  # verified positions from its log, the token draft reads them in the target's cache).
  return Proposal(jnp.stack(xs, axis=1), jnp.stack(qs, axis=1), proposed_B=gamma_B,
                  fed_B=gamma_B + 1, bonus_q_BxV=jnp.zeros_like(qs[0]))


@dataclasses.dataclass(frozen=True)
class LookupFirstOptions:
  """The lookup-first drafters' options and choice (a base of both; hashable): draft_gamma, the
  draft's tokens where the lookup does not match; lookup_ngram, the match length at which it
  does; max_ngram / min_ngram, the match's (`PromptLookupDraft`'s defaults)."""

  draft_gamma: int = 2
  lookup_ngram: int = 2
  max_ngram: int = 3
  min_ngram: int = 1

  # One choice per iteration for the whole batch (`choice`), so how often the lookup drafts
  # depends on the batch: a calibration decodes such a drafter in the run's batch shape
  # (`runner.measure.Calibration.decode`; a batch of 48 prompts hardly ever looked up).
  chooses_per_batch = True

  @property
  def ngrams(self) -> tuple[int, int]:
    return self.max_ngram, self.min_ngram

  def check_options(self, scheme=None) -> None:
    """Refuses bad n-gram lengths or draft_gamma, and with a scheme one narrower than it."""
    if not 1 <= self.min_ngram <= self.lookup_ngram <= self.max_ngram:
      raise ValueError(f"need 1 <= min_ngram <= lookup_ngram <= max_ngram (the match length at "
                       f"which the lookup drafts), got {self.min_ngram}, {self.lookup_ngram}, "
                       f"{self.max_ngram}")
    check_draft_gamma(scheme, self.draft_gamma)

  def choice(self, target, state: st.DecodeState, prompt_BxP: jax.Array):
    """(the lookup's `History`, its first lookup, whether this iteration's first tokens come
    from the lookup []): every active row's last n-gram matches >= `lookup_ngram` tokens (at
    batch > 1 the lookup only when every active row matches: one draft side per iteration)."""
    hist = history(target, state, prompt_BxP)
    first = best_match(*hist[:2], hist.pos_B[:, None], self.max_ngram, self.min_ngram)
    return hist, first, jnp.all((first[0][:, 0] >= self.lookup_ngram) | state.done_B)


def check_draft_gamma(scheme, draft_gamma: int) -> None:
  """Refuses a chain narrower than the draft's tokens: the chain's gamma (the lookup's tokens)
  is every iteration's verify width, and the lookup continues the draft's tokens up to it."""
  if not isinstance(draft_gamma, int) or isinstance(draft_gamma, bool) or draft_gamma < 1:
    raise ValueError(f"draft_gamma must be an integer >= 1, got {draft_gamma!r}")
  if scheme is not None and scheme.gamma < draft_gamma:
    raise ValueError(f"the chain's gamma ({scheme.gamma}, the lookup's tokens) is the verify "
                     f"width of every iteration and must be >= draft_gamma ({draft_gamma}): "
                     "the lookup continues the draft's tokens up to it")
