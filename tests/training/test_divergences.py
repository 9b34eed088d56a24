"""Each divergence's value on a hand-computed pair, zero on equal distributions, finite gradients.

p = (1/2, 1/2) (teacher), q = (1/4, 3/4) (student); by hand:
  FKL = 1/2 ln(4/3)                                   = 0.1438410362
  RKL = 1/4 ln(1/2) + 3/4 ln(3/2)                     = 0.1308120359
  TVD = 1/2 (1/4 + 1/4)                               = 0.25
  JSD(1/2): m = (3/8, 5/8),
    KL(p || m) = 1/2 ln(4/3) + 1/2 ln(4/5)            = 0.0322692606
    KL(q || m) = 1/4 ln(2/3) + 3/4 ln(6/5)            = 0.0353748906
    JSD = (0.0322692606 + 0.0353748906) / 2           = 0.0338220756
  JSD(1/4): m = (5/16, 11/16),
    1/4 [1/2 ln(8/5) + 1/2 ln(8/11)] + 3/4 [1/4 ln(4/5) + 3/4 ln(12/11)] = 0.0260482210
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.training import divergences

P = np.log(np.array([[[0.5, 0.5]]], np.float32))
Q = np.log(np.array([[[0.25, 0.75]]], np.float32))
HAND = {
    ("fkl", 0.5): 0.5 * math.log(4 / 3),
    ("rkl", 0.5): 0.25 * math.log(0.5) + 0.75 * math.log(1.5),
    ("tvd", 0.5): 0.25,
    ("jsd", 0.5): 0.5 * (0.5 * math.log(4 / 3) + 0.5 * math.log(4 / 5))
                  + 0.5 * (0.25 * math.log(2 / 3) + 0.75 * math.log(6 / 5)),
    ("jsd", 0.25): 0.25 * (0.5 * math.log(8 / 5) + 0.5 * math.log(8 / 11))
                   + 0.75 * (0.25 * math.log(4 / 5) + 0.75 * math.log(12 / 11)),
}


@pytest.mark.parametrize("name,beta", sorted(HAND))
def test_value_on_a_hand_computed_pair(name, beta):
  got = float(divergences.per_token(name, Q, P, beta=beta)[0, 0])  # student q, teacher p
  assert got == pytest.approx(HAND[(name, beta)], abs=2e-7)


def test_hand_values_are_the_documented_numbers():
  assert HAND[("fkl", 0.5)] == pytest.approx(0.1438410362, abs=1e-9)
  assert HAND[("rkl", 0.5)] == pytest.approx(0.1308120359, abs=1e-9)
  assert HAND[("jsd", 0.5)] == pytest.approx(0.0338220756, abs=1e-9)
  assert HAND[("jsd", 0.25)] == pytest.approx(0.0260482210, abs=1e-9)


def test_tvd_is_one_minus_the_acceptance_rate():
  s, t = jax.random.normal(jax.random.key(0), (2, 3, 2, 17)) * 2
  tvd = divergences.per_token("tvd", s, t)
  alpha = jnp.sum(jnp.minimum(jax.nn.softmax(s), jax.nn.softmax(t)), axis=-1)
  np.testing.assert_allclose(np.asarray(tvd), np.asarray(1 - alpha), atol=1e-6)


def test_temperature_scales_both_logits():
  t = 2.0
  got = divergences.per_token("rkl", 2 * Q, 2 * P, temperature=t)  # logits / t = log q, log p
  assert float(got[0, 0]) == pytest.approx(HAND[("rkl", 0.5)], abs=2e-7)


@pytest.mark.parametrize("name", divergences.DIVERGENCES)
def test_zero_when_equal_and_positive_otherwise(name):
  a, b = jax.random.normal(jax.random.key(1), (2, 4, 5, 33)) * 3
  assert float(jnp.max(jnp.abs(divergences.per_token(name, a, a)))) < 1e-6
  assert float(jnp.min(divergences.per_token(name, a, b))) > 0


@pytest.mark.parametrize("name", divergences.DIVERGENCES)
def test_gradients_are_finite_and_reach_only_the_student(name):
  s, t = jax.random.normal(jax.random.key(2), (2, 2, 3, 9)) * 5
  t = t.at[..., 0].set(-80.0)  # a teacher probability that underflows in float32
  w = jnp.ones((2, 3))
  gs, gt = jax.grad(lambda a, b: divergences.weighted_sum(name, a, b, w), argnums=(0, 1))(s, t)
  assert bool(jnp.all(jnp.isfinite(gs))) and float(jnp.abs(gs).max()) > 0
  assert float(jnp.abs(gt).max()) == 0.0
  # At equal distributions the gradient vanishes (a minimum), TVD's subgradient included.
  g0 = jax.grad(lambda a: divergences.weighted_sum(name, a, s, w))(s)
  assert float(jnp.abs(g0).max()) < 1e-5


def test_weights_select_positions():
  w = jnp.array([[1.0, 0.0]])
  s = jnp.concatenate([Q, Q], axis=1)
  t = jnp.concatenate([P, Q], axis=1)
  assert float(divergences.weighted_sum("fkl", s, t, w)) == pytest.approx(HAND[("fkl", 0.5)],
                                                                          abs=2e-7)


def test_bad_settings_name_the_problem():
  with pytest.raises(ValueError, match="unknown divergence 'kl'"):
    divergences.check("kl")
  with pytest.raises(ValueError, match="jsd_beta must lie strictly between 0 and 1"):
    divergences.check("jsd", 1.0)
