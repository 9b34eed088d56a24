"""The parallel feature chain: one draft call proposes the whole block (issue 28's parallel
variant, after DFlash / PARD), from a feature-level draft.

Why: the feature chain (decoding/feature_chain.py) makes gamma draft calls per iteration, one per
drafted token; here the first call, which feeds the pending entries the target verified, also
carries gamma - 1 mask entries after the last of them (token `mask_id`, feature zeros), and the
draft's outputs there are the marginals q_2..q_G of the block. Each x_i is drawn from its q_i
alone, independently of x_<i: a draft distribution that ignores x_<i is still a distribution of
x_i given x_<i, so the token-wise and block rules stay exact (the verify, acceptance, commit and
pending-entry bookkeeping are the feature chain's own). One draft call per iteration, however
large gamma.

Layout of the call (per row, count = c pending entries, c >= 1 after the first iteration):
entries 0..c-1 are the pending (feature, token) pairs, entries c..c+G-2 the masks, the rest
padding (causal attention: nothing reads them); q_1 is the output at entry c - 1, q_k at entry
c + k - 2. It writes up to 2G draft-cache slots past the rollback point; slots past the cache's
end are dropped (`LayerKV.write`), which changes only q near the length limit, never exactness.
The block loss (`training/feature_blocks.py`, `FeatureTrainConfig.block_size`) trains the mask
entries for this very call (the test holds its logits to `block_logits`'); a draft trained
without it still decodes exactly here, but its mask outputs are what a feature draft predicts
from a mask token, so acceptance past the first position is low. The mask token is the one the
draft was trained with (`FeatureDraft.mask_id`: its config's `mask_id`, else the pad id). A run
selects this scheme with `RunConfig.feature_parallel` (`draft_schemes.chain_for`).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax.decoding import state as st
from specdec_jax.decoding.feature_chain import FeatureCarry, FeatureChain
from specdec_jax.decoding.sampling import SamplingConfig, process_logits, sample
from specdec_jax.decoding.speculative import Proposal


def block_entries(state: st.DecodeState, carry: FeatureCarry, gamma: int, mask_id: int):
  """(tokens [B, N], features [B, N, D], first output index [B]) of the one draft call, N =
  G + 1 + G - 1: the pending entries, then gamma - 1 masks (see the module docstring)."""
  g1 = carry.g_BxG1xD.shape[1]
  n = g1 + gamma - 1
  c_B = jnp.maximum(carry.count_B, 1)
  j_1xN = jnp.arange(n)[None, :]
  idx_BxN = jnp.clip(state.num_B[:, None] - c_B[:, None] + j_1xN, 0,
                     state.tokens_BxL.shape[1] - 1)
  pending_BxN = j_1xN < c_B[:, None]
  tokens_BxN = jnp.where(pending_BxN, jnp.take_along_axis(state.tokens_BxL, idx_BxN, axis=1),
                         mask_id)
  g_BxNxD = jnp.concatenate(
      [carry.g_BxG1xD, jnp.zeros(carry.g_BxG1xD.shape[:1] + (gamma - 1,)
                                 + carry.g_BxG1xD.shape[2:], carry.g_BxG1xD.dtype)], axis=1)
  return tokens_BxN, jnp.where(pending_BxN[..., None], g_BxNxD, 0.0), c_B - 1


def block_logits(draft, draft_params, state: st.DecodeState, carry: FeatureCarry, gamma: int,
                 mask_id: int):
  """The one draft call: (raw logits of q_1..q_G [B, G, V], the draft cache rolled back to the
  last verified slot). Its own function so a test can hold the training-time block loss
  (`training/feature_blocks.py`) to exactly these logits."""
  tokens_BxN, g_BxNxD, first_B = block_entries(state, carry, gamma, mask_id)
  start_B = state.base_B + state.num_B - 1
  cache = state.draft_cache.rollback(start_B - carry.count_B)
  logits_BxNxV, _, cache = draft.extend_features(draft_params, cache, tokens_BxN, g_BxNxD)
  sel_BxG = first_B[:, None] + jnp.arange(gamma)[None, :]
  return jnp.take_along_axis(logits_BxNxV, sel_BxG[..., None], axis=1), cache.rollback(start_B)


def parallel_draft_step(draft, draft_params, state: st.DecodeState, carry: FeatureCarry,
                        key: jax.Array, gamma: int, sampling: SamplingConfig, mask_id: int):
  """One draft call: the pending entries and the masks; x_i ~ q_i, each from its own marginal."""
  logits_BxGxV, cache = block_logits(draft, draft_params, state, carry, gamma, mask_id)
  q_BxGxV = process_logits(logits_BxGxV, sampling)
  keys = jax.random.split(key, gamma)
  tokens_BxG = jnp.stack([sample(keys[i], q_BxGxV[:, i]) for i in range(gamma)], axis=1)
  gamma_B = jnp.full(state.num_B.shape, gamma, jnp.int32)
  return Proposal(tokens_BxG, q_BxGxV, proposed_B=gamma_B, fed_B=gamma_B + 1,
                  bonus_q_BxV=jnp.zeros_like(q_BxGxV[:, 0])), cache


@dataclasses.dataclass(frozen=True)
class ParallelFeatureChain(FeatureChain):
  """`FeatureChain` whose draft proposes the whole block in one call (mask entries, token
  `mask_id`; `for_draft` takes the draft's own, `FeatureDraft.mask_id`: the token its block
  training used, else its pad id). Hashable: a static part of the Decoder."""

  mask_id: int = 0
  greedy_ids = False  # its `propose` drafts the block in one call, also at temperature 0

  @classmethod
  def for_draft(cls, draft, gamma: int, mask_id: int | None = None) -> "ParallelFeatureChain":
    if mask_id is None:
      mask_id = getattr(draft, "mask_id", draft.pad_id)
    return cls(gamma=gamma, width=draft.width, mask_id=int(mask_id))

  def propose(self, draft, draft_params, state, carry, key, sampling):
    return parallel_draft_step(draft, draft_params, state, carry, key, self.gamma, sampling,
                               self.mask_id)
