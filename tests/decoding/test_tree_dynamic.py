"""The dynamic tree scheme (EAGLE-2 style) in the Decoder loop: greedy dynamic-tree decoding
equals greedy autoregressive decoding token for token, its counters add up, and the committed
caches are the ones the kept tokens alone build.

Why: at temperature 0 every verifier keeps target argmaxes and emits the target's argmax after
them, so any difference points at the beam expansion (windowed draft calls by depth), the rerank
into per-row node tables, the per-row masked verify call, a kept pruned child (emitted as the next
token), the draft commit from the beam's own slots, or the draft's pending flag. Budgets: one
where the rerank prunes (N - 1 < k + (D - 1) W k) with W < k, one that keeps every candidate,
one that prunes hard (N - 1 < D: no path reaches depth D, so paths end on pruned children);
T5, decoder-only and the llama presets; four rows with ragged acceptance (a random draft, the
target itself, the target with its top two swapped on rows 0 and 2).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.tree import DynamicTree, DynamicTreeScheme
from specdec_jax.models.kv_cache import valid_prefix_equal
from specdec_jax.testing import TopTwoSwapped, tiny_pair

MAX_LEN = 14
PRUNED = DynamicTreeScheme(depth=3, width=2, branch=3, nodes=8)  # 15 candidates, 7 verified
WHOLE = DynamicTreeScheme(depth=2, width=1, branch=2, nodes=5)   # 4 candidates, all verified
NARROW = DynamicTreeScheme(depth=3, width=1, branch=2, nodes=3)  # 6 candidates, 2 verified
INPUTS = {
    "t5": np.array([[5, 6, 7, 1, 0], [8, 9, 1, 0, 0], [4, 4, 4, 4, 1], [7, 1, 0, 0, 0]]),
    "decoder": np.array([[5, 6, 7, 2, 0], [8, 9, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]]),
}


@pytest.fixture(scope="module", params=["t5", "decoder", "llama"])
def setup(request):
  target, tp, draft, dp = tiny_pair(request.param)
  inputs = jnp.asarray(INPUTS["t5" if request.param == "t5" else "decoder"], jnp.int32)
  ar = Decoder(target, max_decode_len=MAX_LEN).generate(Params(tp), inputs)
  return target, tp, draft, dp, inputs, ar


def _run(target, tp, draft, dp, inputs, scheme):
  return Decoder(target, draft, scheme, max_decode_len=MAX_LEN).generate(Params(tp, dp), inputs)


def _assert_same(out, ar):
  np.testing.assert_array_equal(np.asarray(out.tokens_BxN), np.asarray(ar.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(out.lengths_B), np.asarray(ar.lengths_B))


def _assert_counters(out, scheme):
  """emitted = accepted + 1 per target call, minus one in a call that ended on a kept pruned
  child (an accepted draft emitted in place of the bonus; only where the rerank prunes) and in
  the call a row ended by a cut; the kept-depth histogram and the kept-rank statistics (kept
  pruned children included) agree."""
  c = {k: np.asarray(v) for k, v in vars(out.counters).items()}
  gap = c["target_calls_B"] - (c["emitted_B"] - c["accepted_B"])
  tree = scheme.tree
  if tree.nodes - 1 == tree.num_candidates:  # nothing pruned
    assert np.all((gap == 0) | (gap == 1)), gap
  assert np.all((gap >= 0) & (gap <= c["target_calls_B"])), gap
  depth = tree.depth
  assert np.all(c["accepts_per_position_BxG"][:, depth:] == 0)
  hist = c["accepted_length_hist_BxG1"]
  np.testing.assert_array_equal(hist.sum(axis=1), c["target_calls_B"])
  np.testing.assert_array_equal((hist * np.arange(hist.shape[1])).sum(axis=1), c["accepted_B"])
  np.testing.assert_array_equal(c["accepts_per_position_BxG"].sum(axis=0)[:depth],
                                np.asarray(out.stats.kept_rank_DxK).sum(axis=1))


SCHEMES = {"pruned": PRUNED, "whole": WHOLE, "narrow": NARROW}


def _cases(names, fast):
  """(model kind, scheme) for every kind and scheme, marked slow unless in `fast`. Why: the full
  cross product took ~2 minutes of the suite (a whole decode compiled per case); the fast run keeps
  every kind and every scheme at least once, the slow run all."""
  return [pytest.param(k, SCHEMES[s], id=f"{k}-{s}",
                       marks=() if (k, s) in fast else pytest.mark.slow)
          for k in ("t5", "decoder", "llama") for s in names]


@pytest.mark.parametrize("setup,scheme", _cases(
    ("pruned", "whole", "narrow"), {("t5", "pruned"), ("decoder", "narrow"), ("llama", "whole")}),
    indirect=["setup"])
def test_random_draft_equals_autoregressive(setup, scheme):
  target, tp, draft, dp, inputs, ar = setup
  out = _run(target, tp, draft, dp, inputs, scheme)
  _assert_same(out, ar)
  _assert_counters(out, scheme)


@pytest.mark.parametrize("setup,scheme", _cases(
    ("pruned", "narrow"), {("t5", "pruned"), ("decoder", "pruned"), ("llama", "narrow")}),
    indirect=["setup"])
def test_ragged_draft_equals_autoregressive(setup, scheme):
  """Rows 0 and 2 draft with the target's top two swapped (the right token is the draft's
  rank 1, scored below rank 0: kept or pruned by the rerank), rows 1 and 3 with the target."""
  target, tp, _, _, inputs, ar = setup
  out = _run(target, tp, TopTwoSwapped(target, rows=(0, 2)), tp, inputs, scheme)
  _assert_same(out, ar)
  _assert_counters(out, scheme)
  kept = np.asarray(out.stats.kept_rank_DxK)
  assert kept[:, 1].sum() > 0 and kept[:, 0].sum() > 0


def test_identical_draft_keeps_whole_paths(setup):
  """A draft that is the target: the walk accepts its greedy child at every depth, as a node or
  as a pruned child (a flat tiny model's deep greedy path scores below shallow alternatives),
  always of rank 0; it stops short of depth D only at a kept greedy node the beam did not
  expand (its depth's scores ranked it below W others), which is rare."""
  target, tp, _, _, inputs, ar = setup
  out = _run(target, tp, target, tp, inputs, PRUNED)
  _assert_same(out, ar)
  _assert_counters(out, PRUNED)
  calls = np.asarray(out.counters.target_calls_B)
  assert np.all(calls[np.asarray(ar.lengths_B) == MAX_LEN] <= -(-MAX_LEN // PRUNED.depth))
  accepted, drafted = np.asarray(out.counters.accepted_B), np.asarray(out.counters.drafted_B)
  assert np.all(accepted <= drafted) and accepted.sum() >= 0.9 * drafted.sum()
  assert np.asarray(out.stats.kept_rank_DxK)[:, 1:].sum() == 0


def test_paths_end_on_pruned_children():
  """N - 1 = 2 < D = 3 with a draft that is the target: the walk always accepts the greedy child,
  and the greedy path leaves the two kept nodes at an expanded node (the beam of one is its
  depth's greedy node), so every call ends on a kept pruned child, emitted as the next token
  and counted as accepted: emitted = accepted in every call (no bonus)."""
  target, tp, _, _ = tiny_pair("decoder")
  inputs = jnp.asarray(INPUTS["decoder"], jnp.int32)
  ar = Decoder(target, max_decode_len=MAX_LEN).generate(Params(tp), inputs)
  out = _run(target, tp, target, tp, inputs, NARROW)
  _assert_same(out, ar)
  _assert_counters(out, NARROW)
  c = out.counters
  np.testing.assert_array_equal(np.asarray(c.emitted_B), np.asarray(c.accepted_B))
  assert np.all(np.asarray(c.accepted_B) >= 2 * (np.asarray(c.target_calls_B) - 1))


@functools.partial(jax.jit, static_argnums=(0, 3))
def _chain_cache(model, params, inputs, length, tokens_BxL, index_B):
  """The cache of the buffer's tokens fed as one chain after the prompt, rolled back to index_B
  (one static shape: the whole buffer but its last slot fits the cache's slack)."""
  _, cache = model.extend(params, model.prefill(params, inputs, length), tokens_BxL[:, :-1])
  return cache.rollback(index_B)


@pytest.mark.parametrize("which,temperature", [("swapped", 0.0), ("random", 1.0)])
def test_committed_caches_equal_the_kept_tokens_own(which, temperature):
  """After each iteration both caches equal the caches built by feeding the emitted tokens as a
  chain (the target's up to the last token, the draft's one short where it is pending), so the
  beam's scattered draft slots and the tree's node slots were gathered right. The draft: the
  target with its top two swapped on rows 0 and 2 (greedy), or a random one (sampled)."""
  target, tp, draft, dp = tiny_pair("decoder")
  if which == "swapped":
    draft, dp = target, tp
  inputs = jnp.asarray(INPUTS["decoder"], jnp.int32)
  wrapped = TopTwoSwapped(draft, rows=(0, 2)) if which == "swapped" else draft
  decoder = Decoder(target, wrapped, PRUNED, SamplingConfig(temperature=temperature),
                    max_decode_len=24)
  state = decoder.init(Params(tp, dp), inputs, jax.random.key(3))
  step = jax.jit(decoder.iteration)
  pending_seen = np.zeros(4, bool)
  for _ in range(3):
    state = step(Params(tp, dp), state)  # a row that ended keeps its caches and length
    num, pending = np.asarray(state.num_B), np.asarray(state.draft_pending_B)
    pending_seen |= pending
    for model, params, cache, short in ((target, tp, state.target_cache, 0),
                                        (draft, dp, state.draft_cache, pending)):
      ref = _chain_cache(model, params, inputs, cache.length, state.tokens_BxL,
                         state.base_B + jnp.asarray(num - 1 - short, jnp.int32))
      assert valid_prefix_equal(cache, ref, atol=1e-5)
  assert pending_seen.any() and np.asarray(state.counters.accepted_B).sum() > 0
  assert not np.all(np.asarray(state.done_B))


def test_bad_settings_are_refused():
  with pytest.raises(ValueError, match="width"):
    DynamicTree(depth=2, width=3, branch=2, nodes=4)
  with pytest.raises(ValueError, match="nodes"):
    DynamicTree(depth=2, width=1, branch=2, nodes=6)  # 4 candidates
  with pytest.raises(ValueError, match="unknown tree verifier"):
    DynamicTreeScheme(verifier="nope")
  dec = Decoder(*tiny_pair("decoder")[::2], DynamicTreeScheme(2, 1, 2, 3, verifier="greedy"),
                SamplingConfig(temperature=1.0), max_decode_len=4)
  with pytest.raises(ValueError, match="temperature 0 only"):
    dec.scheme.verify_fn(dec.sampling)
  assert DynamicTreeScheme().gamma == 31 and DynamicTreeScheme(6, 10, 10, 32).gamma == 50
