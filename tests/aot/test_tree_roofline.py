"""Draft trees on the TPU roofline (specdec_jax/aot/tree_roofline.py) and their compiled records.

Why: the trees table puts a tree's predicted speedup beside the chain's for Leviathan's Table-2
rows, so a tree one node wide must reproduce the chain's prediction exactly (same byte basis,
same draft calls, same expected length), v(N) must be the chain's verify on the tree's cache, and
the rank decay the table states must be the one measured (docs/results). The compile test and
the committed record say the T5-XXL tree programs fit a v4-8 with nothing sent to the host.
Pure Python but the slow compile test (libtpu).
"""
import json
import os

import pytest

from specdec_jax.aot import roofline as R
from specdec_jax.aot import topologies, tree_roofline as TR
from specdec_jax.decoding.tree.shape import Tree
from specdec_jax.metrics import theory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _record(name):
  with open(os.path.join(ROOT, "docs", "results", f"{name}.json"), encoding="utf-8") as f:
    return json.load(f)


def _layout(name="roofline_tpu_v4_one_chip"):
  rec = _record(name)
  return R.layout_of_record(rec), TR.layout_gamma(rec["metrics"]["aot"])


def test_a_tree_one_node_wide_is_the_chain():
  layout, gamma = _layout()
  assert gamma == 7  # the roofline steps' caches hold gamma 7's slack
  for row in layout.table2():
    chain = Tree.chain(row["gamma"]).parents
    c, v = TR.c_tree(layout, gamma, row["draft"], chain), TR.v_tree(layout, gamma, row["gamma"] + 1)
    assert c == pytest.approx(row["gamma"] * layout.c(row["draft"]), rel=1e-3)
    e = theory.tree_expected_tokens(chain, TR.accept_by_rank(row["alpha"], 0))
    assert theory.loop_speedup(e, 1.0, c + v) == pytest.approx(row["predicted"], rel=1e-3)
  assert TR.v_tree(layout, gamma, 8) == layout.v(8)  # gamma 7's own cache


def test_v_of_nodes_is_flat_and_trees_keep_more_tokens():
  layout, gamma = _layout("roofline_tpu_v4_mesh")
  vs = [TR.v_tree(layout, gamma, n) for n in (2, 8, 16, 32, 64)]
  assert all(1.0 <= a <= b for a, b in zip(vs, vs[1:])) and vs[-1] < 1.03
  for r in TR.tree_rows(layout, gamma):
    es = [t["expected_tokens"] for t in r["trees"]]
    assert r["chain_expected_tokens"] <= es[0] <= es[1] <= es[2]  # more nodes, more kept
    assert all(t["depth"] <= r["gamma"] for t in r["trees"])
    assert r["accept_by_rank"][0] == r["alpha"]


def test_tree_draft_calls_feed_each_level():
  tree = Tree.from_branching((3, 2, 1)).parents
  assert TR.level_widths(tree) == [1, 3, 6]
  layout, gamma = _layout()
  one = TR.c_tree(layout, gamma, "t5_1_1_small", tree)
  assert 3 * layout.c("t5_1_1_small") < one < 4 * layout.c("t5_1_1_small")


def test_the_rank_decay_is_the_measured_one():
  rec = _record("tree_rank_acceptance_ende")["metrics"]
  rows = {r["temperature"]: r for r in rec["rows"]}
  for t, ratios in TR.RANK_RATIOS.items():
    a = rows[float(t)]["rank_acceptance"][0]
    assert ratios == pytest.approx([x / a[0] for x in a], abs=0.005)
  # In sample, the positional model with the measured a[d][r] is within 3 % of the tokens per
  # call that decode wrote (3.22 against 3.17 at T = 0, 2.67 against 2.62 at T = 1).
  parents = Tree.from_branching(tuple(rec["tree"])).parents
  for r in rec["rows"]:
    assert theory.tree_expected_tokens(parents, r["rank_acceptance"]) == pytest.approx(
        r["tokens_per_target_call"], rel=0.03)


@pytest.mark.parametrize("name, chips", [("aot_trees_tpu_v4_mesh", (1, 2, 2)),
                                         ("aot_trees_tpu_v4_one_chip", (1, 1, 1))])
def test_the_compiled_trees_fit_a_v4_8_without_host_transfers(name, chips):
  recs = [r for r in _record(name)["metrics"]["aot"] if "tree_nodes" in r]
  loops = {r["tree_nodes"]: r for r in recs if r["kind"] == "spec_loop"}
  assert sorted(loops) == list(TR.TREE_NODES)
  for r in recs:
    assert r["fits"] is True and r["host_transfers_in_loop"] == 0
    assert r["topology"] == "v4-8" and tuple(
        r["mesh"][k] for k in ("data", "model_outer", "model_inner")) == chips
    assert 0 < r["per_chip_bytes"]["total"] < r["hbm_bytes_per_chip"]
  for n, r in loops.items():  # the trees the table predicts with, at the row's alpha
    assert tuple(r["tree_parents"]) == TR.tree_for(n, 0.75, 0, 7)
  assert "| spec_loop[" in TR.compiled_trees_table([_record(name)])


def test_the_builder_compiles_every_tree_a_run_may_use():
  from specdec_jax.aot import programs
  from specdec_jax.decoding.tree.scheme import TreeScheme
  from specdec_jax.runner.run_config import RunConfig
  cfg = RunConfig(gamma=[3, "tree"], tree=TreeScheme((2, 2)))
  assert programs.gammas_to_compile(cfg.gamma, cfg.gamma_max) == 3  # 'tree' is no int
  assert programs.trees_to_compile(cfg) == (TreeScheme((2, 2)),)
  cfg = RunConfig(gamma="auto", gamma_max=5, tree_candidates=[(3, 2, 1), (2, 2)])
  assert programs.gammas_to_compile(cfg.gamma, cfg.gamma_max) == 5
  assert [s.tree.num_nodes for s in programs.trees_to_compile(cfg)] == [16, 7]
  assert programs.trees_to_compile(RunConfig(gamma=4, tree_candidates=[(2, 2)])) == ()


@pytest.mark.slow  # ~25 s: a tree's prefill and loop compiled by the TPU compiler
@pytest.mark.skipif(not topologies.libtpu_available(), reason="libtpu is not installed")
def test_a_tree_loop_compiles_for_a_v4_8(tmp_path):
  from specdec_jax.aot import cli
  lines = []
  status = cli.run(["configs/local/smoke.gin"], str(tmp_path), "v4:2x2x1", only=["spec_loop"],
                   gin_bindings=["RunConfig.mesh = @MeshConfig()", "MeshConfig.data = 2",
                                 "MeshConfig.model_outer = 1", "MeshConfig.model_inner = 2",
                                 "GAMMA = 'tree'", "RunConfig.tree = @TreeScheme()",
                                 "TreeScheme.tree = (2, 2)"], log=lines.append)
  assert status == 0, "\n".join(lines)
  recs = json.loads((tmp_path / "aot.json").read_text())
  assert [r["kind"] for r in recs] == ["spec_prefill", "spec_loop"]
  assert all(r["tree_nodes"] == 7 and r["host_transfers_in_loop"] == 0 for r in recs)
