"""The chain's temperature-0 path (token ids, no one-hot rows) equals its general path bit for bit.

Why: at temperature 0 with an exact rule `Chain.iteration` skips q rows, uniform draws, residuals
and min(p, q) sums (`drafter.greedy_chain_draft`, `speculative.greedy_accept`, `greedy_beta`).
Greedy equality with autoregressive decoding would not notice a wrong alpha, a wrong bonus row
kept in the state or a wrong pending flag: here the same decode runs through the general path (the
same token-wise rule registered under another name, which the greedy path does not take) and
every output must be identical: tokens, lengths, every counter, the final caches' indices.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import acceptance
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import GREEDY_RULES, Chain
from specdec_jax.testing import tiny_pair

GREEDY = SamplingConfig(temperature=0.0)
INPUTS = {
    "t5": np.array([[5, 6, 7, 1, 0], [8, 9, 1, 0, 0], [4, 4, 4, 4, 1], [7, 1, 0, 0, 0]]),
    "decoder": np.array([[5, 6, 7, 2, 0], [8, 9, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]]),
}


def _near_copy(target, tp, scale=0.3, seed=3):
  """The target with every weight perturbed by `scale` of its own spread: a draft that agrees
  with the target often, not always (some blocks partly kept)."""
  leaves, tree = jax.tree.flatten(tp)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
           for x, k in zip(leaves, keys)]
  return target, jax.tree.unflatten(tree, noisy)


def _decode(target, tp, draft, dp, inputs, gamma, rule, max_len=15):
  return Decoder(target, draft, Chain(gamma), GREEDY, rule=rule, max_decode_len=max_len).generate(
      Params(tp, dp), inputs)


def _assert_identical(fast, general):
  leaves_f, tree_f = jax.tree.flatten(fast.counters)
  leaves_g, tree_g = jax.tree.flatten(general.counters)
  assert tree_f == tree_g
  for a, b in zip(leaves_f, leaves_g):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_array_equal(np.asarray(fast.tokens_BxN), np.asarray(general.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(fast.lengths_B), np.asarray(general.lengths_B))


@pytest.mark.parametrize("kind,gamma", [  # each kind once fast, the other gamma slow
    ("t5", 3), ("decoder", 1), pytest.param("t5", 1, marks=pytest.mark.slow),
    pytest.param("decoder", 3, marks=pytest.mark.slow)])
def test_greedy_path_equals_the_general_path(kind, gamma):
  target, tp, _, _ = tiny_pair(kind)
  draft, dp = _near_copy(target, tp)
  inputs = jnp.asarray(INPUTS[kind], jnp.int32)
  fast = _decode(target, tp, draft, dp, inputs, gamma, "tokenwise")
  with acceptance.registered_rule("_tokenwise_general_path", acceptance.tokenwise) as name:
    assert name not in GREEDY_RULES
    general = _decode(target, tp, draft, dp, inputs, gamma, name)
  _assert_identical(fast, general)
  # Not vacuous: some drafts were kept and some rejected, some rows left their draft pending.
  c = general.counters
  assert 0 < int(np.sum(c.accepted_B)) < int(np.sum(c.drafted_B))
  assert 0.0 < float(np.sum(c.beta_sum_B)) < float(np.sum(c.beta_count_B))


def test_greedy_path_with_an_identical_draft_counts_the_bonus_positions():
  """Every draft accepted: every iteration leaves the draft pending, so the bonus position's
  beta (the state's one-hot row read at the draft's token) is counted at every iteration."""
  target, tp, _, _ = tiny_pair("t5")
  inputs = jnp.asarray(INPUTS["t5"], jnp.int32)
  fast = _decode(target, tp, target, tp, inputs, 2, "block")
  with acceptance.registered_rule("_block_general_path", acceptance.block) as name:
    general = _decode(target, tp, target, tp, inputs, 2, name)
  _assert_identical(fast, general)
  c = fast.counters
  np.testing.assert_array_equal(np.asarray(c.beta_sum_B), np.asarray(c.beta_count_B, np.float32))
  assert int(np.sum(c.beta_count_B)) > int(np.sum(c.drafted_B))  # bonus positions counted
