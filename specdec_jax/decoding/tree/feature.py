"""Draft trees, static and dynamic, from a feature-level draft (EAGLE-3's own setting): the draft
expands the tree from the target's states, one target call verifies every node and returns their
states.

A `Decoder` scheme, `FeatureTreeScheme(tree, verifier, width)`, made from a static `TreeScheme`
for a feature-level draft by `for_draft` (`draft_schemes.scheme_for` is where the run, its
calibration, its timed loops and the API turn a tree into this one). It composes the feature
chain's pending entries (`feature_chain`) with the token tree's levels, verifiers and commit
(`tree.scheme`):
1. `draft_tree`: the first draft call feeds the pending entries (the target's fused states of the
   last iteration's kept path and its next token: `feature_chain.first_draft_call`); its output at
   the last entry gives the root's children (the draft's top-k at T = 0, k draws without
   replacement at T > 0, as `tree.scheme.draw_children`) and the root's output feature. Each
   deeper level is one `extend_features` call over that level's nodes alone, each fed (its
   parent's output feature, its token), laid out as the token tree lays out its levels (node n
   at draft slot root + n - 1, positions by depth, seeing its ancestors among the levels cached
   before: `transformer.masked_block`'s window). D draft calls in all, as the feature chain's
   gamma.
2. one target `extend_with_hidden` over all N nodes with the tree's layout: p per node and the
   target's states at the draft's feature layers, from the same call;
3. the tree verifier (`verify.greedy` at T = 0, `verify.recursive_rejection` above): the kept
   path and the next token;
4. the target's cache: the path gathered into consecutive slots (`commit.commit_path`); the
   draft's cache: rolled back to before the tree (no gather): the entries it wrote were fed its
   own features, and the kept positions are fed again next iteration with the target's states,
   as the feature chain does after every verify (EAGLE's "draft extend");
5. `tree.scheme.commit_tree` writes, counts and rolls back; the fused target states at the root
   and the kept path's nodes (written tokens: count = n + 1) become the pending entries.
Static shapes throughout; every row keeps its own path (batch > 1, ragged acceptance).

The dynamic tree (`FeatureDynamicTreeScheme`, EAGLE-2's expansion over EAGLE-3's draft) is the
token draft's `tree.dynamic` with the same two changes: each beam level is one `extend_features`
call whose entries are fed their expander's output feature (a per-row gather from the previous
level's outputs), and the verify call returns the nodes' states. The rerank, the walk tables
(pruned children still tried: its exactness argument) and the path commit are `tree.dynamic`'s;
the draft's cache only rolls back, as above.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import seam
from specdec_jax.decoding import feature_chain
from specdec_jax.decoding import state as st
from specdec_jax.decoding.feature_chain import FeatureCarry
from specdec_jax.decoding.sampling import SamplingConfig, process_logits
from specdec_jax.decoding.tree import dynamic
from specdec_jax.decoding.tree.commit import commit_path
from specdec_jax.decoding.tree import token_path
from specdec_jax.decoding.tree.scheme import (TreeScheme, TreeStats, child_plan,
                                              commit_tree_with, draw_children, level_ranges,
                                              row_beta, tree_stats, tree_verifier)
from specdec_jax.decoding.tree.shape import DynamicTree, Tree


@flax.struct.dataclass
class FeatureTreeStats:
  """The scheme's state between iterations: the pending entries (per example) and the tree's
  counters (summed over rows, `tree.scheme.TreeStats`)."""

  carry: FeatureCarry
  tree: TreeStats

  # Read as a token tree's `TreeStats` (the calibration's acceptance by depth and rank).
  kept_rank_DxK = property(lambda self: self.tree.kept_rank_DxK)
  reached_D = property(lambda self: self.tree.reached_D)


def draft_tree(draft, draft_params, state: st.DecodeState, carry: FeatureCarry, key: jax.Array,
               tree: Tree, sampling: SamplingConfig, token_ids: bool = False):
  """Drafts the tree from the pending entries and the draft's own features: (node tokens [B, N],
  q per node [B, N, V] (rows of leaves 0), the draft's cache). token_ids (temperature 0,
  `tree.token_path`): the draft's argmax per node [B, N] (-1 at leaves) instead of q."""
  levels, depths = level_ranges(tree), tree.depths_N
  logits_BxV, out_BxD, cache = feature_chain.first_draft_call(draft, draft_params, state, carry)
  batch, vocab = logits_BxV.shape
  tokens_BxN = jnp.zeros((batch, tree.num_nodes), jnp.int32).at[:, 0].set(st.last_tokens(state))
  rows = (jnp.full((batch, tree.num_nodes), -1, jnp.int32) if token_ids
          else jnp.zeros((batch, tree.num_nodes, vocab), jnp.float32))
  # Every node's output feature (the root's from the pending entries' call): a child's input.
  out_BxNxD = jnp.zeros((batch, tree.num_nodes, out_BxD.shape[-1]), jnp.float32)
  out_BxNxD = out_BxNxD.at[:, 0].set(out_BxD.astype(jnp.float32))
  parents_N = jnp.asarray(np.maximum(tree.parents_N, 0))
  keys = jax.random.split(key, tree.max_depth)
  logits_BxLxV = logits_BxV[:, None]
  for d, (start, end) in enumerate(levels[:-1]):
    if d > 0:  # depth d's nodes at draft slot root + node - 1, seeing their ancestors
      g_BxLxD = out_BxNxD[:, parents_N[start:end]]
      logits_BxLxV, level_out_BxLxD, cache = draft.extend_features(
          draft_params, cache, tokens_BxN[:, start:end], g_BxLxD,
          offsets=jnp.asarray(depths[1:end] - 1),
          visible=jnp.asarray(tree.ancestor_mask_NxN[start:end, 1:end]))
      out_BxNxD = out_BxNxD.at[:, start:end].set(level_out_BxLxD.astype(jnp.float32))
    q_BxLxV = None if token_ids else process_logits(logits_BxLxV, sampling)
    rows = rows.at[:, start:end].set(token_path.logits_argmax(logits_BxLxV) if token_ids
                                     else q_BxLxV)
    child_C, pos_C, rank_C = child_plan(tree, start, end)
    kids_BxLxK = draw_children(keys[d], logits_BxLxV, q_BxLxV, int(rank_C.max()) + 1, sampling)
    tokens_BxN = tokens_BxN.at[:, child_C].set(kids_BxLxK[:, pos_C, rank_C])
  return tokens_BxN, rows, cache


