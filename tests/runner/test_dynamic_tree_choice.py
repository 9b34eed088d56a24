"""GAMMA='auto' weighing a dynamic (EAGLE-2 style) tree beside chains and static trees, from
fabricated costs and a fabricated measured tokens-per-call (runner/tree_choice.py).

Why: a dynamic tree has no parent list, so its tokens per call must come from its own calibration
decode (not the positional model), it must win exactly where that measurement and its timed loop
beat every chain and static tree, and a resumed run must rebuild the very scheme from the memo.
Pure Python apart from building schemes: no compile.
"""
import dataclasses
import json

import pytest

from specdec_jax import timing
from specdec_jax.decoding.tree.dynamic import DynamicTreeScheme
from specdec_jax.decoding.tree.scheme import TreeScheme
from specdec_jax.decoding.tree.shape import Tree
from specdec_jax.runner import calibrate, costs, tree_choice
from specdec_jax.runner.run_config import DraftSpec, Point, RunConfig
from specdec_jax.testing import MemoryStore

SPEC = DraftSpec("model", "some/draft")
COSTS = timing.Costs(target_ms=4.0, draft_ms=0.4, c=0.1, v={1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15})
STATIC = TreeScheme((3, 2, 1))
DYN = DynamicTreeScheme(depth=3, width=2, branch=2, nodes=6)
LABEL = "dynamic(depth=3,width=2,branch=2,nodes=6)"
ACCEPT = [[0.6, 0.4, 0.3], [0.6, 0.4, 0.3], [0.6, 0.4, 0.3]]


def _loop(iteration_ms):
  return costs.LoopCosts(ar_ms=4.0, ar_fixed_ms=0.0, tokens=40.0, iteration_ms=iteration_ms,
                         fixed_ms={g: 0.0 for g in iteration_ms},
                         tokens_per_iteration={g: 1.0 for g in iteration_ms}, batches=1, rows=1)


def _plan(store, trees, measured):
  acc = {"alpha": 0.6, "accept_at_least": [0.6, 0.36, 0.216, 0.13]}
  static = any(not tree_choice.is_dynamic(t) for t in trees)
  return calibrate.plan_auto(
      Point(SPEC, "auto", 0.0), COSTS, store, lambda: acc, gamma_max=4, min_speedup=1.0,
      rule="tokenwise", trees=trees, tree_acceptance_fn=lambda: {
          "rank_acceptance": ACCEPT if static else None, "dynamic_tokens": {LABEL: measured}})


def _choose(trees, measured, dyn_ms, store=None):
  store = store if store is not None else MemoryStore()
  plan = _plan(store, trees, measured)
  # Chains predict 1.28, 1.31, 1.24, 1.16; the (3, 2, 1) tree 2.84 x 4 / 7 = 1.62.
  loop = _loop({1: 5.0, 2: 6.0, 3: 7.0, 4: 8.0, "tree(3,2,1)": 7.0, LABEL: dyn_ms})
  return plan, loop, calibrate.choose(plan, COSTS, loop, store, min_speedup=1.0, rule="tokenwise")


def test_the_dynamic_tree_wins_on_its_measured_tokens_and_timed_loop():
  assert costs.loop_key(DYN) == LABEL
  plan, loop, memo = _choose((STATIC, DYN), measured=3.5, dyn_ms=7.0)  # 3.5 x 4 / 7 = 2.0
  assert plan.dynamic_tokens == {LABEL: 3.5}
  assert calibrate.loop_gammas(plan.point, plan) == plan.candidates + (STATIC, DYN)
  assert memo["tree_label"] == LABEL and memo["gamma"] == 3 and memo["tree"] is None
  assert memo["dynamic_tree"] == {"depth": 3, "width": 2, "branch": 2, "nodes": 6}
  assert memo["tree_expected_tokens"][LABEL] == 3.5  # measured, not the positional model
  assert memo["tree_expected_from"] == {"tree(3,2,1)": "positional", LABEL: "decode"}
  assert dict(memo["tree_curve"])[LABEL] == pytest.approx(2.0)
  point = calibrate.resolved(plan.point, memo=memo, loop=loop, tree=STATIC, trees=(STATIC, DYN))
  assert point.tree is DYN and point.auto and point.gamma == 3
  assert LABEL in dict(point.tree_curve)


