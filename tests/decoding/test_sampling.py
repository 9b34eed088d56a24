"""`sampling.sample`: the one draw every loop makes (draft tokens, the AR token, the residual).

Why: at temperature 0 every distribution drawn from has a single nonzero entry, and `sample` then
skips the Gumbel noise (a threefry draw over V per row, about a third of the zoo target's decode
step on the 2-core CPU). These tests pin that the shortcut is invisible: the same token as the
Gumbel draw for every key, the Gumbel draw itself whenever one row has more than one candidate,
and the shortcut really taken (no random bits generated) on the greedy path.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.sampling import SamplingConfig, argmax, process_logits, sample


def _gumbel(key, probs):
  return jax.random.categorical(key, jnp.log(probs), axis=-1).astype(jnp.int32)


def test_single_entry_rows_give_that_entry_for_every_key():
  v = 37
  hot = jnp.asarray([3, 0, 36, 17])
  probs = jax.nn.one_hot(hot, v, dtype=jnp.float32)
  probs = probs.at[1, 0].set(0.25)  # unnormalised: still the only candidate
  for seed in range(20):
    key = jax.random.key(seed)
    np.testing.assert_array_equal(sample(key, probs), hot)
    np.testing.assert_array_equal(sample(key, probs), _gumbel(key, probs))


def test_a_row_with_two_candidates_draws_the_gumbel_sample_for_the_whole_batch():
  """One non-degenerate row: every row comes from the same Gumbel draw as before the shortcut
  (bit for bit, so seeded runs at temperature > 0 are unchanged)."""
  rng = np.random.default_rng(0)
  mixed = jnp.asarray(rng.dirichlet(np.ones(11), size=3), jnp.float32)
  mixed = mixed.at[0].set(jax.nn.one_hot(4, 11))
  for seed in range(10):
    key = jax.random.key(seed)
    np.testing.assert_array_equal(sample(key, mixed), _gumbel(key, mixed))
  # ... and it is a real draw: frequencies follow the row (chi-square would be overkill here).
  p = jnp.asarray([0.1, 0.6, 0.3], jnp.float32)
  draws = jax.vmap(lambda k: sample(k, p[None])[0])(jax.random.split(jax.random.key(1), 20000))
  np.testing.assert_allclose(np.bincount(np.asarray(draws), minlength=3) / 20000, p, atol=0.015)


@pytest.mark.parametrize("cfg", [SamplingConfig(), SamplingConfig(temperature=0.7, top_k=1)])
def test_greedy_path_takes_the_argmax_without_random_bits(cfg):
  """Temperature 0 (or top-k 1) gives one-hot rows; the branch that serves them draws no random
  bits, and the other branch (the Gumbel draw) does."""
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