def verify_tree_with_hidden(target, target_params, cache: seam.Cache, tokens_BxN: jax.Array,
                            tree: Tree, layers):
  """One target call over every node (node n at slot root + n, position root + depth, seeing
  its ancestors): (raw logits [B, N, V], states [B, N, n_layers, D], cache)."""
  return target.extend_with_hidden(target_params, cache, tokens_BxN, layers,
                                   offsets=jnp.asarray(tree.depths_N),
                                   visible=jnp.asarray(tree.ancestor_mask_NxN))


def path_hidden(hidden_BxNxnxD: jax.Array, path_BxD: jax.Array) -> jax.Array:
  """The target's states at the root and the kept path's nodes, [B, D + 1, n, D] (rows past the
  path read the root: junk the pending count never reaches)."""
  nodes_BxD1 = jnp.concatenate([jnp.zeros_like(path_BxD[:, :1]), jnp.maximum(path_BxD, 0)], 1)
  return jnp.take_along_axis(hidden_BxNxnxD, nodes_BxD1[:, :, None, None], axis=1)


@dataclasses.dataclass(frozen=True)
class FeatureTreeScheme:
  """Draft a static tree per iteration with a feature-level draft of output width `width`,
  verify all its nodes in one target call that also returns their states.

  A decoding scheme (`decoder.Decoder.scheme`), hashable. tree: a level-ordered `Tree` or a
  branching per depth (as `TreeScheme`'s); verifier: as `TreeScheme`'s. `for_draft(draft,
  scheme)` makes one from a `TreeScheme`. The target needs `extend_with_hidden` with a layout
  (offsets / visible), the draft `extend_features` with one.
  """

  tree: Any
  verifier: Any = "auto"
  width: int = 0

  needs_draft = True

  def __post_init__(self):
    base = TreeScheme(self.tree, self.verifier)  # the same checks and the branching -> Tree
    object.__setattr__(self, "tree", base.tree)
    if self.width < 1:
      raise ValueError(f"width (the feature draft's width) must be >= 1, got {self.width}; use "
                       "FeatureTreeScheme.for_draft(draft, tree_scheme)")

  @classmethod
  def for_draft(cls, draft, scheme: TreeScheme) -> "FeatureTreeScheme":
    return cls(scheme.tree, scheme.verifier, draft.width)

  @property
  def gamma(self) -> int:
    """Every drafted node: the verify call writes N slots (`tree.scheme`'s docstring)."""
    return self.tree.num_nodes - 1

  def init_stats(self, batch: int) -> FeatureTreeStats:
    carry = FeatureCarry(jnp.zeros((batch, self.tree.max_depth + 1, self.width), jnp.float32),
                         jnp.zeros((batch,), jnp.int32))
    return FeatureTreeStats(carry, TreeStats.zeros(self.tree))

  def prime(self, draft, draft_params, cache, inputs_BxP, hidden_BxTxnxD, stats):
    """Decoder-only targets: the draft starts from the prompt's target states, as the chain's
    (`feature_chain.prime_carry`)."""
    cache, carry = feature_chain.prime_carry(draft, draft_params, cache, inputs_BxP,
                                             hidden_BxTxnxD, stats.carry)
    return cache, stats.replace(carry=carry)

  def constrain_stats(self, stats: FeatureTreeStats, constrain) -> FeatureTreeStats:
    """On a mesh (`Decoder._constrain`): the pending entries are per example (batch-sharded),
    the tree counters are sums over rows (left as they are)."""
    return stats.replace(carry=jax.tree.map(constrain, stats.carry))

  def check(self, decoder) -> None:
    """A feature-level draft and a target that returns its states (`start.check_decoder`)."""
    feature_chain.check_feature_pair(decoder, type(self).__name__)

  def verify_fn(self, sampling: SamplingConfig):
    return tree_verifier(self.verifier, sampling)

  def iteration(self, decoder, params, state: st.DecodeState) -> st.DecodeState:
    """Draft the tree -> verify with states -> keep a path -> commit -> pending entries; at
    temperature 0 with a named verifier as token ids (`tree.token_path`: bit for bit the same)."""
    tree, sampling, draft = self.tree, decoder.sampling, decoder.draft
    rng, k_draft, k_verify = jax.random.split(state.rng, 3)
    root_B = state.target_cache.index_B
    token_ids = token_path.uses_token_path(self.verifier, sampling)
    tokens_BxN, rows, draft_cache = draft_tree(draft, params.draft, state, state.stats.carry,
                                               k_draft, tree, sampling, token_ids)
    logits_BxNxV, hidden, target_cache = verify_tree_with_hidden(
        decoder.target, params.target, state.target_cache, tokens_BxN, tree,
        draft.feature_layers)
    if token_ids:
      target_BxN = token_path.logits_argmax(logits_BxNxV)
      verdict = token_path.argmax_walk(tree, tokens_BxN, target_BxN)
      beta_BxD1 = token_path.path_beta(state, verdict, target_BxN, rows, None)
      p_last_BxV = token_path.next_row(verdict, logits_BxNxV.shape[-1])
    else:
      p_BxNxV = process_logits(logits_BxNxV, sampling)
      verdict = self.verify_fn(sampling)(k_verify, tree, tokens_BxN, rows, p_BxNxV)
      beta_BxD1, p_last_BxV = row_beta(state, verdict, p_BxNxV, rows,
                                       jnp.zeros_like(p_BxNxV[:, 0]))
    target_cache = commit_path(target_cache, root_B, verdict.path_BxD, verdict.num_accepted_B)
    return self._commit(decoder, params, state.replace(rng=rng, target_cache=target_cache,
                                                       draft_cache=draft_cache),
                        state, verdict, beta_BxD1, p_last_BxV, hidden)

  def _commit(self, decoder, params, state: st.DecodeState, before: st.DecodeState, verdict,
              beta_BxD1: jax.Array, p_last_BxV: jax.Array, hidden) -> st.DecodeState:
    """`commit_tree_with` on `state` (the target's path gathered, both caches after this
    iteration's calls; beta and the last node's row as `row_beta` or `tree.token_path` give them,
    without a bonus q: 0 at column 0), then the pending entries (the fused target states at the
    root and the kept path) and the draft's cache rolled back to before the tree. `before`: the
    iteration's input."""
    # The draft is never pending: its kept positions are fed again with the target's states.
    never_B = jnp.zeros_like(state.done_B)
    new = commit_tree_with(state, verdict, beta_BxD1, p_last_BxV, decoder.target.eos_id,
                           decoder.max_decode_len, pending_B=never_B)
    carry, active_B = before.stats.carry, ~before.done_B
    written_B = new.num_B - before.num_B
    g_BxD1xD = decoder.draft.fuse(params.draft, path_hidden(hidden, verdict.path_BxD))
    carry = FeatureCarry(jnp.where(active_B[:, None, None], g_BxD1xD.astype(jnp.float32),
                                   carry.g_BxG1xD),
                         jnp.where(active_B, written_B, carry.count_B))
    kept_B = new.counters.accepted_B - before.counters.accepted_B
    stats = FeatureTreeStats(carry, tree_stats(before.stats.tree, verdict, active_B, kept_B))
    return new.replace(stats=stats,
                       draft_cache=state.draft_cache.rollback(before.base_B + before.num_B - 1))


