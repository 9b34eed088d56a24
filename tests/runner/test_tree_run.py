"""GAMMA='tree' through the run: one gin module switches a run to tree decoding.

Why: the tree scheme (decoding/tree/scheme.py) must be selectable from a config like any other
gamma, beside the chain in one run (same draft, same prompts, same process), and visible in
metrics.json: tokens per target call, the tree it ran, greedy outputs equal to the baseline's.
"""
import json

import pytest

from specdec_jax import run
from specdec_jax.runner import calibrate

pytestmark = pytest.mark.usefixtures("clean_gin")


@pytest.mark.slow  # ~20 s on 2 cores; the scheme's own tests stay in the fast suite
def test_tree_module_runs_beside_the_chain(tmp_path):
  metrics = run.run(["configs/local/smoke.gin", "gin/decoding/tree.gin"], str(tmp_path), [
      "GAMMA = [2, 'tree']", "NUM_EXAMPLES = 4", "MAX_DECODE_LENGTH = 8",
      "RunConfig.repeats = 1", "TreeScheme.tree = (2, 2)"])
  chain, tree = metrics
  assert chain["run"] == "draft=t5_test_draft,gamma=2,temperature=0"
  assert tree["run"] == "draft=t5_test_draft,gamma=tree,temperature=0"
  assert tree["gamma"] == 2 and tree["tree"]["nodes"] == 7 and tree["tree"]["depth"] == 2
  assert tree["greedy_match_rate"] == 1.0 and chain["greedy_match_rate"] == 1.0
  assert tree["speedup_predicted"] is None  # the chain's formula does not apply
  assert tree["alpha"] is not None and tree["tokens_per_target_call"] >= 1.0
  # Per path: drafted counts the depth's 2 drafts per call, not the tree's 6 nodes.
  assert tree["mean_gamma"] <= 2.0
  assert tree["tree"]["node_acceptance_rate"] == pytest.approx(
      tree["acceptance_rate"] * tree["mean_gamma"] / 6)


@pytest.mark.slow  # ~20 s on 2 cores; the scheme's own tests stay in the fast suite
def test_dynamic_tree_module_runs_beside_the_chain(tmp_path):
  """gin/decoding/dynamic_tree.gin switches GAMMA='tree' to the dynamic (EAGLE-2 style) tree:
  its budget is in the record, greedy outputs equal the baseline's."""
  metrics = run.run(["configs/local/smoke.gin", "gin/decoding/dynamic_tree.gin"], str(tmp_path), [
      "GAMMA = [2, 'tree']", "NUM_EXAMPLES = 4", "MAX_DECODE_LENGTH = 8",
      "RunConfig.repeats = 1", "DynamicTreeScheme.depth = 3", "DynamicTreeScheme.width = 2",
      "DynamicTreeScheme.branch = 3", "DynamicTreeScheme.nodes = 8"])
  chain, tree = metrics
  assert tree["run"] == "draft=t5_test_draft,gamma=tree,temperature=0"
  assert tree["tree"]["dynamic"] == {"depth": 3, "width": 2, "branch": 3, "nodes": 8}
  assert tree["tree"]["nodes"] == 8 and tree["tree"]["depth"] == 3 and tree["gamma"] == 3
  assert tree["greedy_match_rate"] == 1.0 and chain["greedy_match_rate"] == 1.0
  assert tree["speedup_predicted"] is None and tree["tokens_per_target_call"] >= 1.0


@pytest.mark.slow  # ~40 s on 2 cores: a calibration tree decode and every candidate's loop timed
def test_auto_weighs_trees_beside_chains(tmp_path):
  """GAMMA='auto' with tree candidates: the probe tree's calibration decode and the tree's loop
  are in the record, and whatever wins (a draft that is the target: every program is worth it
  against a bar of 0.01) decodes exactly."""
  metrics = run.run(["configs/local/smoke.gin", "gin/decoding/auto_tree.gin"], str(tmp_path), [
      "NUM_EXAMPLES = 4", "MAX_DECODE_LENGTH = 8", "RunConfig.repeats = 1",
      "DRAFT_CHECKPOINT = 't5_test_target'", "RunConfig.gamma_max = 2",
      "RunConfig.tree_candidates = [(2, 2)]", "RunConfig.auto_min_speedup = 0.01",
      "RunConfig.auto_calibration_examples = 2", "RunConfig.auto_timing_examples = 2"])
  (row,) = metrics
  assert "tree(2,2)" in row["auto_predicted_speedup"] and row["auto_gate"]["passed"]
  assert row["greedy_match_rate"] == 1.0 and row["speedup_predicted"] is not None
  if row["auto_gate"]["best_gamma"] == "tree(2,2)":
    assert row["tree"]["nodes"] == 7 and row["gamma"] == 2


@pytest.mark.slow  # 20-40 s on 2 cores: a dynamic tree's calibration decode, its loop timed, decode
def test_auto_chooses_a_dynamic_tree_and_decodes_it_exactly(tmp_path, monkeypatch):
  """GAMMA='auto' with a dynamic candidate (gin/decoding/auto_dynamic_tree.gin): its tokens per
  call come from its own calibration decode, its loop is timed, and once chosen the run decodes
  with it, greedy outputs equal to the baseline's, the row saying it was the dynamic tree. Every
  chain is pruned here (as the lone-extend model prunes gammas it predicts below the bar), so the
  tree competes with the bar alone (0.01) and is chosen whatever this machine's timings."""
  monkeypatch.setattr(calibrate, "candidates", lambda *a, **k: ())
  label = "dynamic(depth=2,width=2,branch=2,nodes=5)"
  metrics = run.run(["configs/local/smoke.gin", "gin/decoding/auto_dynamic_tree.gin"],
                    str(tmp_path), [
      "NUM_EXAMPLES = 4", "MAX_DECODE_LENGTH = 8", "RunConfig.repeats = 1",
      "DRAFT_CHECKPOINT = 't5_test_target'", "RunConfig.gamma_max = 2",
      "RunConfig.tree_candidates = [@DynamicTreeScheme()]", "DynamicTreeScheme.depth = 2",
      "DynamicTreeScheme.width = 2", "DynamicTreeScheme.branch = 2",
      "DynamicTreeScheme.nodes = 5", "RunConfig.auto_min_speedup = 0.01",
      "RunConfig.auto_calibration_examples = 2", "RunConfig.auto_timing_examples = 2"])
  (row,) = metrics
  assert label in row["auto_predicted_speedup"] and row["auto_gate"]["best_gamma"] == label
  assert row["tree"]["dynamic"] == {"depth": 2, "width": 2, "branch": 2, "nodes": 5}
  assert row["gamma"] == 2 and row["greedy_match_rate"] == 1.0
  assert row["speedup_predicted"] == row["auto_predicted_speedup"][label]
  state = json.loads((tmp_path / "run_state.json").read_text())
  (memo,) = state["gammas"].values()
  assert memo["dynamic_tree"] == row["tree"]["dynamic"] and memo["tree"] is None
  assert label in dict(memo["tree_curve"]) and memo["tree_expected_from"][label] == "decode"
  (cal,) = [v for k, v in state["calibration"].items() if k.endswith("/tree/" + label)]
  # The prediction's tokens per call are that decode's (a preset draft is the target's shape
  # with other random weights: it may keep nothing, 1 token per call, but every call writes one).
  assert memo["tree_expected_tokens"][label] == cal["tokens_per_call"] >= 1.0
  assert cal["target_calls"] > 0 and cal["dynamic"] == row["tree"]["dynamic"]
