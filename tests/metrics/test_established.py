"""The 'what is and is not established' list counts every record a claim can test."""
from specdec_jax.metrics import established, results


def _rec(name, **m):
  return {"name": name, "metrics": m}


def _row(table: str, claim: str) -> list[str]:
  line = next(l for l in table.splitlines() if l.startswith(f"| {claim} |"))
  return [c.strip() for c in line.strip("|").split("|")]


def test_a_claim_is_established_only_when_every_record_meets_its_rule():
  recs = [_rec("a", temperature=0.0, greedy_match_rate=1.0),
          _rec("b", temperature=0.0, greedy_match_rate=1.0),
          _rec("c", temperature=1.0, greedy_match_rate=0.4)]  # T = 1: not eligible
  row = _row(established.established_table(recs), "greedy speculative decoding emits the "
             "autoregressive tokens")
  assert row[1:3] == ["established", "2 of 2"]
  recs.append(_rec("d", temperature=0.0, greedy_match_rate=0.99))
  row = _row(established.established_table(recs), "greedy speculative decoding emits the "
             "autoregressive tokens")
  assert row[1:3] == ["not established", "2 of 3"]


def test_repeats_count_autos_choice_and_the_between_run_spread():
  """Three processes of one command: 'auto' chose 1, 0 (plain decoding: 1.0x), 1."""
  def rep(k, gamma, speedup, interval):
    return _rec(f"main_t0_repeat{k}_epyc", gamma=gamma, gamma_auto=True, speedup=speedup,
                speedup_interval95=interval)
  recs = [rep(1, 1, 1.16, [1.14, 1.18]), rep(2, 0, None, None), rep(3, 1, 1.12, [1.10, 1.14])]
  table = established.established_table(recs)
  assert _row(table, "'auto' makes the same choice in every process")[1:3] == [
      "not established", "0 of 1"]
  row = _row(table, "a run's speedup interval covers another process of the same command")
  assert row[1:3] == ["not established", "0 of 1"] and "1.00-1.16x" in row[4]
  # Three processes that all chose plain decoding measured no interval: the same choice every
  # time, but nothing for the spread claim to test, so that group is not counted for it.
  recs += [_rec(f"other_t0_repeat{k}_x", gamma=0, gamma_auto=True, speedup=None,
                speedup_interval95=None) for k in (1, 2, 3)]
  table = established.established_table(recs)
  assert _row(table, "'auto' makes the same choice in every process")[1:3] == [
      "not established", "1 of 2"]
  row = _row(table, "a run's speedup interval covers another process of the same command")
  assert row[1:3] == ["not established", "0 of 1"]


def test_the_prediction_claim_counts_held_out_records_only():
  def pred(name, p, s, held_out=True):
    return _rec(name, speedup=s, speedup_predicted=p, speedup_interval95=[s - 0.02, s + 0.02],
                calibration={"held_out": held_out})
  recs = [pred("a", 1.30, 1.25), pred("b", 1.50, 1.20), pred("c", 9.0, 1.0, held_out=False)]
  row = _row(established.established_table(recs), "the cost formula predicts the measured "
             "speedup")
  assert row[1:3] == ["not established", "1 of 2"] and "0 of 2" in row[4]


def test_the_marker_takes_no_names_and_counts_every_record():
  text = "<!-- results:established -->\nold\n<!-- /results:established -->"
  out = results.render(text, {"a": _rec("a", temperature=0.0, greedy_match_rate=1.0)})
  assert "| 1 of 1 |" in out and "old" not in out


def test_a_median_records_processes_count_as_repeats():
  """scripts/reproduce.py records one median row with `between_runs`: its processes count."""
  m = {"gamma": 1, "gamma_auto": True, "speedup": 1.12, "speedup_interval95": [1.10, 1.14],
       "between_runs": {"gamma": [1, 1, 1], "speedup": [1.16, 1.12, 1.11],
                        "speedup_interval95": [[1.14, 1.18], [1.10, 1.14], [1.09, 1.13]]}}
  table = established.established_table([_rec("main_t0", **m)])
  assert _row(table, "'auto' makes the same choice in every process")[1:3] == [
      "established", "1 of 1"]
  assert _row(table, "a run's speedup interval covers another process of the same "
              "command")[1:3] == ["not established", "0 of 1"]
