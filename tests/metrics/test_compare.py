"""Two points of one run compared from its batches.jsonl (specdec_jax/metrics/compare.py)."""
import pytest

from specdec_jax.metrics import compare, results


def _line(i, a, b):
  """One batch line: point 'tree' and point 'chain' with (emitted, calls, seconds)."""
  def point(e, n, s):
    return {"seconds": s, "emitted": e, "counters": {"emitted": e, "target_calls": n}}
  return {"group": "t", "indices": [i], "points": {"tree": point(*a), "chain": point(*b)}}


BATCHES = [_line(0, (30, 10, 0.3), (30, 15, 0.2)), _line(1, (20, 5, 0.2), (20, 8, 0.1)),
           _line(2, (10, 5, 0.1), (10, 5, 0.05))]


def test_ratios_are_the_ratios_of_sums():
  out = compare.paired(BATCHES, "tree", "chain")
  assert compare.point_keys(BATCHES) == ["tree", "chain"]
  assert out["tokens_per_call"] == [60 / 20, 60 / 28]
  assert out["tokens_per_call_ratio"] == pytest.approx((60 / 20) / (60 / 28))
  assert out["time_per_token_ratio"] == pytest.approx((0.35 / 60) / (0.6 / 60))  # tree slower
  lo, hi = out["tokens_per_call_ratio_interval95"]
  assert lo <= out["tokens_per_call_ratio"] <= hi
  table = results.TABLES["comparison"]([{"name": "x", "metrics": out, "load_average": [1.0],
                                        "commit": "abcdef0"}])
  assert "1.40x" in table and "0.58x" in table


def test_points_without_shared_batches_are_refused():
  with pytest.raises(ValueError, match="share 0 batches"):
    compare.paired(BATCHES, "tree", "nothing")
