"""GAMMA='auto' picking a chain or a static tree from fabricated costs (runner/tree_choice.py).

Why: a tree's extra nodes pay only where its timed loop is cheap enough for the tokens it adds,
so the choice must follow the measured costs (as the chains' does, test_calibrate_loops.py), and
a tree's tokens per call must come from the calibration tree decode's acceptance by depth and
rank (the positional model), not from the chain profile. Pure Python apart from building trees.
"""
import pytest

from specdec_jax import timing
from specdec_jax.decoding.tree.scheme import TreeScheme
from specdec_jax.decoding.tree.shape import Tree
from specdec_jax.metrics import theory
from specdec_jax.runner import calibrate, costs, tree_choice
from specdec_jax.runner.tree_choice import positional_tree
from specdec_jax.runner.run_config import DraftSpec, Point, RunConfig
from specdec_jax.testing import MemoryStore

SPEC = DraftSpec("model", "some/draft")
COSTS = timing.Costs(target_ms=4.0, draft_ms=0.4, c=0.1, v={1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15})
TREES = (TreeScheme((3, 2, 1)), TreeScheme((2, 2)))
# a[d][r]: depth 1 keeps rank 0 at 0.6, rank 1 at 0.4 after it, rank 2 at 0.3; deeper alike.
ACCEPT = [[0.6, 0.4, 0.3], [0.6, 0.4, 0.3], [0.6, 0.4, 0.3]]


def _loop(iteration_ms):
  return costs.LoopCosts(ar_ms=4.0, ar_fixed_ms=0.0, tokens=40.0, iteration_ms=iteration_ms,
                         fixed_ms={g: 0.0 for g in iteration_ms},
                         tokens_per_iteration={g: 1.0 for g in iteration_ms}, batches=1, rows=1)


def _plan(store, trees=TREES):
  acc = {"alpha": 0.6, "accept_at_least": [0.6, 0.36, 0.216, 0.13]}
  return calibrate.plan_auto(Point(SPEC, "auto", 0.0), COSTS, store, lambda: acc, gamma_max=4,
                             min_speedup=1.0, rule="tokenwise", trees=trees,
                             tree_acceptance_fn=lambda: {"rank_acceptance": ACCEPT})


def test_expected_tokens_of_a_tree_by_hand_and_of_a_chain():
  # (2, 1): two depth-1 nodes (ranks 0, 1), one child each. s(0) = 0.6, s(1) = 0.4 x 0.4 = 0.16.
  e = theory.tree_expected_tokens(Tree.from_branching((2, 1)).parents, ACCEPT)
  assert e == pytest.approx(1 + 0.6 + 0.16 + 0.6 * 0.6 + 0.16 * 0.6)
  # A chain at one rate is Leviathan's (1 - a^(G+1)) / (1 - a).
  assert theory.tree_expected_tokens(Tree.chain(5).parents, [0.7]) == pytest.approx(
      theory.expected_tokens(0.7, 5))


def test_rank_rates_from_tree_counters():
  # 100 calls reached depth 1: 60 kept rank 0, 16 of the 40 left kept rank 1; branching 2 there,
  # so rank 2 (never tried) takes rank 1's rate. Depth 2 was never reached: depth 1's rates.
  rows = theory.rank_acceptance([[60, 16, 0], [0, 0, 0]], [100, 0], branching=(2, 1))
  assert rows[0] == pytest.approx([0.6, 0.4, 0.4]) and rows[1] == pytest.approx(rows[0])
  assert theory.rank_acceptance([[0, 0]], [0]) is None