# ---- dynamic trees (EAGLE-2's expansion, EAGLE-3's draft) -----------------------------------------
def draft_dynamic(draft, draft_params, state: st.DecodeState, carry: FeatureCarry,
                  key: jax.Array, spec: DynamicTree, sampling: SamplingConfig):
  """`tree.dynamic.expand_beam` with a feature-level draft: the pending entries' call gives the
  root's children and output feature; each beam level's entries are fed their expander's output
  feature (a per-row gather from the previous level's outputs). Returns (`dynamic.Drafted`, the
  draft's cache)."""
  logits_BxV, out_BxD, cache = feature_chain.first_draft_call(draft, draft_params, state, carry)

  def level(c, tokens_BxW, parent_BxW, offsets_U, visible_BxWxU):
    cache, out_BxLxD = c  # the previous level's output features (depth 1: the root's)
    g_BxWxD = jnp.take_along_axis(out_BxLxD, parent_BxW[:, :, None], axis=1)
    logits_BxWxV, out_BxWxD, cache = draft.extend_features(
        draft_params, cache, tokens_BxW, g_BxWxD, offsets=offsets_U, visible=visible_BxWxU)
    return logits_BxWxV, (cache, out_BxWxD.astype(jnp.float32))

  drafted, (cache, _) = dynamic.expand_beam(
      logits_BxV, (cache, out_BxD[:, None].astype(jnp.float32)), level, key, spec, sampling)
  return drafted, cache


