"""experiments/tree_bound.py: the tree-over-chain bound from committed records.

Why: the bound is what a note cites to say no tree shape can reach a goal on a machine, so its
pieces must hold what its docstring says: a tree of as many drafted nodes as its depth keeps no
fewer tokens than the chain it contains (scored like the best chain), its time floor is that
chain's measured iteration, the verify floor never falls with width, and bad input is refused.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "experiments", "tree_bound.py")


def _script():
  spec = importlib.util.spec_from_file_location("tree_bound", SCRIPT)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_verify_floor_is_monotone_and_never_above_the_curve():
  floor = _script().verify_floor
  curve = {1: 1.0, 2: 1.1, 3: 1.05, 4: 1.3}  # a noisy dip at 3
  got = [floor(curve, t) for t in range(1, 7)]
  assert got == [1.0, 1.05, 1.05, 1.3, 1.3, 1.3]
  assert all(got[t - 1] <= curve[t] for t in curve)


def test_rows_hold_the_chain_they_contain():
  mod = _script()
  loop = {"ar_ms": 1.0, "iteration_ms": {"1": 1.5, "2": 2.0},
          "tokens_per_iteration": {"1": 1.6, "2": 1.9}}
  accept = [[0.6, 0.3], [0.6, 0.3]]
  rows = mod.bound_rows(accept, loop, {1: 1.0, 2: 1.0, 3: 1.1, 4: 1.5}, 4, measured=(2, 2))
  by = {(r["depth"], r["drafted_nodes"]): r for r in rows}
  assert by[(1, 1)]["iteration_floor_ms"] == 1.5 and by[(2, 2)]["iteration_floor_ms"] == 2.0
  # 3 drafted nodes at depth 1 verify 4 tokens: (v(4) - v(2)) x ar_ms more than gamma 1's loop.
  assert by[(1, 3)]["iteration_floor_ms"] == pytest.approx(1.5 + 0.5)
  best_chain = max(1.6 / 1.5, 1.9 / 2.0)
  for r in rows:
    assert r["speed_over_best_chain"] == pytest.approx(
        r["tokens_bound"] / r["iteration_floor_ms"] / best_chain)
    assert r["flat_verify"] >= r["speed_over_best_chain"] - 1e-12
  assert by[(2, 2)]["tokens_bound"] == pytest.approx(1 + 0.6 + 0.36)
  # A tree that contains a chain keeps at least that chain's tokens as the chains are scored.
  chains = mod.chain_tokens(accept, loop)
  for d in (1, 2):
    assert by[(d, d)]["tokens_bound"] >= chains[d] - 1e-12


def test_chains_are_scored_low_from_either_source():
  mod = _script()
  # gamma 1's decode wrote 1.70 where the rates give 1.60: the lower counts; gamma 2's wrote 1.90
  # where they give 1.96: the decode counts. A tree label among the loop's keys is skipped.
  loop = {"ar_ms": 1.0, "iteration_ms": {"1": 1.5, "2": 2.0, "tree(2,)": 1.7},
          "tokens_per_iteration": {"1": 1.7, "2": 1.9, "tree(2,)": 1.8}}
  accept = [[0.6, 0.3], [0.6, 0.3]]
  assert mod.chain_tokens(accept, loop) == pytest.approx({1: 1.6, 2: 1.9})
  rows = mod.bound_rows(accept, loop, {1: 1.0, 2: 1.0, 3: 1.0}, 2, measured=(2, 2))
  assert {(r["depth"], r["drafted_nodes"]) for r in rows} == {(1, 1), (1, 2), (2, 2)}
  one = next(r for r in rows if (r["depth"], r["drafted_nodes"]) == (1, 1))
  assert one["speed_over_best_chain"] == pytest.approx(
      (1.6 / 1.5) / max(1.6 / 1.5, 1.9 / 2.0))  # the gamma-1 chain as a tree: itself


def test_the_script_runs_on_committed_records_and_refuses_a_wrong_temperature(tmp_path):
  run = lambda *a: subprocess.run([sys.executable, SCRIPT, *a], capture_output=True, text=True,
                                  cwd=tmp_path)
  ok = run("--chain_record=main_ende_t0_after_int8", "--temperature=0", "--max_nodes=4")
  assert ok.returncode == 0, ok.stderr
  assert "best: depth" in ok.stdout
  bad = run("--chain_record=main_ende_t0_after_int8", "--temperature=1")
  assert bad.returncode != 0 and "decoded at T = 0" in bad.stderr
  other = run("--chain_record=int8_ende_t0_feature_auto", "--temperature=0")
  assert other.returncode != 0 and "t5_feature_draft" in other.stderr  # another draft's rates
  missing = run("--chain_record=no_such_record")
  assert missing.returncode != 0 and "no results record" in missing.stderr
