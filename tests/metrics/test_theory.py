"""Speedup theory and the choice of gamma (specdec_jax/metrics/theory.py) and the cost measurement (specdec_jax/timing.py).

Why: GAMMA='auto' is what keeps a run from being slower than autoregressive decoding, so the
formula must reproduce the paper's own numbers, and the choice must fall back to 0 when the
measured verify cost eats the gain.
"""
import pytest

from specdec_jax import timing
from specdec_jax.metrics import theory as g

# Leviathan et al. Table 1 (c = 0, v = 1): (alpha, gamma) -> (operations, speed).
TABLE_1 = [((0.6, 2), (1.53, 1.96)), ((0.7, 3), (1.58, 2.53)), ((0.8, 2), (1.23, 2.44)),
           ((0.8, 5), (1.63, 3.69)), ((0.9, 2), (1.11, 2.71)), ((0.9, 10), (1.60, 6.86))]


@pytest.mark.parametrize("point,expected", TABLE_1)
def test_leviathan_table_1(point, expected):
  alpha, gamma = point
  ops, speed = expected
  assert g.predicted_speedup(alpha, gamma, c=0.0, v=1.0) == pytest.approx(speed, abs=0.006)
  assert g.operations_factor(alpha, gamma) == pytest.approx(ops, abs=0.006)


def test_leviathan_table_4_expected_speedups():
  """EnDe T=0, T5-small draft: alpha 0.75, c 0.02, gamma 7 -> expected 3.2x."""
  assert g.predicted_speedup(0.75, 7, c=0.02) == pytest.approx(3.2, abs=0.05)
  assert g.predicted_speedup(0.82, 7, c=0.11) == pytest.approx(2.5, abs=0.05)  # T5-large


def test_edges():
  assert g.expected_tokens(1.0, 4) == 5.0
  assert g.expected_tokens(0.0, 4) == 1.0
  assert g.predicted_speedup(0.9, 0, c=0.5, v=3.0) == 1.0
  with pytest.raises(ValueError):
    g.expected_tokens(1.5, 2)


def test_some_gamma_helps_iff_alpha_exceeds_c():
  assert g.choose_gamma(0.1, c=0.2, v_curve=None, max_gamma=16) == 0
  chosen = g.choose_gamma(0.5, c=0.1, v_curve=None, max_gamma=16)
  assert chosen >= 1
  assert g.predicted_speedup(0.5, 1, 0.1) >= (1 + 0.5) / (1 + 0.1) - 1e-12


def test_choice_is_the_argmax_under_a_measured_verify_curve():
  v = {1: 1.0, 2: 1.3, 3: 1.6, 4: 3.1, 5: 3.4, 6: 3.7, 7: 4.0, 8: 4.2, 9: 4.4}
  alpha, c = 0.85, 0.05
  best = max(range(1, 9), key=lambda k: g.predicted_speedup(alpha, k, c, v[k + 1]))
  assert g.choose_gamma(alpha, c, v, max_gamma=8) == best == 2


def test_choice_falls_back_to_autoregressive_when_verify_is_expensive():
  v = [1.0 + 1.5 * (t - 1) for t in range(1, 10)]  # v(T) grows like T: no block is cheap
  assert g.choose_gamma(0.6, 0.05, v, max_gamma=8) == 0
  assert g.choose_gamma(0.6, 0.05, v, max_gamma=8, min_speedup=0.5) > 0


def test_curve_respects_the_measured_range():
  curve = g.speedup_curve(0.7, 0.1, {1: 1.0, 3: 1.2}, max_gamma=8)
  assert sorted(curve) == [0, 2]
  with pytest.raises(KeyError):
    g.v_of([1.0, 1.1], 3)
  assert g.v_of(None, 7) == 1.0 and g.v_of(2.0, 3) == 2.0


@pytest.mark.slow
def test_measure_costs_on_tiny_models():
  import jax.numpy as jnp
  from specdec_jax import testing
  target, tp, draft, dp = testing.tiny_pair("decoder")
  costs = timing.measure_costs(target, tp, draft, dp, jnp.ones((1, 4), jnp.int32) * 5, max_tokens=3,
                          repeats=3)
  assert costs.v[1] == 1.0 and sorted(costs.v) == [1, 2, 3]
  assert costs.c > 0 and costs.target_ms > 0 and costs.draft_ms > 0
  assert costs.v[1] <= costs.v[2] <= costs.v[3]  # noise never makes a longer verify cheaper