@dataclasses.dataclass(frozen=True)
class FeatureDynamicTreeScheme(FeatureTreeScheme):
  """A dynamic tree (EAGLE-2 style) drafted by a feature-level draft of output width `width`.

  `tree` is a `shape.DynamicTree` budget (depth, beam width, branch, nodes), as a
  `tree.dynamic.DynamicTreeScheme`'s; `for_draft(draft, DynamicTreeScheme(...))` makes one
  (`draft_schemes.scheme_for`). Stats, pending entries and the target's path commit are the
  static feature tree's.
  """

  def __post_init__(self):
    if not isinstance(self.tree, DynamicTree):
      raise TypeError(f"FeatureDynamicTreeScheme.tree must be a decoding.tree.shape.DynamicTree, "
                      f"got {type(self.tree).__name__}")
    dynamic.DynamicTreeScheme(self.tree.depth, self.tree.width, self.tree.branch,
                              self.tree.nodes, self.verifier)  # the same checks
    if self.width < 1:
      raise ValueError(f"width (the feature draft's width) must be >= 1, got {self.width}; use "
                       "FeatureDynamicTreeScheme.for_draft(draft, dynamic_tree_scheme)")

  @classmethod
  def for_draft(cls, draft, scheme: dynamic.DynamicTreeScheme) -> "FeatureDynamicTreeScheme":
    return cls(scheme.tree, scheme.verifier, draft.width)

  @property
  def gamma(self) -> int:
    """As `DynamicTreeScheme.gamma`: the verify call writes N slots, the draft (D - 1) W."""
    t = self.tree
    return max(t.nodes - 1, (t.depth - 1) * t.width, t.depth)

  def iteration(self, decoder, params, state: st.DecodeState) -> st.DecodeState:
    """Expand -> rerank -> verify with states -> keep a path -> commit -> pending entries."""
    sampling, draft = decoder.sampling, decoder.draft
    rng, k_draft, k_verify = jax.random.split(state.rng, 3)
    root_B = state.target_cache.index_B
    drafted, draft_cache = draft_dynamic(draft, params.draft, state, state.stats.carry, k_draft,
                                         self.tree, sampling)
    lay = dynamic.layout(self.tree, drafted, st.last_tokens(state))
    logits_BxNxV, hidden, target_cache = decoder.target.extend_with_hidden(
        params.target, state.target_cache, lay.tokens_BxN, draft.feature_layers,
        offsets=lay.depths_BxN, visible=lay.visible_BxNxN)
    p_BxNxV = process_logits(logits_BxNxV, sampling)
    verdict = self.verify_fn(sampling)(k_verify, lay.walk, lay.tokens_BxN, lay.q_BxNxV, p_BxNxV)
    beta_BxD1, p_last_BxV = row_beta(state, verdict, p_BxNxV, lay.q_BxNxV,
                                     jnp.zeros_like(p_BxNxV[:, 0]))
    target_cache = commit_path(target_cache, root_B, verdict.path_BxD, verdict.num_accepted_B)
    return self._commit(decoder, params, state.replace(rng=rng, target_cache=target_cache,
                                                       draft_cache=draft_cache),
                        state, verdict, beta_BxD1, p_last_BxV, hidden)