def test_the_positional_tree_is_the_best_of_its_size():
  # Greedy best-first: where a rejected rank 0 leaves likely siblings (s = 0.4, 0.3, 0.27 against
  # 0.16 for a grandchild), the 4-node tree is bushy; where siblings are rarely kept, a chain.
  assert positional_tree(4, [0.4, 0.5, 0.9]).parents == (-1, 0, 0, 0)
  assert positional_tree(4, [0.9, 0.05]).parents == (-1, 0, 1, 2)
  t = positional_tree(16, [0.7, 0.4, 0.2], max_depth=3)
  assert t.num_nodes == 16 and t.max_depth <= 3
  for other in (Tree.from_branching((3, 2, 1)), Tree.from_branching((5, 2))):
    assert (theory.tree_expected_tokens(t.parents, [0.7, 0.4, 0.2])
            >= theory.tree_expected_tokens(other.parents, [0.7, 0.4, 0.2]))


def test_probe_tries_every_rank_a_candidate_uses():
  assert tree_choice.probe(TREES).tree == Tree.from_branching((3, 2, 1))
  assert tree_choice.probe((TreeScheme((1, 3)), TreeScheme((2,)))).tree == Tree.from_branching(
      (2, 3))
  assert costs.loop_key(TREES[0]) == "tree(3,2,1)" and costs.loop_key(3) == 3
  assert costs.loop_key(TreeScheme(Tree((-1, 0, 0, 1)))) == "tree(4 nodes, depth 2)"


def test_a_cheap_tree_loop_is_chosen_over_the_chains():
  store = MemoryStore()
  plan = _plan(store)
  assert calibrate.loop_gammas(plan.point, plan) == plan.candidates + TREES
  e = theory.tree_expected_tokens(TREES[0].tree.parents, ACCEPT)
  # Chains: 1.6 x 4 / 5 = 1.28, 1.96 x 4 / 6 = 1.31, 2.18 x 4 / 7 = 1.24; the (3, 2, 1) tree
  # keeps 2.84 tokens per call (by hand: 1 + 0.832 + 0.632 + 0.379) for 7 ms: 1.62.
  loop = _loop({1: 5.0, 2: 6.0, 3: 7.0, 4: 8.0, "tree(3,2,1)": 7.0, "tree(2,2)": 6.5})
  memo = calibrate.choose(plan, COSTS, loop, store, min_speedup=1.0, rule="tokenwise")
  assert memo["tree_label"] == "tree(3,2,1)" and memo["gamma"] == 3
  assert e == pytest.approx(2.8435, abs=1e-3)
  assert dict(memo["tree_curve"])["tree(3,2,1)"] == pytest.approx(e * 4.0 / 7.0)
  point = calibrate.resolved(plan.point, memo=memo, loop=loop, tree=TreeScheme((3, 2, 1)),
                             trees=TREES)
  assert point.tree == TREES[0] and point.auto and point.gamma == 3
  # A resumed run recalls the tree and times only its loop.
  again = _plan(store)
  assert again.memo == memo and calibrate.loop_gammas(again.point, again) == (TREES[0],)


def test_costly_tree_loops_leave_the_chain():
  store = MemoryStore()
  plan = _plan(store)
  loop = _loop({1: 5.0, 2: 6.0, 3: 7.0, 4: 8.0, "tree(3,2,1)": 14.0, "tree(2,2)": 12.0})
  memo = calibrate.choose(plan, COSTS, loop, store, min_speedup=1.0, rule="tokenwise")
  assert memo["tree"] is None and memo["gamma"] == 2
  assert calibrate.resolved(plan.point, memo=memo, loop=loop, tree=TreeScheme((3, 2, 1)),
                            trees=TREES).tree is None
  # Without timed loops (a mesh) no tree is chosen: nothing measured says what it costs.
  assert calibrate.choose(_plan(MemoryStore()), COSTS, None, MemoryStore(), min_speedup=1.0,
                          rule="tokenwise")["tree"] is None


def test_tree_candidates_from_the_config():
  cfg = RunConfig(gamma="auto", tree_candidates=[(3, 2, 1), Tree.from_branching((2, 2)),
                                                  (3, 2, 1)])
  schemes = cfg.tree_candidate_schemes()
  assert [s.tree for s in schemes] == [Tree.from_branching((3, 2, 1)), Tree.from_branching((2, 2))]
  assert all(s.verifier == "auto" for s in schemes)
  assert "tree_candidates" in cfg.fingerprint()
