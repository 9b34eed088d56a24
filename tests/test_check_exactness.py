"""`python -m specdec_jax.check_exactness`: passes an exact configuration, flags a wrong one.

Why: the checker is how users trust a new draft, sampler setting or sharding, so it must have
power against real bugs (a sampler setting that reached only the target's path; the correction
sampled from p instead of the residual) while an exact configuration passes. Its statistics are
checked against scipy on synthetic counts, and end to end on the smoke config with tiny
decoder-only models at temperature 0.5 (seeds fixed, so the outcome is deterministic).
"""
import json
import os
import subprocess
import sys

import gin
import numpy as np
import pytest
from scipy import stats

from specdec_jax import check_exactness as ce

SMOKE = ["configs/local/smoke.gin"]
BINDINGS = ["TARGET_CHECKPOINT = 'decoder_test_target'",
            "DRAFT_CHECKPOINT = 'decoder_test_draft'", "TEMPERATURE = 0.5"]
OPTS = ce.CheckOptions(num_samples=10000, num_tokens=1, gamma=2, bootstrap=100)


pytestmark = pytest.mark.usefixtures("clean_gin")


def test_two_sample_statistics():
  rng = np.random.default_rng(0)
  p = rng.dirichlet(np.ones(30))
  q = 0.9 * p + 0.1 * rng.dirichlet(np.ones(30))
  a, b, c = (rng.multinomial(20000, x) for x in (p, p, q))
  stat, dof, pv = ce.two_sample_chi2(a, b)
  want = stats.chi2_contingency(np.stack(ce.pool_rare(a, b)), correction=False)
  assert stat == pytest.approx(want[0], rel=1e-9) and dof == want[2]
  assert pv == pytest.approx(want[1], rel=1e-4) and pv > 1e-3
  assert ce.two_sample_chi2(a, c)[2] < 1e-6
  (lo, hi), null95 = ce.tv_bootstrap(a, c, 200)
  true_tv = 0.5 * np.abs(p - q).sum()
  assert lo <= true_tv <= hi + 0.01 and null95 < true_tv
  uniq, ca, cb = ce.continuation_counts(np.array([[1, 2], [1, -1], [1, 2]]), np.array([[3, 4]]))
  assert uniq.tolist() == [[1, -1], [1, 2], [3, 4]]
  assert ca.tolist() == [1, 2, 0] and cb.tolist() == [0, 0, 1]


def test_exact_configuration_passes(tmp_path):
  r = ce.run_check(SMOKE, BINDINGS, opts=OPTS, output_dir=str(tmp_path))
  assert r["exact"], ce.format_report(r)
  assert r["acceptance_rate"] > 0.0
  assert json.loads((tmp_path / "exactness.json").read_text())["p_value"] == r["p_value"]


def test_top_k_on_the_target_only_is_flagged():
  r = ce.run_check(SMOKE, BINDINGS, opts=ce.CheckOptions(**{**OPTS.__dict__,
                                                            "fault": "target_only_top_k"}))
  assert not r["exact"] and r["p_value"] < 1e-6, ce.format_report(r)
  assert r["tv_ci95"][0] > r["tv_null95"]


@pytest.mark.slow
def test_residual_from_p_is_flagged_and_block_passes():
  r = ce.run_check(SMOKE, BINDINGS, opts=ce.CheckOptions(**{**OPTS.__dict__,
                                                            "fault": "residual_from_p"}))
  assert not r["exact"], ce.format_report(r)
  r = ce.run_check(SMOKE, BINDINGS + ["RunConfig.rule = 'block'"], opts=OPTS)
  assert r["exact"], ce.format_report(r)


@pytest.mark.slow
def test_command_line_exit_status(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  cmd = [sys.executable, "-m", "specdec_jax.check_exactness", "--gin_file=configs/local/smoke.gin",
         "--gin.TARGET_CHECKPOINT=decoder_test_target", "--gin.DRAFT_CHECKPOINT=decoder_test_draft",
         "--gin.TEMPERATURE=0.5", "--num_samples=5000", "--num_tokens=1", "--gamma=2",
         "--bootstrap=50", "--fault=target_only_top_k", f"--output_dir={tmp_path}"]
  out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
  assert out.returncode == 1, out.stderr[-2000:]
  assert "FAIL" in out.stdout
  assert not json.loads((tmp_path / "exactness.json").read_text())["exact"]


def test_tree_run_passes_and_its_sibling_fault_is_flagged():
  """GAMMA='tree' (gin/decoding/tree.gin) checks the tree scheme; --fault=sibling_residual_from_p
  (the next sibling tested against p, not the running residual) must fail it."""
  files = SMOKE + ["gin/decoding/tree.gin"]
  bindings = BINDINGS + ["TreeScheme.tree = (4, 2)"]
  opts = ce.CheckOptions(num_samples=5000, num_tokens=1, bootstrap=100)
  r = ce.run_check(files, bindings, opts=opts)
  assert r["exact"] and r["gamma"] == "tree(13 nodes, depth 2)", ce.format_report(r)
  r = ce.run_check(files, bindings, opts=ce.CheckOptions(**{**opts.__dict__,
                                                             "fault": "sibling_residual_from_p"}))
  assert not r["exact"] and r["p_value"] < 1e-6, ce.format_report(r)
  with pytest.raises(ValueError, match="tree verifier's"):
    ce.run_check(SMOKE, BINDINGS, opts=ce.CheckOptions(**{**OPTS.__dict__,
                                                          "fault": "sibling_residual_from_p"}))


@pytest.mark.slow  # ~30 s on 2 cores
def test_dynamic_tree_run_passes_and_its_sibling_fault_is_flagged():
  """GAMMA='tree' with gin/decoding/dynamic_tree.gin checks the dynamic tree scheme (a budget
  that prunes); --fault=sibling_residual_from_p on its per-row walk must fail it."""
  files = SMOKE + ["gin/decoding/dynamic_tree.gin"]
  bindings = BINDINGS + ["DynamicTreeScheme.depth = 2", "DynamicTreeScheme.width = 2",
                         "DynamicTreeScheme.branch = 4", "DynamicTreeScheme.nodes = 8"]
  opts = ce.CheckOptions(num_samples=5000, num_tokens=1, bootstrap=100)
  r = ce.run_check(files, bindings, opts=opts)
  assert r["exact"] and r["gamma"] == "tree(8 nodes, depth 2)", ce.format_report(r)
  r = ce.run_check(files, bindings, opts=ce.CheckOptions(**{**opts.__dict__,
                                                             "fault": "sibling_residual_from_p"}))
  assert not r["exact"] and r["p_value"] < 1e-6, ce.format_report(r)
