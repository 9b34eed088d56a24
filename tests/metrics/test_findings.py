"""The findings table's verdicts follow the intervals: ordered and disjoint reproduces, reversed
and disjoint contradicts, overlapping does not resolve, no records is untested."""
from specdec_jax.metrics import findings, results


def _record(draft, temperature, alpha, half=0.01, speedup=None, gamma=4):
  m = {"task": "translate_en_de", "draft": draft, "temperature": temperature, "gamma": gamma,
       "num_examples": 100, "alpha": alpha, "alpha_interval95": [alpha - half, alpha + half],
       "speedup": speedup, "calibration": {"held_out": True}}
  if speedup is not None:
    m.update(speedup_interval95=[speedup - 0.05, speedup + 0.05], speedup_predicted=speedup)
  return results.make_record("r", m, command="c", commit="0" * 7, date="d", machine={},
                             load_average=[0, 0, 0])


def test_order_verdicts_follow_the_intervals():
  lo, hi = _record("a", 0, 0.3)["metrics"], _record("b", 0, 0.5)["metrics"]
  assert findings.order_verdict(lo, hi, "alpha") == "reproduced"
  assert findings.order_verdict(hi, lo, "alpha") == "contradicted"
  near = _record("c", 0, 0.305)["metrics"]
  assert findings.order_verdict(lo, near, "alpha") == "not resolved"
  assert findings.chain_verdict([]) == "untested"
  assert findings.chain_verdict(["reproduced", "not resolved"]) == "not resolved"
  assert findings.chain_verdict(["reproduced", "contradicted"]) == "contradicted"


def test_the_table_judges_each_finding_from_its_records():
  recs = [_record("t5_draft_small", 0, 0.70), _record("t5_draft_base", 0, 0.75),
          _record("t5_draft_large", 0, 0.80), _record("t5_draft_small", 1, 0.60),
          _record("t5_draft_base", 1, 0.62, half=0.05), _record("t5_draft_large", 1, 0.64),
          _record("unigram", 0, 0.05), _record("bigram", 0, 0.2)]
  table = findings.findings_table(recs)
  lines = {row.split(" | ")[0].lstrip("| "): row.rsplit(" | ", 1)[1].rstrip(" |")
           for row in table.splitlines()[2:]}
  assert lines["alpha rises with draft size (small < base < large), T = 0"] == "reproduced"
  assert lines["alpha rises with draft size, T = 1"] == "not resolved"  # base's wide interval
  assert lines["alpha at T = 0 above alpha at T = 1 for the same pair"] == "reproduced"
  assert lines["a trained draft's alpha far above unigram and bigram drafts (T = 0)"] == \
      "reproduced"
  assert lines["speedup falls as the draft grows at a fixed gamma, T = 0"] == "untested"
  timed = recs + [_record("t5_draft_small", 0, 0.7, speedup=1.5, gamma=3),
                  _record("t5_draft_large", 0, 0.8, speedup=1.8, gamma=3)]
  assert "| speedup falls as the draft grows at a fixed gamma (3), T = 0 |" in \
      findings.findings_table(timed)
  assert findings.findings_table(timed).splitlines()[6].endswith("| contradicted |")
