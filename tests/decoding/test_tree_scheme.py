"""The tree scheme in the Decoder loop: greedy tree decoding equals greedy autoregressive
decoding token for token, and its counters add up.

Why: at temperature 0 the tree verifier keeps the longest path of target argmaxes and emits the
target's argmax after it, so any difference points at the level-by-level draft, the masked
verify call, the path commit into consecutive slots (target and draft), the draft catch-up after
a path reaching the last depth, or EOS / length handling. The trees are (2, 2) and (3, 1, 1);
T5 and decoder-only; four rows with ragged acceptance (a random draft, the target itself, and a
draft whose top two tokens are swapped on some rows, so rank-1 siblings are kept and kept paths
are not the first child's).
"""
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import seam
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.tree import Tree, TreeScheme
from specdec_jax.testing import AlwaysWrong, EosAt, TopTwoSwapped, tiny_pair

MAX_LEN = 14
BRANCHINGS = [(2, 2), (3, 1, 1)]
INPUTS = {
    "t5": np.array([[5, 6, 7, 1, 0], [8, 9, 1, 0, 0], [4, 4, 4, 4, 1], [7, 1, 0, 0, 0]]),
    "decoder": np.array([[5, 6, 7, 2, 0], [8, 9, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]]),
}


@pytest.fixture(scope="module", params=["t5", "decoder"])
def setup(request):
  target, tp, draft, dp = tiny_pair(request.param)
  inputs = jnp.asarray(INPUTS[request.param], jnp.int32)
  ar = Decoder(target, max_decode_len=MAX_LEN).generate(Params(tp), inputs)
  return target, tp, draft, dp, inputs, ar


def _tree(target, tp, draft, dp, inputs, branching, max_len=MAX_LEN):
  return Decoder(target, draft, TreeScheme.from_branching(branching),
                 max_decode_len=max_len).generate(Params(tp, dp), inputs)


