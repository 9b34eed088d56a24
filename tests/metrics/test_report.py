"""metrics.json objects and the printed table (specdec_jax/metrics/report.py).

Why: metrics.json is a public contract; every key must be present in every mode (None where a
mode measures nothing), and speedup / predicted speedup must be the documented ratios.
"""
import dataclasses

import pytest

from specdec_jax.metrics.theory import predicted_speedup
from specdec_jax.timing import Costs
from specdec_jax.metrics import report
from specdec_jax.metrics.records import BatchRecord, ProgramRecord


def _spec_record(seconds, emitted):
  counters = dict(drafted=30, accepted=20, emitted=emitted, target_calls=10, beta_sum=16.0,
                  beta_count=20, iterations=10, accepts_per_position=[8, 7, 5],
                  accepted_length_hist=[1, 1, 3, 5])
  return ProgramRecord(seconds, counters, gamma=3)


def _ar_record(seconds, emitted):
  return ProgramRecord(seconds, {"emitted": emitted})


def _build(*, costs=None, loop=None, predictable=True, extra=None, calibration=None, **kw):
  """report.build from flat keywords: the `Setting` fields, the `Measured` fields, the costs."""
  names = {f.name for f in dataclasses.fields(report.Setting)}
  setting = report.Setting(**{k: kw.pop(k) for k in list(kw) if k in names})
  return report.build(setting, report.Measured(**kw), costs, loop, predictable=predictable,
                      calibration=calibration, extra=extra)


def test_build_benchmark_point():
  costs = Costs(target_ms=2.0, draft_ms=0.2, c=0.1, v={1: 1.0, 4: 1.5})
  m = _build(task="t", target="tgt", draft="d", temperature=0.0, gamma=3, num_examples=2,
                   ar_records=[_ar_record(2.0, 40)],
                   spec_records=[_spec_record(1.0, 40)], costs=costs,
                   quality_info={"metric": "bleu"}, match_rate=1.0)
  assert set(report.CONTRACT_KEYS) <= set(m)
  assert m["alpha"] == pytest.approx(0.8) and m["acceptance_rate"] == pytest.approx(2 / 3)
  assert m["speedup"] == pytest.approx(2.0) and m["v"] == 1.5 and m["c"] == 0.1
  # E from the row's own profile (8/10, 7/10, 5/10 kept at least 1, 2, 3 drafts): 3.0, where
  # alpha's formula (predicted_speedup(0.8, 3, 0.1, 1.5) = 1.64) would take positions as independent.
  assert m["speedup_predicted_in_sample"] == pytest.approx((1 + 0.8 + 0.7 + 0.5) / (3 * 0.1 + 1.5))
  assert m["speedup_predicted_in_sample"] != pytest.approx(predicted_speedup(0.8, 3, 0.1, 1.5))
  assert m["expected_tokens_per_iteration_in_sample"] == pytest.approx(3.0)
  assert m["ar_ms_per_token"] == pytest.approx(50.0) and m["spec_ms_per_token"] == 25.0
  assert m["greedy_match_rate"] == 1.0
  assert "speedup" in report.table([m]) and "bleu" not in report.table([m])


def test_build_autoregressive_only_has_all_keys():
  m = _build(task="t", target="tgt", draft=None, temperature=1.0, gamma=None,
                   num_examples=1, ar_records=[_ar_record(1.0, 10)], spec_records=[],
                   costs=None, quality_info={"metric": "exact_match"}, match_rate=0.5)
  assert set(report.CONTRACT_KEYS) <= set(m)
  assert m["speedup"] is None and m["alpha"] is None and m["greedy_match_rate"] is None
  assert m["ar_ms_per_token"] == pytest.approx(100.0)


def test_greedy_match_rate_and_quality_block():
  assert report.greedy_match_rate([[1, 2], [3]], [[1, 2], [4]]) == 0.5
  q = report.quality_block("exact_match", ["a", "b"], ["a", "c"], ["a", "b"])
  assert q["autoregressive"]["exact_match"] == 0.5 and q["speculative"]["exact_match"] == 1.0
  assert report.quality_block("bleu", [None], ["x"], ["x"])["speculative"] is None


