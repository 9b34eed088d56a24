"""`sampling.sample`: the one draw every loop makes (draft tokens, the AR token, the residual).

Why: at temperature 0 every distribution drawn from has a single nonzero entry, and `sample` then
takes the argmax and draws no random bits; otherwise it inverts the row's cumulative sum with one
uniform (`inverse_cdf`: a threefry Gumbel draw over V cost ~18x more on the 2-core CPU). These
tests pin that the shortcut is invisible (the inversion's token for every key), that the draw
follows the row's law (chi-square, zero-mass tokens never drawn, unnormalised rows), and that the
shortcut is really taken on the greedy path.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.sampling import (SamplingConfig, argmax, inverse_cdf, process_logits,
                                           sample)
from specdec_jax.testing import chi_square_gof


def test_single_entry_rows_give_that_entry_for_every_key():
  v = 37
  hot = jnp.asarray([3, 0, 36, 17])
  probs = jax.nn.one_hot(hot, v, dtype=jnp.float32)
  probs = probs.at[1, 0].set(0.25)  # unnormalised: still the only candidate
  for seed in range(20):
    key = jax.random.key(seed)
    np.testing.assert_array_equal(sample(key, probs), hot)
    np.testing.assert_array_equal(inverse_cdf(key, probs), hot)


def test_a_row_with_two_candidates_draws_by_inversion_for_the_whole_batch():
  """One non-degenerate row: every row comes from `inverse_cdf` with the same key, the one-hot
  row included (its entry whatever the uniform)."""
  rng = np.random.default_rng(0)
  mixed = jnp.asarray(rng.dirichlet(np.ones(11), size=3), jnp.float32)
  mixed = mixed.at[0].set(jax.nn.one_hot(4, 11))
  for seed in range(10):
    key = jax.random.key(seed)
    got = sample(key, mixed)
    np.testing.assert_array_equal(got, inverse_cdf(key, mixed))
    assert int(got[0]) == 4


def _draws(probs_V, n, seed=1):
  rows = jnp.broadcast_to(jnp.asarray(probs_V, jnp.float32), (n, len(probs_V)))
  return np.asarray(jax.jit(sample)(jax.random.key(seed), rows))


@pytest.mark.parametrize("probs", [
    [0.1, 0.6, 0.3],
    [0.0, 0.25, 0.0, 0.0, 0.5, 0.125, 0.0, 0.125, 0.0, 0.0],  # zero mass inside and at the end
    [3.0, 1.0, 0.0, 4.0],                                      # unnormalised (a residual's scale)
    [1e-4, 0.0, 0.9999, 0.0],                                  # a rare token next to a sure one
    # Two levels (V > 2 x INVERSION_BLOCK): mass at block edges, a block without mass, the last
    # entry of a padded last block.
    np.bincount([0, 127, 128, 300, 640, 699], [0.1, 0.2, 0.3, 0.15, 0.05, 0.2], minlength=700),
    np.random.default_rng(5).dirichlet(np.ones(1000)),
])
def test_the_draw_follows_the_row_and_never_takes_a_token_without_mass(probs):
  p = np.asarray(probs, np.float64) / np.sum(probs)
  counts = np.bincount(_draws(probs, 200_000), minlength=len(p))
  assert np.all(counts[p == 0] == 0), counts
  assert chi_square_gof(counts, p)[2] > 1e-3


def test_a_shifted_inversion_fails_the_same_check():
  """The check above can fail: the inversion off by one token (counting the exclusive running
  sums, cdf_i - p_i, as a hand-written inversion easily does) is caught."""
  p = np.asarray([0.1, 0.6, 0.3])
  rows = jnp.broadcast_to(jnp.asarray(p, jnp.float32), (50_000, 3))
  u = jax.random.uniform(jax.random.key(3), (50_000, 1))
  wrong = np.asarray(jnp.minimum(jnp.sum(jnp.cumsum(rows, -1) - rows <= u, -1), 2))
  assert chi_square_gof(np.bincount(wrong, minlength=3), p)[2] < 1e-6


def test_a_uniform_at_the_top_of_its_range_stays_inside_the_row(monkeypatch):
  """u * total may round up to the total; the last token with mass is drawn, never a trailing
  zero-mass one (nor an index past the row)."""
  monkeypatch.setattr(jax.random, "uniform",
                      lambda key, shape, dtype=jnp.float32: jnp.full(shape, 1.0 - 2**-24, dtype))
  probs = jnp.asarray([[0.2, 0.7, 0.1, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0]], jnp.float32)
  np.testing.assert_array_equal(inverse_cdf(jax.random.key(0), probs), [2, 2])
  monkeypatch.setattr(jax.random, "uniform",
                      lambda key, shape, dtype=jnp.float32: jnp.zeros(shape, dtype))
  probs = jnp.asarray([[0.0, 0.0, 0.4, 0.6]], jnp.float32)
  np.testing.assert_array_equal(inverse_cdf(jax.random.key(0), probs), [2])
  # Two levels: the first block with mass, then its first token with mass.
  wide = np.zeros((1, 1000), np.float32)
  wide[0, [300, 301, 900]] = [0.0, 0.5, 0.5]
  np.testing.assert_array_equal(inverse_cdf(jax.random.key(0), jnp.asarray(wide)), [301])
  monkeypatch.setattr(jax.random, "uniform",
                      lambda key, shape, dtype=jnp.float32: jnp.full(shape, 1.0 - 2**-24, dtype))
  np.testing.assert_array_equal(inverse_cdf(jax.random.key(0), jnp.asarray(wide)), [900])


@pytest.mark.parametrize("cfg", [SamplingConfig(), SamplingConfig(temperature=0.7, top_k=1)])
def test_greedy_path_takes_the_argmax_without_random_bits(cfg):
  """Temperature 0 (or top-k 1) gives one-hot rows; the branch that serves them draws no random
  bits, and the other branch (the inversion) does."""
  logits = jnp.asarray([[0.1, 2.0, -1.0, 0.5], [3.0, 2.0, 1.0, 0.0]], jnp.float32)
  probs = process_logits(logits, cfg)
  np.testing.assert_array_equal(sample(jax.random.key(0), probs), [1, 0])
  jaxpr = jax.make_jaxpr(sample)(jax.random.key(0), probs)
  (cond,) = [e for e in jaxpr.eqns if e.primitive.name == "cond"]
  argmax_branch, gumbel_branch = cond.params["branches"][1], cond.params["branches"][0]
  assert "random_bits" not in str(argmax_branch) and "threefry" not in str(argmax_branch)
  assert "random_bits" in str(gumbel_branch) or "threefry" in str(gumbel_branch)
  single = jnp.all(jnp.sum(probs > 0, axis=-1) == 1)
  assert bool(single), "the rows were meant to be one-hot"


def test_argmax_is_jnp_argmax_bit_for_bit():
  """`sampling.argmax` (two plain reductions, the CPU's fast form) answers what `jnp.argmax`
  answers: the first maximal entry on ties, the first NaN in a row holding one, the first entry
  of an all -inf row; integer scores too (prompt lookup's match lengths)."""
  rng = np.random.default_rng(0)
  x = rng.integers(-3, 4, size=(64, 3, 50)).astype(np.float32)  # many ties
  x[0, 0, 7] = np.nan
  x[0, 1, [2, 9]] = np.nan
  x[1, 0] = -np.inf
  x[1, 1, [4, 30]] = np.inf
  x[2, 2] = rng.normal(size=50).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(argmax(jnp.asarray(x))),
                                np.asarray(jnp.argmax(jnp.asarray(x), axis=-1)))
  assert argmax(jnp.asarray(x)).dtype == jnp.int32
  xi = rng.integers(-2, 3, size=(32, 17)).astype(np.int32)
  np.testing.assert_array_equal(np.asarray(argmax(jnp.asarray(xi))),
                                np.asarray(jnp.argmax(jnp.asarray(xi), axis=-1)))


def _sorted_top_p(logits, top_p):
  """The nucleus by sorting (the implementation the bisection replaced): the reference."""
  probs = np.asarray(jax.nn.softmax(jnp.asarray(logits), axis=-1), np.float64)
  out = np.array(logits, np.float32, copy=True)
  for row, p in zip(out.reshape(-1, out.shape[-1]), probs.reshape(-1, probs.shape[-1])):
    order = np.argsort(-p, kind="stable")
    before = np.cumsum(p[order]) - p[order]
    tau = p[order][before < top_p].min()
    row[p < tau] = -np.inf
  return out


@pytest.mark.parametrize("top_p", [0.5, 0.7, 0.95, 0.999])  # 0.7: the edge inside a tie
def test_top_p_keeps_the_sorts_nucleus_ties_and_masked_entries_included(top_p):
  """The bisection must keep exactly the sort's set: the smallest most-likely set reaching
  top_p, every token tied at its edge kept, entries already at -inf (top-k) never revived."""
  rng = np.random.default_rng(int(top_p * 1000))
  wide = rng.standard_normal((3, 4096)).astype(np.float32) * 2.5       # a 4k vocabulary
  peaked = np.full((2, 64), -4.0, np.float32)
  peaked[:, :3] = [3.0, 2.0, 2.0]                                      # a tie at the edge
  masked = rng.standard_normal((2, 64)).astype(np.float32)
  masked[:, 40:] = -np.inf                                             # after top-k
  for logits in (wide, peaked, masked):
    got = np.asarray(process_logits(jnp.asarray(logits), SamplingConfig(temperature=1.0,
                                                                        top_p=top_p)))
    want = _sorted_top_p(logits, top_p)
    np.testing.assert_array_equal(got > 0, np.isfinite(want), err_msg=f"top_p {top_p}")
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)