def _assert_same(out, ar):
  np.testing.assert_array_equal(np.asarray(out.tokens_BxN), np.asarray(ar.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(out.lengths_B), np.asarray(ar.lengths_B))


def _assert_counters(out, tree: Tree):
  """emitted = accepted + 1 per target call (minus one in the call a row ended by a cut);
  per-depth accepts, the kept-depth histogram and the kept-rank statistics agree."""
  c = {k: np.asarray(v) for k, v in vars(out.counters).items()}
  gap = c["target_calls_B"] - (c["emitted_B"] - c["accepted_B"])
  assert np.all((gap == 0) | (gap == 1)), gap
  depth = tree.max_depth
  assert np.all(c["accepts_per_position_BxG"][:, depth:] == 0)
  hist = c["accepted_length_hist_BxG1"]
  np.testing.assert_array_equal(hist.sum(axis=1), c["target_calls_B"])
  np.testing.assert_array_equal((hist * np.arange(hist.shape[1])).sum(axis=1), c["accepted_B"])
  np.testing.assert_array_equal(c["accepts_per_position_BxG"].sum(axis=0)[:depth],
                                np.asarray(out.stats.kept_rank_DxK).sum(axis=1))


@pytest.mark.parametrize("branching", BRANCHINGS)
def test_random_draft_equals_autoregressive(setup, branching):
  target, tp, draft, dp, inputs, ar = setup
  out = _tree(target, tp, draft, dp, inputs, branching)
  _assert_same(out, ar)
  _assert_counters(out, Tree.from_branching(branching))


@pytest.mark.parametrize("branching", BRANCHINGS)
def test_identical_draft_keeps_whole_paths(setup, branching):
  target, tp, _, _, inputs, ar = setup
  out = _tree(target, tp, target, tp, inputs, branching)
  _assert_same(out, ar)
  _assert_counters(out, Tree.from_branching(branching))
  depth = len(branching)
  # Every call keeps a whole path (depth D) plus the bonus, until the length cut.
  calls = np.asarray(out.counters.target_calls_B)
  np.testing.assert_array_equal(calls[np.asarray(ar.lengths_B) == MAX_LEN],
                                -(-MAX_LEN // (depth + 1)))
  np.testing.assert_allclose(np.asarray(out.counters.beta_sum_B / out.counters.beta_count_B), 1.0)
  # drafted counts the D drafts one path offers per call (not every node): a draft that is the
  # target has a per-path acceptance rate of exactly 1.
  np.testing.assert_array_equal(out.counters.drafted_B, out.counters.accepted_B)


def test_rank_one_siblings_kept_on_ragged_rows(setup):
  """Rows 0 and 2 draft with the target's top two swapped (only rank-1 children are right),
  rows 1 and 3 with the target itself: every row keeps whole paths, through other slots."""
  target, tp, _, _, inputs, ar = setup
  out = _tree(target, tp, TopTwoSwapped(target, rows=(0, 2)), tp, inputs, (2, 2))
  _assert_same(out, ar)
  _assert_counters(out, Tree.from_branching((2, 2)))
  kept = np.asarray(out.stats.kept_rank_DxK)
  assert kept[:, 1].sum() > 0 and kept[:, 0].sum() > 0


def test_always_wrong_draft_emits_one_token_per_call():
  target, tp, _, _ = tiny_pair("decoder")
  inputs = jnp.asarray(INPUTS["decoder"], jnp.int32)
  ar = Decoder(target, max_decode_len=MAX_LEN).generate(Params(tp), inputs)
  wrong = _WrongWithMask(target)
  out = _tree(target, tp, wrong, tp, inputs, (3, 1, 1))
  _assert_same(out, ar)
  assert int(np.asarray(out.counters.accepted_B).sum()) == 0


def test_eos_inside_a_path_ends_the_example_there():
  target, tp, _, _ = tiny_pair("t5")
  slots = (5, 2, 9, 13)
  eos_target = _EosWithMask(target, slots=slots)
  inputs = jnp.asarray(INPUTS["t5"], jnp.int32)
  ar = Decoder(eos_target, max_decode_len=MAX_LEN).generate(Params(tp), inputs)
  out = _tree(eos_target, tp, eos_target, tp, inputs, (2, 2))
  _assert_same(out, ar)
  _assert_counters(out, Tree.from_branching((2, 2)))


def test_wrapper_without_masked_extend_is_refused():
  """A wrapper that changes `extend` but not `extend_with_mask` would silently not apply to a
  tree: the seam says it has none, and the Decoder refuses it before tracing."""
  target, _, _, _ = tiny_pair("decoder")
  assert not hasattr(AlwaysWrong(target), "extend_with_mask")
  assert hasattr(seam.Delegate(target), "extend_with_mask")
  with pytest.raises(TypeError, match="extend_with_mask"):
    Decoder(target, AlwaysWrong(target), TreeScheme.from_branching((2,)))


def test_bad_settings_are_refused():
  target, _, draft, _ = tiny_pair("decoder")
  with pytest.raises(ValueError, match="level order"):
    TreeScheme(Tree((-1, 0, 1, 0)))
  with pytest.raises(ValueError, match="unknown tree verifier"):
    TreeScheme.from_branching((2,), verifier="nope")
  dec = Decoder(target, draft, TreeScheme.from_branching((2,), verifier="greedy"),
                SamplingConfig(temperature=1.0), max_decode_len=4)
  with pytest.raises(ValueError, match="temperature 0 only"):
    dec.scheme.verify_fn(dec.sampling)


class _WrongWithMask(AlwaysWrong):
  def extend_with_mask(self, params, cache, tokens_BxT, offsets, visible):
    logits, cache = self.base.extend_with_mask(params, cache, tokens_BxT, offsets, visible)
    return -logits, cache


class _EosWithMask(EosAt):
  """EosAt for a masked block: EOS is the argmax where the token fed sits at POSITION slots[b]
  (a tree node's position is its depth's, not its write slot)."""

  def extend_with_mask(self, params, cache, tokens_BxT, offsets, visible):
    index_B = cache.index_B
    logits, cache = self.base.extend_with_mask(params, cache, tokens_BxT, offsets, visible)
    pos_BxT = index_B[:, None] + jnp.broadcast_to(jnp.asarray(offsets), tokens_BxT.shape)
    slots_B = jnp.asarray(self.slots, jnp.int32)
    eos_logit_BxT = jnp.where(pos_BxT == slots_B[:, None], 1e4, -1e4)
    return logits.at[..., self.eos_id].set(eos_logit_BxT), cache
