"""The static trees' temperature-0 path (token ids, `tree.token_path`) and the feature chain's
(`drafter.greedy_chain_draft` with `FeatureDrafter`) equal their general paths bit for bit.

Why: at temperature 0 with a named verifier ('auto', 'greedy') `TreeScheme`, with a token or a
feature-level draft, carries argmax tables instead of one-hot rows: their own greedy walk, beta
from agreeing argmaxes, the kept row rebuilt from the next token. Greedy equality with
autoregressive decoding (tests/decoding/test_tree_scheme.py, test_tree_feature.py, which now run
this path) cannot see a wrong alpha, a wrong kept sibling rank or tried count in the tree
statistics, a wrong bonus row or pending flag. Here the same decode runs through the general path
too (the verifier passed as the function `verify.greedy`, which keeps it) and everything must be
identical: tokens, lengths, every counter, the tree statistics. The feature chain's general path
is forced as the chain's test forces it (the token-wise rule registered under another name).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import acceptance
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.decoding.tree import Tree, TreeScheme, verify
from specdec_jax.decoding.tree.token_path import argmax_walk, uses_token_path
from specdec_jax.testing import TopTwoSwapped, tiny_feature_pair, tiny_pair

GREEDY = SamplingConfig(temperature=0.0)
INPUTS = {
    "t5": np.array([[5, 6, 7, 1, 0], [8, 9, 1, 0, 0], [4, 4, 4, 4, 1], [7, 1, 0, 0, 0]]),
    "decoder": np.array([[5, 6, 7, 2, 0], [8, 9, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]]),
}


def _near_copy(tp, scale=0.3, seed=3):
  """The target's weights, each perturbed by `scale` of its own spread: a draft that agrees with
  the target often, not always, so paths of every depth and both kept ranks occur."""
  leaves, tree = jax.tree.flatten(tp)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [x + scale * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
                                   for x, k in zip(leaves, keys)])


def _assert_identical(fast, general, parts=("counters", "stats")):
  for part in parts:
    leaves_f, tree_f = jax.tree.flatten(getattr(fast, part))
    leaves_g, tree_g = jax.tree.flatten(getattr(general, part))
    assert tree_f == tree_g
    for a, b in zip(leaves_f, leaves_g):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(np.asarray(fast.tokens_BxN), np.asarray(general.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(fast.lengths_B), np.asarray(general.lengths_B))


def _not_vacuous(out):
  c = out.counters
  assert 0 < int(np.sum(c.accepted_B)) < int(np.sum(c.drafted_B))
  assert 0.0 < float(np.sum(c.beta_sum_B)) < float(np.sum(c.beta_count_B))


def test_the_token_path_is_taken_for_named_verifiers_at_temperature_0_only():
  assert uses_token_path("auto", GREEDY) and uses_token_path("greedy", GREEDY)
  assert not uses_token_path(verify.greedy, GREEDY)
  assert not uses_token_path("auto", SamplingConfig(temperature=1.0))
  assert not uses_token_path("recursive_rejection", GREEDY)


def _pairwise(*cases):
  """`cases` (tuples of parameters) with every case not in `FAST` marked slow. Why: the full
  cross products took ~2 minutes of the suite; a fast run keeps a set that covers every pair of
  values (each kind with each branching, each branching swapped and not), the slow run all."""
  return [c[:-1] if c[:-1] in c[-1] else pytest.param(*c[:-1], marks=pytest.mark.slow)
          for c in cases]


_TOKEN_TREE_FAST = {("t5", (2, 2), False), ("t5", (3, 1, 1), True), ("decoder", (2, 2), True),
                    ("decoder", (3, 1, 1), False)}


@pytest.mark.parametrize("kind,branching,swapped", _pairwise(*[
    (k, b, s, _TOKEN_TREE_FAST) for k in ("t5", "decoder") for b in ((2, 2), (3, 1, 1))
    for s in (False, True)]))
def test_token_tree_token_path_equals_the_general_path(kind, branching, swapped):
  """A near copy of the target as the draft; swapped: the target itself with its top two
  logits swapped on rows 0 and 2, so only rank-1 siblings are kept there (kept ranks and tried
  counts differ from the first child's) and beta is 0 there while paths are kept whole."""
  target, tp, _, _ = tiny_pair(kind)
  draft, dp = (TopTwoSwapped(target, rows=(0, 2)), tp) if swapped else (target, _near_copy(tp))
  inputs = jnp.asarray(INPUTS[kind], jnp.int32)

  def run(verifier):
    return Decoder(target, draft, TreeScheme.from_branching(branching, verifier), GREEDY,
                   max_decode_len=15).generate(Params(tp, dp), inputs)

  fast, general = run("auto"), run(verify.greedy)
  _assert_identical(fast, general)
  c = general.counters
  assert 0.0 < float(np.sum(c.beta_sum_B)) < float(np.sum(c.beta_count_B))
  if swapped:
    kept = np.asarray(general.stats.kept_rank_DxK)
    assert kept[:, 0].sum() > 0 and kept[:, 1].sum() > 0
  else:
    assert 0 < int(np.sum(c.accepted_B)) < int(np.sum(c.drafted_B))


@pytest.mark.parametrize("kind,vocab,branching", _pairwise(*[
    (k, 8, b, {("t5", 8, (2, 1, 1)), ("decoder", 8, (3, 2))}) for k in ("t5", "decoder")
    for b in ((2, 1, 1), (3, 2))]))
def test_feature_tree_token_path_equals_the_general_path(kind, vocab, branching):
  target, tp, draft, dp = tiny_feature_pair(kind, vocab)
  inputs = jnp.asarray(np.minimum(INPUTS[kind], vocab - 1), jnp.int32)

  def run(verifier):
    scheme = TreeScheme(tuple(branching), verifier)
    return Decoder(target, draft, scheme, GREEDY, max_decode_len=12).generate(Params(tp, dp),
                                                                              inputs)

  fast, general = run("greedy"), run(verify.greedy)
  _assert_identical(fast, general)
  _not_vacuous(general)


@pytest.mark.parametrize("pruned", [False, True])
def test_argmax_walk_gives_the_greedy_verifiers_verdict(pruned):
  """Every field of the verdict, on random trees over 3 tokens (matches at every rank and
  depth). `tried` counts beyond 1 are invisible to a decode (the statistics read tried > 0), so
  only this comparison sees them. pruned: a `Walk` whose children of some nodes are not nodes
  (a dynamic tree's pruned candidates, still tried; a kept one ends the walk)."""
  tree = Tree.from_branching((3, 2, 2))
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  batch, vocab = 64, 3
  tokens_BxN = jax.random.randint(k1, (batch, tree.num_nodes), 0, vocab, jnp.int32)
  target_BxN = jax.random.randint(k2, (batch, tree.num_nodes), 0, vocab, jnp.int32)
  walk = verify.Walk.of_tree(tree, tokens_BxN)
  if pruned:
    cut_BxNxK = jax.random.bernoulli(k3, 0.3, walk.children_BxNxK.shape)
    walk = walk.replace(children_BxNxK=jnp.where(cut_BxNxK, -1, walk.children_BxNxK))
  p_BxNxV = jax.nn.one_hot(target_BxN, vocab, dtype=jnp.float32)
  want = verify.greedy(None, walk, tokens_BxN, None, p_BxNxV)
  got = argmax_walk(walk, tokens_BxN, target_BxN)
  for name in ("num_accepted_B", "path_BxD", "tokens_BxD", "last_node_B", "next_token_B",
               "rank_BxD", "tried_BxD", "pruned_B"):
    np.testing.assert_array_equal(np.asarray(getattr(got, name)), np.asarray(getattr(want, name)),
                                  err_msg=name)
  assert np.asarray(want.tried_BxD).max() > 1 and np.asarray(want.num_accepted_B).max() == 3
  assert np.asarray(want.pruned_B).any() == pruned


@pytest.mark.parametrize("kind,gamma", _pairwise(*[
    (k, g, {("t5", 3), ("decoder", 1)}) for k in ("t5", "decoder") for g in (1, 3)]))
def test_feature_chain_token_path_equals_the_general_path(kind, gamma):
  """Counters and the pending entries (`FeatureCarry`, the final state's draft_carry) alike."""
  target, tp, draft, dp = tiny_feature_pair(kind, 8)
  inputs = jnp.asarray(np.minimum(INPUTS[kind], 7), jnp.int32)

  def run(rule):
    """(the result, the final state's pending entries): the loop run without `finish`, which
    keeps no drafter carry."""
    decoder = Decoder(target, draft, Chain(gamma), GREEDY, rule=rule, max_decode_len=12)
    final = jax.jit(lambda p, x: decoder.run(p, decoder.init(p, x, jax.random.key(0))))(
        Params(tp, dp), inputs)
    return decoder.finish(final), final.draft_carry

  fast, fast_carry = run("tokenwise")
  with acceptance.registered_rule("_tokenwise_general_path", acceptance.tokenwise) as name:
    general, general_carry = run(name)
  _assert_identical(fast, general)
  leaves_f, tree_f = jax.tree.flatten(fast_carry)
  leaves_g, tree_g = jax.tree.flatten(general_carry)
  assert tree_f == tree_g and len(leaves_f) == 2  # g_BxG1xD, count_B
  for a, b in zip(leaves_f, leaves_g):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  c = general.counters
  assert 0 < int(np.sum(c.accepted_B)) < int(np.sum(c.drafted_B))
