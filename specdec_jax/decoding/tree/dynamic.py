"""Dynamic draft trees (EAGLE-2 style): the tree's shape is chosen per row from the draft's scores.

A `Decoder` with `scheme=DynamicTreeScheme(depth=4, width=4, branch=4, nodes=32)` runs
`dynamic_iteration`, static shapes throughout:
1. Expansion (`expand_beam`, D draft calls): the root's q draws k children; a candidate's score
   is the cumulative log q along its path (`expand`). For depth d = 1..D-1 the beam, the W best
   candidates of depth d, is fed in ONE windowed draft call and each beam node draws k children:
   k + (D - 1) W k candidates in all.
2. Rerank (`layout`): the N - 1 best candidates by (score desc, depth asc, id asc) are the nodes.
   A child's score is its parent's plus a log q <= 0 and ids grow with depth, so the kept set is
   ancestor-closed and node ids are topological.
3. One target call over the N nodes (positions by depth, ancestor mask per row); the verifiers
   of `verify` walk per-row `verify.Walk` tables in which every expanded (beam) node lists ALL k
   drawn children, pruned ones included.
4. `commit_path` on the target (node ids) and the draft (beam nodes' own slots), then
   `commit_tree` and `tree_stats`.

Why it is exact at every temperature. EAGLE-2 prunes candidates by their own values; a verifier
that skipped a pruned sibling (or tried only the verified ones) would decide whether to try a
child from that child's value, which biases recursive rejection
(tests/decoding/test_tree_dynamic_verify.py). Here, at every visited node, all k drawn children
are tried in rank order by `verify.rejection_sibling` against the running residual; accepting a
child needs only p at its parent, which the target computed. A kept child that is a node moves
the walk on; a kept pruned child ends it as the next token (no bonus: the target did not score
it); if none is kept, the next token is a sample of the residual; at a node that drew no
children, a bonus sample of p. Whether a node is expanded depends only on the scores of its
depth's candidates, never on its own children, which are drawn afterwards with fresh randomness:
so at every visited node the children are an honest without-replacement sample of q, the node
emits p (the static tree's argument), and what follows an emitted token again emits p after it.
At temperature 0 a pruned child equal to the target's argmax is what greedy would emit anyway.

The draft holds beam node j of depth d at slot root + e, e = 1 + (d - 1) W + j (its expander id):
every kept node but the last had a kept child, so was expanded and has a slot. The draft is
pending exactly when the last kept node was not expanded; a walk ending on a pruned child emits
it as the next token, unseen by both models, as a correction.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import seam
from specdec_jax.decoding import state as st
from specdec_jax.decoding.sampling import SamplingConfig, process_logits
from specdec_jax.decoding.drafter import take_rows
from specdec_jax.decoding.tree import verify
from specdec_jax.decoding.tree.commit import commit_path
from specdec_jax.decoding.tree.commit import commit_tree, observe_tree
from specdec_jax.decoding.tree.scheme import VERIFIERS, ModelTree, draw_children
from specdec_jax.decoding.tree.shape import DynamicTree


class Drafted(NamedTuple):
  """Every candidate of one expansion, laid out by expander (candidate e k + r is expander e's
  rank-r child): tokens and scores [B, C]; the candidate id of each expander [B, E] (the root's
  -1); the processed q at each expander [B, E, V]."""
  tokens_BxC: jax.Array
  scores_BxC: jax.Array
  expander_cand_BxE: jax.Array
  q_BxExV: jax.Array


def expand(key: jax.Array, logits_BxLxV: jax.Array, k: int, sampling: SamplingConfig):
  """q at L expanded nodes, their k children (`scheme.draw_children`) and each child's log q,
  the score increment: log_softmax of the raw logits at T = 0 (q is one-hot there), else the
  processed q's log (-inf for a filler child of zero mass). Clipped at 0, so a child never
  outscores its parent (ancestor closure of the rerank)."""
  q_BxLxV = process_logits(logits_BxLxV, sampling)
  kids_BxLxK = draw_children(key, logits_BxLxV, q_BxLxV, k, sampling)
  logq_BxLxV = (jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
                if sampling.greedy else jnp.log(q_BxLxV))
  logq_BxLxK = jnp.minimum(jnp.take_along_axis(logq_BxLxV, kids_BxLxK, axis=-1), 0.0)
  return q_BxLxV, kids_BxLxK, logq_BxLxK


def beam_visible(prev_BxWxU: jax.Array | None, parent_BxW: jax.Array, width: int
                  ) -> jax.Array:
  """The beam's window mask [B, W, U + W]: each node sees its parent's ancestors among the
  earlier beam levels (parent_BxW: its parent's place in the previous beam) and itself."""
  eye_BxWxW = jnp.broadcast_to(jnp.eye(width, dtype=jnp.bool_), parent_BxW.shape + (width,))
  if prev_BxWxU is None:
    return eye_BxWxW
  inherited_BxWxU = jnp.take_along_axis(prev_BxWxU, parent_BxW[:, :, None], axis=1)
  return jnp.concatenate([inherited_BxWxU, eye_BxWxW], axis=2)


def expand_beam(first_logits_BxV: jax.Array, carry, level_call, key: jax.Array,
                spec: DynamicTree, sampling: SamplingConfig) -> tuple[Drafted, Any]:
  """The expansion (module docstring, step 1) from the root's `first_logits_BxV`, the draft's
  calls left to `level_call(carry, tokens_BxW, parent_BxW, offsets_U, visible_BxWxU) ->
  (logits_BxWxV, carry)`: one draft call over the beam's W tokens in the window layout (offsets:
  depth - 1 of the U window entries, the beam levels so far; visible: each node's ancestors among
  them and itself); parent_BxW: each node's expander's place in the previous level (0 at depth 1).
  Returns the candidates and the final carry (a token draft's cache; a feature draft's cache and
  its beam's output features)."""
  k, width = spec.branch, spec.width
  batch = first_logits_BxV.shape[0]
  keys = jax.random.split(key, spec.depth)
  q_Bx1xV, kids_Bx1xK, logq_Bx1xK = expand(keys[0], first_logits_BxV[:, None], k, sampling)
  level_tokens, level_scores = kids_Bx1xK.reshape(batch, k), logq_Bx1xK.reshape(batch, k)
  tokens, scores, qs = [level_tokens], [level_scores], [q_Bx1xV]
  expanders, visible, level_start = [jnp.full((batch, 1), -1, jnp.int32)], None, 0
  for d in range(1, spec.depth):  # the beam of depth d, fed in one call
    top_BxW = jax.lax.top_k(level_scores, width)[1].astype(jnp.int32)  # ties: lower id first
    visible = beam_visible(visible, top_BxW // k, width)
    logits_BxWxV, carry = level_call(
        carry, jnp.take_along_axis(level_tokens, top_BxW, axis=1), top_BxW // k,
        jnp.asarray(np.repeat(np.arange(d, dtype=np.int32), width)), visible)
    q_BxWxV, kids_BxWxK, logq_BxWxK = expand(keys[d], logits_BxWxV, k, sampling)
    beam_scores_BxW = jnp.take_along_axis(level_scores, top_BxW, axis=1)
    expanders.append(level_start + top_BxW)
    level_start = k * (1 + (d - 1) * width)  # the first candidate of depth d + 1
    level_tokens = kids_BxWxK.reshape(batch, width * k)
    level_scores = (beam_scores_BxW[:, :, None] + logq_BxWxK).reshape(batch, width * k)
    tokens, scores, qs = tokens + [level_tokens], scores + [level_scores], qs + [q_BxWxV]
  drafted = Drafted(jnp.concatenate(tokens, axis=1), jnp.concatenate(scores, axis=1),
                    jnp.concatenate(expanders, axis=1), jnp.concatenate(qs, axis=1))
  return drafted, carry


def draft_dynamic(decoder, draft_params, state: st.DecodeState, key: jax.Array, spec: DynamicTree,
                  sampling: SamplingConfig) -> tuple[Drafted, jax.Array, seam.Cache]:
  """Expands the beam level by level with the decoder's drafter (D draft calls, `expand_beam`):
  the candidates, the processed q at the previous bonus position [B, V] (zeros for a drafter
  that scores none), and the draft cache holding the root at its slot and beam expander e at
  root + e. A feature-level drafter feeds each beam entry its expander's output feature (a
  per-row gather from the previous level's outputs)."""
  drafter = decoder.drafter
  logits_BxV, bonus_logits_BxV, out_Bx1xD, cache = drafter.first_call(decoder, draft_params,
                                                                      state)

  def level(c, tokens_BxW, parent_BxW, offsets_U, visible_BxWxU):
    cache, out_BxLxD = c  # the previous level's output features (depth 1: the root's)
    g_BxWxD = take_rows(out_BxLxD, parent_BxW)
    logits_BxWxV, out_BxWxD, cache = drafter.step(decoder, draft_params, cache, tokens_BxW,
                                                  g_BxWxD, offsets=offsets_U,
                                                  visible=visible_BxWxU)
    return logits_BxWxV, (cache, None if out_BxWxD is None else out_BxWxD.astype(jnp.float32))

  out = None if out_Bx1xD is None else out_Bx1xD.astype(jnp.float32)
  drafted, (cache, _) = expand_beam(logits_BxV, (cache, out), level, key, spec, sampling)
  bonus_q_BxV = (jnp.zeros(logits_BxV.shape, jnp.float32) if bonus_logits_BxV is None
                 else process_logits(bonus_logits_BxV, sampling))
  return drafted, bonus_q_BxV, cache


class Layout(NamedTuple):
  """The verified tree of one iteration, per row: node tokens, depths (the verify call's
  offsets), ancestor mask incl. self, each node's expander id (-1: not expanded), the walk
  tables, and q at each node [B, N, V] (zeros where not expanded)."""
  tokens_BxN: jax.Array
  depths_BxN: jax.Array
  visible_BxNxN: jax.Array
  expander_BxN: jax.Array
  walk: verify.Walk
  q_BxNxV: jax.Array


def _ancestors(parents_BxN: jax.Array, depth: int) -> jax.Array:
  """mask[b, i, j]: node j is node i or an ancestor (the root is its own parent here)."""
  num = parents_BxN.shape[1]
  up_BxN = jnp.broadcast_to(jnp.arange(num, dtype=jnp.int32), parents_BxN.shape)
  mask_BxNxN = jax.nn.one_hot(up_BxN, num, dtype=jnp.bool_)
  for _ in range(depth):  # a node is at most D deep
    up_BxN = jnp.take_along_axis(parents_BxN, up_BxN, axis=1)
    mask_BxNxN = mask_BxNxN | jax.nn.one_hot(up_BxN, num, dtype=jnp.bool_)
  return mask_BxNxN


def layout(spec: DynamicTree, drafted: Drafted, root_B: jax.Array) -> Layout:
  """Reranks the candidates (the N - 1 best; `lax.top_k` puts the lower id, hence the lower
  depth, first among equal scores) and builds the node tables and the walk."""
  k, batch = spec.branch, root_B.shape[0]
  rows_Bx1 = jnp.arange(batch)[:, None]
  kept_BxM = jax.lax.top_k(drafted.scores_BxC, spec.nodes - 1)[1].astype(jnp.int32)
  node_of_BxC = jnp.full(drafted.scores_BxC.shape, -1, jnp.int32).at[rows_Bx1, kept_BxM].set(
      jnp.broadcast_to(jnp.arange(1, spec.nodes, dtype=jnp.int32), kept_BxM.shape))
  expander_of_BxC = jnp.full(drafted.scores_BxC.shape, -1, jnp.int32).at[
      rows_Bx1, drafted.expander_cand_BxE[:, 1:]].set(
          jnp.broadcast_to(jnp.arange(1, spec.num_expanders, dtype=jnp.int32),
                           (batch, spec.num_expanders - 1)))
  parent_cand_BxM = jnp.take_along_axis(drafted.expander_cand_BxE, kept_BxM // k, axis=1)
  parent_BxM = jnp.where(parent_cand_BxM >= 0, jnp.take_along_axis(
      node_of_BxC, jnp.maximum(parent_cand_BxM, 0), axis=1), 0)
  zero_Bx1 = jnp.zeros((batch, 1), jnp.int32)
  tokens_BxN = jnp.concatenate(
      [root_B[:, None], jnp.take_along_axis(drafted.tokens_BxC, kept_BxM, axis=1)], axis=1)
  depths_BxN = jnp.concatenate(
      [zero_Bx1, jnp.asarray(spec.candidate_depths_C())[kept_BxM]], axis=1)
  expander_BxN = jnp.concatenate(
      [zero_Bx1, jnp.take_along_axis(expander_of_BxC, kept_BxM, axis=1)], axis=1)
  # expander e's rank-r child is candidate e k + r: its token, and its node id or -1 (pruned)
  child_BxNK = (jnp.maximum(expander_BxN, 0)[:, :, None] * k
                + jnp.arange(k, dtype=jnp.int32)[None, None, :]).reshape(batch, -1)
  shape_BxNxK = expander_BxN.shape + (k,)
  walk = verify.Walk(
      jnp.take_along_axis(node_of_BxC, child_BxNK, axis=1).reshape(shape_BxNxK),
      jnp.take_along_axis(drafted.tokens_BxC, child_BxNK, axis=1).reshape(shape_BxNxK),
      jnp.broadcast_to((expander_BxN >= 0)[:, :, None], shape_BxNxK), spec.depth)
  q_BxNxV = jnp.where((expander_BxN >= 0)[:, :, None], jnp.take_along_axis(
      drafted.q_BxExV, jnp.maximum(expander_BxN, 0)[:, :, None], axis=1), 0.0)
  return Layout(tokens_BxN, depths_BxN,
                _ancestors(jnp.concatenate([zero_Bx1, parent_BxM], axis=1), spec.depth),
                expander_BxN, walk, q_BxNxV)


@dataclasses.dataclass(frozen=True)
class DynamicTreeScheme(ModelTree):
  """Draft a dynamic tree per iteration (EAGLE-2 style), verify its N nodes in one target call.

  A hashable decoding scheme, the static `TreeScheme`'s sibling (gin:
  gin/decoding/dynamic_tree.gin, gin/decoding/auto_dynamic_tree.gin). depth, width, branch,
  nodes: `shape.DynamicTree`. verifier: as `TreeScheme`'s (a function receives a `verify.Walk`).
  """

  depth: int = 4
  width: int = 4
  branch: int = 4
  nodes: int = 32
  verifier: Any = "auto"

  def __post_init__(self):
    _ = self.tree  # validates the sizes
    if not callable(self.verifier) and self.verifier not in VERIFIERS:
      raise ValueError(f"unknown tree verifier {self.verifier!r}; known: {VERIFIERS}")

  @property
  def tree(self) -> DynamicTree:
    return DynamicTree(self.depth, self.width, self.branch, self.nodes)

  @property
  def gamma(self) -> int:
    """Slots past the root both calls may write (the verify call N, the draft 1 + (D - 1) W),
    less one (`start.slack`), and at least D (a path's accepted drafts, the counters' widths)."""
    return max(self.nodes - 1, (self.depth - 1) * self.width, self.depth)

  def iteration(self, decoder, params, state: st.DecodeState) -> st.DecodeState:
    return dynamic_iteration(decoder, params, state, self)


def dynamic_iteration(decoder, params, state: st.DecodeState, scheme: DynamicTreeScheme
                      ) -> st.DecodeState:
  """One expand -> rerank -> verify -> keep a path -> commit iteration (one target call)."""
  sampling, drafter = decoder.sampling, decoder.drafter
  rng, k_draft, k_verify = jax.random.split(state.rng, 3)
  root_B = state.target_cache.index_B
  drafted, bonus_q_BxV, draft_cache = draft_dynamic(decoder, params.draft, state, k_draft,
                                                    scheme.tree, sampling)
  lay = layout(scheme.tree, drafted, st.last_tokens(state))
  logits_BxNxV, hidden, target_cache = drafter.verify(
      decoder, params.target, state.target_cache, lay.tokens_BxN, offsets=lay.depths_BxN,
      visible=lay.visible_BxNxN)
  p_BxNxV = process_logits(logits_BxNxV, sampling)
  verdict = scheme.verify_fn(sampling)(k_verify, lay.walk, lay.tokens_BxN, lay.q_BxNxV, p_BxNxV)
  n_B, path_BxD = verdict.num_accepted_B, verdict.path_BxD
  last_expander_B = jnp.take_along_axis(lay.expander_BxN, verdict.last_node_B[:, None], axis=1)
  if drafter.feeds_verified:  # fed the kept nodes again, with the target's states
    pending_B = jnp.zeros_like(state.done_B)
  else:  # the draft's entries of the path's expanded nodes gathered, as the target's
    slot_BxD = jnp.take_along_axis(lay.expander_BxN, jnp.maximum(path_BxD, 0), axis=1)
    draft_path_BxD = jnp.where((path_BxD >= 0) & (slot_BxD > 0), slot_BxD, -1)
    draft_cache = commit_path(draft_cache, root_B, draft_path_BxD, n_B)
    pending_B = last_expander_B[:, 0] < 0
  state = state.replace(rng=rng, target_cache=commit_path(target_cache, root_B, path_BxD, n_B),
                        draft_cache=draft_cache)
  new = commit_tree(state, verdict, p_BxNxV, lay.q_BxNxV, bonus_q_BxV, decoder.target.eos_id,
                    decoder.max_decode_len, pending_B=pending_B)
  return observe_tree(decoder, params, state, new, verdict, hidden)
