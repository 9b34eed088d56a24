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


def test_the_lone_extend_formula_is_the_loop_formula_in_target_steps():
  """One formula place: E * T_ar / T_iter with T_ar = 1 target step, T_iter = G c + v."""
  assert g.predicted_speedup(0.7, 3, 0.1, 1.4) == pytest.approx(
      g.loop_speedup(g.expected_tokens(0.7, 3), 1.0, 3 * 0.1 + 1.4))
  assert g.loop_speedup(2.0, 4.0, 6.0) == pytest.approx(2.0 * 4.0 / 6.0)
  # With N tokens per request, the per-request fixed costs count once on each side.
  assert g.loop_speedup(2.0, 4.0, 6.0, tokens=40, ar_fixed=10.0, spec_fixed=14.0) == \
      pytest.approx((10 + 40 * 4) / (14 + 20 * 6))
  with pytest.raises(ValueError):
    g.loop_speedup(2.0, 4.0, 0.0)


def test_the_draft_call_budget_is_the_loop_formula_solved_for_the_draft():
  """At the budget the loop formula gives exactly the goal; a dearer draft falls short; a goal
  that free calls miss has no budget. Fails if the fixed costs or E enter the wrong way."""
  kw = dict(tokens=40, ar_iteration=4.0, ar_fixed=10.0, spec_fixed=14.0)
  budget = g.draft_call_budget(2.0, 3.0, 5.0, 4, **kw)
  assert budget == pytest.approx((((10 + 40 * 4) / 2.0 - 14) * 3.0 / 40 - 5.0) / 4)
  assert g.loop_speedup(3.0, 4.0, 5.0 + 4 * budget, tokens=40, ar_fixed=10.0,
                        spec_fixed=14.0) == pytest.approx(2.0)
  assert g.loop_speedup(3.0, 4.0, 5.0 + 4 * budget * 1.1, tokens=40, ar_fixed=10.0,
                        spec_fixed=14.0) < 2.0
  assert g.draft_call_budget(3.0, 3.0, 5.0, 4, **kw) is None  # free calls: 2.11x < 3x
  assert g.draft_call_budget(20.0, 3.0, 5.0, 4, **kw) is None  # fixed costs alone exceed it
  with pytest.raises(ValueError):
    g.draft_call_budget(2.0, 3.0, 5.0, 0, **kw)


def test_best_gamma_needs_to_beat_the_bar():
  assert g.best_gamma({0: 1.0, 1: 1.05, 2: 1.3, 3: 1.2}, 1.1) == 2
  assert g.best_gamma({0: 1.0, 1: 1.05}, 1.1) == 0
  assert g.best_gamma({0: 1.0}, 1.0) == 0


def test_block_expected_length_is_its_own_not_the_tokenwise_formula():
  """Sun et al.'s two-token example: context-independent p = (1/3, 2/3), q = (2/3, 1/3), so
  alpha = 2/3. Token-wise verification keeps 10/9 drafts per block of 2 on average, block
  verification 11/9. Counting, from the block rule run many times, how often it kept at least
  i drafts (what a run's `accepts_per_position` holds) gives block's expected length; the
  token-wise formula in alpha would give token-wise's."""
  import jax
  import jax.numpy as jnp
  from specdec_jax.decoding import acceptance as rules
  rows, gamma = 200_000, 2
  p = jnp.asarray([1 / 3, 2 / 3], jnp.float32)
  q = jnp.asarray([2 / 3, 1 / 3], jnp.float32)
  k_draft, k_rule = jax.random.split(jax.random.key(0))
  x_BxG = jax.random.categorical(k_draft, jnp.log(q), shape=(rows, gamma)).astype(jnp.int32)
  q_BxGxV = jnp.broadcast_to(q, (rows, gamma, 2))
  p_BxG1xV = jnp.broadcast_to(p, (rows, gamma + 1, 2))
  alpha = float(jnp.sum(jnp.minimum(p, q)))
  n_block = jax.jit(rules.block)(k_rule, x_BxG, q_BxGxV, p_BxG1xV)[0]
  n_token = jax.jit(rules.tokenwise)(k_rule, x_BxG, q_BxGxV, p_BxG1xV)[0]
  at_least = [float(jnp.mean(n_block >= i)) for i in range(1, gamma + 1)]
  block_e = g.expected_tokens_per_iteration(alpha, gamma, "block", at_least)
  token_e = g.expected_tokens_per_iteration(alpha, gamma, "tokenwise")
  assert token_e == pytest.approx(1 + 10 / 9, abs=1e-6)
  assert float(jnp.mean(n_token)) + 1 == pytest.approx(token_e, abs=0.01)
  # Token-wise from its own measured profile: here positions are independent (i.i.d. rows), so
  # the profile and alpha's formula agree; the profile is what a run predicts with.
  token_at_least = [float(jnp.mean(n_token >= i)) for i in range(1, gamma + 1)]
  assert g.expected_tokens_per_iteration(alpha, gamma, "tokenwise", token_at_least) == \
      pytest.approx(token_e, abs=0.01)
  assert block_e == pytest.approx(1 + 11 / 9, abs=0.01)
  assert block_e - token_e > 0.08  # the token-wise formula would miss block's gain
  assert at_least[0] == pytest.approx(alpha, abs=0.01)  # A_1 = alpha for both rules
  with pytest.raises(ValueError, match="needs P"):
    g.expected_tokens_per_iteration(alpha, 3, "block", at_least)