def test_quality_block_bootstrap_interval():
  refs = ["a b c", "d e f", "g h i", "j k l"]
  ar = ["a b c", "d e x", "g h i", "j y l"]
  q = report.quality_block("exact_match", refs, ar, ar, bootstrap_samples=50)
  lo, hi = q["autoregressive_interval95"]
  assert lo <= 0.5 <= hi and q["speculative_within_interval"]
  q = report.quality_block("exact_match", refs, ar, ["z"] * 4, bootstrap_samples=50)
  assert q["autoregressive_interval95"][0] > 0.0 or not q["speculative_within_interval"]


def test_batch_record_json_round_trip_keeps_the_disk_format():
  """The typed records write what the untyped ones wrote, so older runs still resume."""
  rec = BatchRecord(group="temperature=0", indices=(3, 4),
                    points={"draft=d,gamma=3,temperature=0": _spec_record(1.0, 40)},
                    autoregressive=_ar_record(2.0, 40))
  d = rec.to_json()
  assert d["ar"] == {"seconds": 2.0, "emitted": 40, "counters": {"emitted": 40}}
  assert d["points"]["draft=d,gamma=3,temperature=0"]["gamma"] == 3
  assert BatchRecord.from_json(d) == rec
  old = {"group": "g", "indices": [1], "points": {}, "ar": {"seconds": 1.0, "emitted": 5,
                                                           "counters": {"emitted": 5}}}
  assert BatchRecord.from_json(old).autoregressive.emitted == 5


def test_speedup_of_the_baseline_itself_is_not_reported_as_measured():
  """GAMMA='auto' choosing 0 decodes with the baseline program: its "speedup" is None."""
  costs = Costs(target_ms=2.0, draft_ms=0.2, c=0.1, v={1: 1.0})
  ar = [_ar_record(2.0, 40)]
  m = _build(task="t", target="tgt", draft="d", temperature=0.0, gamma=0, num_examples=2,
                   ar_records=ar, spec_records=[ProgramRecord(2.0, {"emitted": 40}, gamma=0)],
                   costs=costs, quality_info={"metric": "bleu"}, match_rate=1.0,
                   alpha_if_nothing_drafted=0.27, speedup_measured=False)
  assert m["speedup"] is None and m["speedup_predicted_in_sample"] == 1.0 and m["alpha"] == 0.27


LOOP = {"ar_ms": 4.0, "ar_fixed_ms": 8.0, "tokens": 30.0,
        "iteration_ms": {"3": 7.0}, "fixed_ms": {"3": 11.0},
        "tokens_per_iteration": {"3": 2.2}, "batches": 4, "rows": 1}


def test_prediction_from_the_timed_loop():
  """With loop costs, speedup_predicted is E * T_ar / T_iter with the fixed costs and N = this
  run's autoregressive iterations per batch; c, v and v_curve stay (public contract)."""
  costs = Costs(target_ms=2.0, draft_ms=0.2, c=0.1, v={1: 1.0, 4: 1.5})
  ar = ProgramRecord(2.0, {"emitted": 40, "iterations": 40})
  m = _build(task="t", target="tgt", draft="d", temperature=0.0, gamma=3, num_examples=2,
                   ar_records=[ar], spec_records=[_spec_record(1.0, 40)], costs=costs,
                   quality_info={"metric": "bleu"}, match_rate=1.0, loop=LOOP)
  e = 1 + 0.8 + 0.7 + 0.5  # the row's profile
  assert m["speedup_predicted_in_sample"] == pytest.approx((8 + 40 * 4) / (11 + 40 / e * 7))
  # At temperature > 0 the two decodes sample outputs of different lengths: each its own.
  short = _build(task="t", target="tgt", draft="d", temperature=1.0, gamma=3,
                       num_examples=2, ar_records=[ar], spec_records=[_spec_record(1.0, 30)],
                       costs=costs, quality_info={}, match_rate=None, loop=LOOP)
  assert short["speedup_predicted_in_sample"] == pytest.approx((8 + 40 * 4) / (11 + 30 / e * 7))
  assert m["speedup_predicted"] is None  # no calibration decode: nothing out of sample
  assert m["iteration_ms"] == 7.0
  assert m["c"] == 0.1 and m["v"] == 1.5 and m["v_curve"] == {"1": 1.0, "4": 1.5}
  assert m["loop_costs"] == LOOP and m["ar_iteration_ms"] == 4.0