def test_the_dynamic_tree_loses_where_its_tokens_or_its_loop_do_not_pay():
  # Its loop too slow for its tokens (3.5 x 4 / 10 = 1.4 < the static tree's 1.62).
  _, _, memo = _choose((STATIC, DYN), measured=3.5, dyn_ms=10.0)
  assert memo["tree_label"] == "tree(3,2,1)" and "dynamic_tree" not in memo
  assert memo["tree"] == list(STATIC.tree.parents)
  # Alone beside the chains, too few measured tokens (2.0 x 4 / 7 = 1.14 < gamma 2's 1.31).
  plan, loop, memo = _choose((DYN,), measured=2.0, dyn_ms=7.0)
  assert memo["gamma"] == 2 and memo["tree"] is None and "dynamic_tree" not in memo
  assert "rank_acceptance" in memo and memo["rank_acceptance"] is None  # no probe: no static one
  assert calibrate.resolved(plan.point, memo=memo, loop=loop, trees=(DYN,)).tree is None
  # The same tree with enough tokens wins alone: the measurement, not its shape, decides.
  assert _choose((DYN,), measured=3.0, dyn_ms=7.0)[2]["tree_label"] == LABEL


def test_a_recalled_memo_rebuilds_the_same_dynamic_tree():
  store = MemoryStore()
  _, _, memo = _choose((STATIC, DYN), measured=3.5, dyn_ms=7.0, store=store)
  again = _plan(store, (STATIC, DYN), measured=0.0)  # a resumed run: no decode, no new choice
  assert again.memo == memo and calibrate.loop_gammas(again.point, again) == (DYN,)
  stored = json.loads(json.dumps(memo))  # as run_state.json gives it back
  assert tree_choice.chosen(stored, (STATIC, DYN)) is DYN
  # Not among the run's candidates: rebuilt from its budget with the run's verifier.
  rebuilt = tree_choice.chosen(stored, (), TreeScheme((2, 2), verifier="greedy"))
  assert rebuilt == dataclasses.replace(DYN, verifier="greedy")
  assert tree_choice.chosen(stored, ()) == DYN  # 'auto' by default, as DYN's
  assert tree_choice.chosen({"tree": None, "gamma": 2}, (STATIC, DYN)) is None


def test_calibration_decodes_probe_the_static_trees_and_decode_each_dynamic_one():
  calls = []

  def decode(suffix, scheme, fn):
    calls.append((suffix, scheme, fn))
    if fn is tree_choice.dynamic_acceptance:
      return {"tokens_per_call": 2.5}
    return {"rank_acceptance": ACCEPT}

  out = tree_choice.calibration_decodes((STATIC, DYN, TreeScheme((2, 2))), decode)
  assert out == {"rank_acceptance": ACCEPT, "dynamic_tokens": {LABEL: 2.5}}
  assert calls == [("tree", TreeScheme((3, 2, 1)), tree_choice.tree_acceptance),
                   ("tree/" + LABEL, DYN, tree_choice.dynamic_acceptance)]
  calls.clear()
  assert tree_choice.calibration_decodes((DYN,), decode) == {
      "rank_acceptance": None, "dynamic_tokens": {LABEL: 2.5}}
  assert [c[0] for c in calls] == ["tree/" + LABEL]  # no probe without a static tree
  with pytest.raises(ValueError, match="static"):
    tree_choice.probe((STATIC, DYN))


def test_dynamic_candidates_from_the_config_and_a_clear_error_otherwise():
  cfg = RunConfig(gamma="auto", tree_candidates=[(3, 2, 1), DYN, Tree.from_branching((2, 2)), DYN])
  assert cfg.tree_candidate_schemes() == (STATIC, DYN, TreeScheme((2, 2)))
  with pytest.raises(TypeError, match="'dynamic'.*DynamicTreeScheme"):
    RunConfig(gamma="auto", tree_candidates=[(3, 2, 1), "dynamic"]).tree_candidate_schemes()