def test_predict_is_empty_without_costs_and_one_at_gamma_zero():
  costs = timing.Costs(target_ms=2.0, draft_ms=0.2, c=0.1, v={4: 1.5})
  assert g.predict(3, 0.8, None, temperature=0.0) == g.Prediction()
  assert g.predict(None, 0.8, costs, temperature=0.0) == g.Prediction()
  p = g.predict(0, None, costs, temperature=0.0)
  assert (p.speedup, p.source, p.v, p.c) == (1.0, "autoregressive", 1.0, 0.1)
  assert g.predict(3, None, costs, temperature=0.0) == g.Prediction(c=0.1, v=1.5)


def test_predict_prefers_the_timed_loop_over_lone_extend():
  costs = timing.Costs(target_ms=2.0, draft_ms=0.2, c=0.1, v={4: 1.5})
  profile = [0.8, 0.7, 0.5]
  lone = g.predict(3, 0.8, costs, temperature=1.0, accepts_per_position=profile)
  assert lone.source == "lone_extend" and lone.expected_tokens == pytest.approx(3.0)
  assert lone.speedup == lone.lone_extend == pytest.approx(3.0 / (3 * 0.1 + 1.5))
  loop = {"ar_ms": 4.0, "ar_fixed_ms": 8.0, "iteration_ms": {"3": 7.0}, "fixed_ms": {"3": 11.0}}
  timed = g.predict(3, 0.8, costs, temperature=1.0, accepts_per_position=profile,
                         loop=loop, tokens=(40.0, 30.0))
  assert timed.source == "loop" and timed.iteration_ms == 7.0
  assert timed.speedup == pytest.approx((8 + 40 * 4) / (11 + 30 / 3.0 * 7))
  assert timed.lone_extend == lone.lone_extend


def _ordered_trees(num_nodes):
  """Every rooted ordered tree of `num_nodes` nodes as level-ordered parents (non-decreasing,
  each parent before its children)."""
  def grow(parents):
    if len(parents) == num_nodes:
      yield tuple(parents)
      return
    for p in range(parents[-1] if len(parents) > 1 else 0, len(parents)):
      yield from grow(parents + [p])
  yield from grow([-1])


def _depth(parents):
  d = [0]
  for p in parents[1:]:
    d.append(d[p] + 1)
  return max(d)


@pytest.mark.parametrize("max_depth", [0, 2, 3])
def test_the_tree_bound_is_above_every_tree_and_tight_for_one_row(max_depth):
  # Rates that differ by depth (rank 1 likelier at depth 2, rank 0 likelier at depth 3): the
  # bound must sit at or above every tree of 2..7 nodes, and equal the best tree where every
  # depth shares one row whose s(r) falls with r.
  # A third set keeps rank 2 likelier than rank 1 (s = 0.5, 0.05, 0.4): three children of the
  # root beat any deeper tree of 4 nodes, which only the bound's s* (max over r' >= r) sees.
  varied = [[0.6, 0.3, 0.2], [0.5, 0.6, 0.1], [0.8, 0.2, 0.2]]
  rising = [[0.5, 0.1, 0.4 / 0.45, 0.0]]
  shared = [0.7, 0.4, 0.2]
  for n in range(2, 8):
    trees = [t for t in _ordered_trees(n) if not max_depth or _depth(t) <= max_depth]
    for rates in (varied, rising):
      best = max(g.tree_expected_tokens(t, rates) for t in trees)
      assert g.tree_tokens_bound(n, rates, max_depth) >= best - 1e-12
    exact = max(g.tree_expected_tokens(t, shared) for t in trees)
    assert g.tree_tokens_bound(n, [shared] * 3, max_depth) == pytest.approx(exact)
  assert g.tree_tokens_bound(1, varied) == 1.0
  with pytest.raises(ValueError, match="num_nodes"):
    g.tree_tokens_bound(0, varied)


def test_the_tree_bound_reads_only_measured_ranks():
  # A (2, 1) probe measured ranks 0-1 at depth 1 and rank 0 at depth 2; rank_acceptance filled
  # depth 2's rank 1 with its rank 0 (0.3: s = 0.7 x 0.3 = 0.21), which must not lift the bound
  # on rank 1 above depth 1's measured s(1) = 0.5 x 0.2.
  filled = [[0.5, 0.2], [0.3, 0.3]]
  assert g.tree_tokens_bound(3, filled, 1, measured=(2, 1)) == pytest.approx(1 + 0.5 + 0.1)
  assert g.tree_tokens_bound(3, filled, 1) == pytest.approx(1 + 0.5 + 0.21)
  # At most max(measured) children a node: a third child of the root was never tried.
  assert g.tree_tokens_bound(4, filled, 1, measured=(2, 1)) == pytest.approx(1 + 0.5 + 0.1)


def test_alpha_for_tokens_inverts_the_expected_length():
  for alpha, gamma in ((0.62, 1), (0.84, 3), (0.3, 8)):
    assert g.alpha_for_tokens(g.expected_tokens(alpha, gamma), gamma) == pytest.approx(alpha)
  assert g.alpha_for_tokens(0.9, 2) == 0.0 and g.alpha_for_tokens(3.5, 2) is None
  assert g.alpha_for_tokens(3.0, 2) == pytest.approx(1.0)
  with pytest.raises(ValueError, match="NaN"):
    g.alpha_for_tokens(float("nan"), 2)