def test_rows_are_predicted_from_their_own_acceptance_profile():
  """Both rules: E = 1 + sum of the row's fractions of target calls that kept at least i drafts
  (8/10, 7/10, 5/10 in _spec_record), not the formula in alpha (0.8: 1 + 0.8 + 0.64 + 0.512),
  which takes positions as independent; a token-wise row without a profile falls back to that
  formula."""
  costs = Costs(target_ms=2.0, draft_ms=0.2, c=0.1, v={1: 1.0, 4: 1.5})
  kw = dict(task="t", target="tgt", draft="d", gamma=3, num_examples=2,
            ar_records=[ProgramRecord(2.0, {"emitted": 40, "iterations": 40})],
            costs=costs, quality_info={}, match_rate=None, loop=LOOP)
  rows = [_spec_record(1.0, 40)]
  block = _build(temperature=1.0, rule="block", spec_records=rows, **kw)
  token = _build(temperature=1.0, rule="tokenwise", spec_records=rows, **kw)
  greedy = _build(temperature=0.0, rule="tokenwise", spec_records=rows, **kw)
  for m in (block, token, greedy):
    assert m["expected_tokens_per_iteration_in_sample"] == pytest.approx(1 + 0.8 + 0.7 + 0.5)
    assert m["speedup_predicted_in_sample"] == pytest.approx((8 + 40 * 4) / (11 + 40 / 3.0 * 7))
  bare = _spec_record(1.0, 40)
  bare.counters.pop("accepts_per_position")
  no_profile = _build(temperature=0.0, rule="tokenwise", spec_records=[bare], **kw)
  assert no_profile["expected_tokens_per_iteration_in_sample"] == pytest.approx(
      1 + 0.8 + 0.64 + 0.512)


def test_speedup_predicted_is_made_from_calibration_data_only():
  """Out of sample: the calibration decode's profile (E = 1 + 0.6 + 0.4 + 0.2) and the
  calibration prompts' N (the loop's 30 tokens), never the measured row's own profile or N."""
  costs = Costs(target_ms=2.0, draft_ms=0.2, c=0.1, v={1: 1.0, 4: 1.5})
  ar = ProgramRecord(2.0, {"emitted": 40, "iterations": 40})
  cal = {"alpha": 0.6, "accept_at_least": [0.6, 0.4, 0.2], "gamma": 8, "prompts": 16,
         "held_out": True}
  m = _build(task="t", target="tgt", draft="d", temperature=0.0, gamma=3, num_examples=2,
             ar_records=[ar], spec_records=[_spec_record(1.0, 40)], costs=costs,
             quality_info={}, match_rate=1.0, loop=LOOP, calibration=cal)
  e_cal, e_row = 1 + 0.6 + 0.4 + 0.2, 1 + 0.8 + 0.7 + 0.5
  assert m["speedup_predicted"] == pytest.approx((8 + 30 * 4) / (11 + 30 / e_cal * 7))
  assert m["expected_tokens_per_iteration"] == pytest.approx(e_cal)
  assert m["speedup_predicted_from"] == "loop"
  assert m["speedup_predicted_lone_extend"] == pytest.approx(e_cal / (3 * 0.1 + 1.5))
  assert m["speedup_predicted_in_sample"] == pytest.approx((8 + 40 * 4) / (11 + 40 / e_row * 7))
  assert m["calibration"] == cal


def test_intervals_over_batches():
  """speedup and alpha come with bootstrap intervals over batches that contain the point value."""
  ars = [_ar_record(2.0 + 0.1 * i, 40) for i in range(12)]
  specs = [_spec_record(1.0 + 0.05 * (i % 5), 40) for i in range(12)]
  for i, r in enumerate(specs):
    r.counters["beta_sum"] = 10.0 + i
  m = _build(task="t", target="tgt", draft="d", temperature=0.0, gamma=3, num_examples=12,
             ar_records=ars, spec_records=specs, quality_info={}, match_rate=1.0)
  lo, hi = m["speedup_interval95"]
  assert lo < m["speedup"] < hi and m["num_batches"] == 12
  lo, hi = m["alpha_interval95"]
  assert lo < m["alpha"] < hi
  one = _build(task="t", target="tgt", draft="d", temperature=0.0, gamma=3, num_examples=1,
               ar_records=ars[:1], spec_records=specs[:1], quality_info={}, match_rate=1.0)
  assert one["speedup_interval95"] is None and one["alpha_interval95"] is None
