"""Acceptance statistics from counter totals (specdec_jax/metrics/acceptance_stats.py).

Why: alpha, the acceptance rate and the per-position rates are the numbers the paper tables
compare against; they are sums of per-batch totals, so merging must be exact.
"""
import numpy as np
import pytest

from specdec_jax.decoding.state import Counters
from specdec_jax.metrics import acceptance_stats


def _record(drafted, accepted, emitted, calls, beta_sum, beta_count, per_pos, hist):
  return dict(drafted=drafted, accepted=accepted, emitted=emitted, target_calls=calls,
              beta_sum=beta_sum, beta_count=beta_count, iterations=calls,
              accepts_per_position=per_pos, accepted_length_hist=hist)


def test_merge_and_summarize():
  a = _record(6, 3, 5, 2, 2.5, 4, [2, 1, 0], [0, 1, 1, 0])
  b = _record(3, 3, 4, 1, 3.0, 3, [1, 1, 1], [0, 0, 0, 1])
  s = acceptance_stats.summarize(acceptance_stats.merge([a, b]))
  assert s["alpha"] == pytest.approx(5.5 / 7)
  assert s["acceptance_rate"] == pytest.approx(6 / 9)
  assert s["tokens_per_target_call"] == pytest.approx(9 / 3)
  assert s["accepts_per_position"] == pytest.approx([1.0, 2 / 3, 1 / 3])
  assert s["accepted_length_hist"] == [0, 1, 1, 1]


def test_empty_totals_give_none():
  s = acceptance_stats.summarize(acceptance_stats.merge([]))
  assert s["alpha"] is None and s["acceptance_rate"] is None


def test_counters_to_dict_counts_real_rows_only():
  c = Counters.zeros(3, 2).replace(
      drafted_B=np.array([4, 4, 4]), accepted_B=np.array([1, 2, 3]),
      emitted_B=np.array([3, 4, 5]), target_calls_B=np.array([2, 2, 2]),
      beta_sum_B=np.array([0.5, 1.0, 9.0], np.float32), beta_count_B=np.array([2, 2, 2]),
      iterations=np.array(2),
      accepts_per_position_BxG=np.array([[1, 0], [2, 1], [7, 7]]),
      accepted_length_hist_BxG1=np.array([[1, 1, 0], [0, 1, 1], [5, 5, 5]]))
  d = acceptance_stats.counters_to_dict(c, rows=2)
  assert (d["drafted"], d["accepted"], d["emitted"], d["beta_count"]) == (8, 3, 7, 4)
  assert d["beta_sum"] == pytest.approx(1.5)
  # The third row (padding of a short last batch on a mesh) enters no counter, vectors included.
  assert d["accepts_per_position"] == [3, 1] and d["accepted_length_hist"] == [1, 2, 1]
  assert acceptance_stats.alpha_of(c, rows=2) == pytest.approx(1.5 / 4)
