"""experiments/loop_anatomy.py: the free draft is the same draft minus its weights; the script runs.

Why the free draft is tested: the script's 'draft' and 'glue' figures are differences between
the loop with the model draft and with the free one, so the free draft must build the same
loop (same type and fields, the cache index moved as a real call moves it) while reading
nothing.
"""
import importlib.util
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from specdec_jax.checkpoints import loader
from specdec_jax.paths import PACKAGE_PARENT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script():
  spec = importlib.util.spec_from_file_location(
      "loop_anatomy", os.path.join(ROOT, "experiments", "loop_anatomy.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_free_draft_reads_no_weights_and_moves_the_index():
  draft, params = loader.load_model("t5_test_draft")
  free = _script().free_draft(draft)
  assert isinstance(free, type(draft)) and free.config == draft.config
  inputs = jnp.asarray([[5, 6, 7, 1], [8, 9, 1, 0]], jnp.int32)
  target, tparams = loader.load_model("t5_test_target")
  encoded = target.encode(tparams, inputs) if draft.shares_encoder else None
  cache = draft.prefill(params, inputs, 8, encoded=encoded)
  tokens = jnp.asarray([[3, 4], [5, 6]], jnp.int32)
  zeros = jax.tree.map(jnp.zeros_like, params)  # no weights: the same logits
  logits, after = free.extend(zeros, cache, tokens)
  again, _ = free.extend(params, cache, tokens)
  assert jnp.array_equal(logits, again)
  assert jnp.array_equal(after.index_B, cache.index_B + 2)
  hot = (tokens * 7 + cache.index_B[:, None] + 3) % draft.vocab_size
  assert jnp.array_equal(jnp.argmax(logits, axis=-1), hot)
  _, real = draft.extend(params, cache, tokens)
  assert jnp.array_equal(after.index_B, real.index_B)


def test_trees_flag_parses_branchings_and_refuses_bad_ones():
  mod = _script()
  assert mod.parse_trees("2;2,1") == [(2,), (2, 1)] and mod.parse_trees("") == []
  for bad in ("2;x", "0,1", "2;-1"):
    with pytest.raises(mod.app.UsageError, match="--trees"):
      mod.parse_trees(bad)


@pytest.mark.slow
def test_loop_anatomy_runs_on_the_smoke_config(tmp_path):
  out = tmp_path / "anatomy.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", "")
  proc = subprocess.run(
      [sys.executable, "experiments/loop_anatomy.py", "--gin_file=configs/local/smoke.gin",
       "--gammas=1,2", "--trees=2;2,1", "--general_path", "--num_prompts=4", "--repeats=1",
       "--goal=1.7", f"--output={out}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  res = json.loads(out.read_text())
  assert set(res["rows"]) == {"gamma1", "gamma2", "tree(2,)", "tree(2, 1)"}
  assert res["prompts"] == 4
  for name in ("gamma1", "gamma2"):
    row = res["rows"][name]
    assert row["iteration_ms"] > 0 and row["iteration_ms_free_draft"] > 0
    assert 1.0 <= row["tokens_per_target_call"] <= row["gamma"] + 1
    assert row["fixed_ms"] > 0 and row["speedup_end_to_end_with_free_draft"] > 0
    # The goal's tokens per call, put back into the formula, give the goal.
    need = row["free_draft_tokens_per_call_for_goal"]
    from specdec_jax.metrics import theory
    if need != float("inf"):
      assert theory.loop_speedup(
          need, res["autoregressive_iteration_ms"], row["iteration_ms_free_draft"],
          tokens=res["tokens_per_request"], ar_fixed=res["autoregressive_fixed_ms"],
          spec_fixed=row["fixed_ms_free_draft"]) == pytest.approx(1.7)
    assert row["goal_reachable_with_free_draft"] == (need <= row["gamma"] + 1)
    if row["alpha_for_goal"] is not None:
      assert theory.expected_tokens(row["alpha_for_goal"], row["gamma"]) == pytest.approx(
          row["tokens_per_call_for_goal"])
  for row in res["rows"].values():
    assert row["iteration_ms_general_path"] > 0
  again = subprocess.run(
      [sys.executable, "experiments/loop_anatomy.py", "--gin_file=configs/local/smoke.gin",
       f"--output={out}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
      check=False)
  assert again.returncode != 0 and "--output must name a new file" in again.stderr
