"""Results as data: records render into the docs' tables, and the committed docs match them.

Why: README figures typed by hand contradicted each other; a generated table that drifts from its
records is caught here (`python scripts/results.py tables` regenerates them).
"""
import os
import subprocess
import sys

import pytest

from specdec_jax.metrics import machine as machine_lib
from specdec_jax.metrics import results

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _record(name, speedup):
  metrics = {"task": "translate_en_de", "temperature": 0.0, "gamma": 2, "num_examples": 100,
             "alpha": 0.7, "alpha_interval95": [0.68, 0.72], "tokens_per_target_call": 2.5,
             "speedup": speedup, "speedup_interval95": [speedup - 0.1, speedup + 0.1],
             "speedup_predicted": 1.2, "speedup_predicted_in_sample": 1.25,
             "calibration": {"held_out": True}}
  return results.make_record(name, metrics, command="python -m specdec_jax.run ...",
                             commit="0123456789abcdef", date="2026-11-25",
                             machine={"cores": 2}, load_average=[1.0, 1.0, 1.0])


def test_a_marked_block_is_rendered_from_its_records():
  doc = "intro\n<!-- results:headline a b -->\nstale\n<!-- /results:headline -->\nend\n"
  out = results.render(doc, {"a": _record("a", 1.3), "b": _record("b", 1.5)})
  assert out.startswith("intro\n<!-- results:headline a b -->\n| record |")
  assert "1.30x [1.20, 1.40]" in out and "1.50x [1.40, 1.60]" in out and "stale" not in out
  assert out.endswith("<!-- /results:headline -->\nend\n")
  assert results.render(out, {"a": _record("a", 1.3), "b": _record("b", 1.5)}) == out


def test_the_costs_table_puts_c_beside_tokens_per_call():
  rec = _record("a", 0.9)
  rec["metrics"].update(draft="fd", c=0.41, draft_ms_per_call=0.5, iteration_ms=4.25,
                        ar_iteration_ms=1.5)
  out = results.render("<!-- results:costs a -->\n<!-- /results:costs -->", {"a": rec})
  assert "| a | fd | 0 |" in out and "| 0.410 | 0.500 | 4.25 | 1.50 | 0.90x [0.80, 1.00] |" in out


def test_the_repeats_table_gives_the_median_and_the_between_run_range():
  """Three processes of one command: the median run's speedup, the between-run range beside the
  median run's own (prompts-only) interval; a gamma-0 'auto' run counts as 1.00x, marked; runs
  of different commands are refused."""
  recs = {n: _record(n, x) for n, x in (("a", 1.3), ("b", 1.1), ("c", 1.5))}
  recs["b"]["metrics"].update(gamma=0, speedup=None, speedup_interval95=None)
  for r in recs.values():
    r["machine"] = {"cpu": "AMD EPYC", "cores": 2}
  out = results.render("<!-- results:repeats a b c -->\n<!-- /results:repeats -->", recs)
  row = out.splitlines()[3]
  assert row == ("| 3 | 2, 0, 2 | 1.30x, 1.00x (gamma 0), 1.50x | 1.30x | 1.00-1.50x | "
                 "[1.20, 1.40] | AMD EPYC, 2 cores |")
  recs["c"]["command"] = "python -m specdec_jax.run --other"
  with pytest.raises(ValueError, match="one command"):
    results.render("<!-- results:repeats a b c -->\n<!-- /results:repeats -->", recs)


def test_unknown_tables_and_missing_records_are_refused():
  with pytest.raises(ValueError, match="do not exist"):
    results.render("<!-- results:headline x -->\n<!-- /results:headline -->", {})
  with pytest.raises(ValueError, match="unknown results table"):
    results.render("<!-- results:nope x -->\n<!-- /results:nope -->", {})
  with pytest.raises(ValueError, match="record name"):
    _record("Bad Name", 1.0)


def test_a_table_outside_the_markers_is_found():
  text = ("prose\n<!-- results:headline a -->\n| a | b |\n|---|---|\n<!-- /results:headline -->\n"
          "| typed | by hand |\n  | indented | too |\n")
  assert results.typed_table_lines(text) == [6, 7]
  assert results.typed_table_lines(text.split("| typed")[0]) == []


def test_the_committed_docs_match_their_records():
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "results.py"), "tables",
                         "--check"], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stdout + proc.stderr


def test_save_record_fills_in_where_and_when(tmp_path):
  """The scripts' one way to write a record: the given commit and load are kept (a run is
  recorded after HEAD moved on), else HEAD's commit and the current load."""
  path = results.save_record(str(tmp_path), "a_row", {"speedup": 1.2}, command="python x",
                             commit="abc1234", load="1.5,2.25,3")
  rec = results.load_records(str(tmp_path))["a_row"]
  assert path == str(tmp_path / "a_row.json") and set(rec) == set(results.RECORD_KEYS)
  assert (rec["commit"], rec["load_average"], rec["metrics"]) == ("abc1234", [1.5, 2.25, 3.0],
                                                                  {"speedup": 1.2})
  repo = tmp_path / "repo"
  repo.mkdir()
  git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
  subprocess.run(git + ["init", "-q"], check=True)
  subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "x"], check=True)
  head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True,
                        check=True).stdout.strip()
  results.save_record(str(repo), "b_row", {}, command="python y")
  rec = results.load_records(str(repo))["b_row"]
  assert rec["commit"] == head and len(rec["load_average"]) == 3


def test_every_committed_record_names_its_commit():
  """A record without its commit cannot be traced to the code that produced it; the scripts'
  --commit flags once defaulted to '' instead of HEAD and wrote four such records."""
  records = results.load_records(os.path.join(ROOT, "docs", "results"))
  empty = sorted(name for name, rec in records.items() if len(str(rec.get("commit") or "")) < 7)
  assert not empty, empty


def test_records_are_append_only(tmp_path):
  """A rerun is a new record: writing a name that exists is refused and the first stays."""
  path = results.write_record(str(tmp_path), _record("main", 1.3))
  with pytest.raises(FileExistsError, match="append-only"):
    results.write_record(str(tmp_path), _record("main", 1.9))
  assert results.load_records(str(tmp_path))["main"]["metrics"]["speedup"] == 1.3
  assert os.path.basename(path) == "main.json"


def test_the_committed_records_match_their_ledger():
  """No committed record is edited or deleted after it was recorded (docs/results/ledger.sha256
  holds each one's SHA-256, appended by `write_record`)."""
  assert results.ledger_problems(os.path.join(ROOT, "docs", "results")) == []


def test_the_ledger_catches_an_edit_a_deletion_and_an_unlisted_record(tmp_path):
  d = str(tmp_path)
  first = results.write_record(d, _record("first", 1.3))
  results.write_record(d, _record("second", 1.4))
  assert results.ledger_problems(d) == []
  with open(first, "a") as f:
    f.write(" ")
  os.remove(os.path.join(d, "second.json"))
  with open(os.path.join(d, "third.json"), "w") as f:
    f.write("{}")
  assert results.ledger_problems(d) == [
      "first.json: changed after it was recorded", "second.json: recorded, now deleted",
      "third.json: not in ledger.sha256 (write records with scripts/results.py record)"]


def test_machine_identity_names_caches_bandwidth_and_versions():
  m = results.machine()
  assert m["cores"] >= 1 and m["memory_read_gb_s"] > 0 and "jax" in m
  assert isinstance(m["caches"], dict)


def test_a_record_takes_the_machine_and_load_the_run_noted(tmp_path, monkeypatch):
  """A record made after its run (scripts/results.py record) reports the machine as the run
  found it and the load as it finished, not those of the moment it is made (a background job
  then read as a low bandwidth); without the run's note it measures now and says so."""
  run_dir = str(tmp_path / "run")
  os.makedirs(run_dir)
  machine_lib.note_run_start(run_dir)
  machine_lib.note_run_end(run_dir)
  noted = machine_lib.read_run(run_dir)[0]
  monkeypatch.setattr(machine_lib, "machine", lambda: {"cpu": "later", "memory_read_gb_s": 1.0})
  monkeypatch.setattr(machine_lib, "_load", lambda: [9.0, 9.0, 9.0])
  results.save_record(str(tmp_path), "a_row", {}, command="python x", commit="abc1234",
                      run_segments=machine_lib.read_run(run_dir))
  rec = results.load_records(str(tmp_path))["a_row"]
  assert rec["machine"]["cpu"] == noted["machine"]["cpu"] != "later"
  assert rec["machine"]["memory_read_gb_s"] == noted["machine"]["memory_read_gb_s"]
  assert rec["load_average"] == noted["load_end"] and "run's start" in rec["machine"]["measured"]
  # a resumed run on another machine adds a segment naming it: refused, figures would mix
  machine_lib.note_run_start(run_dir)
  with pytest.raises(ValueError, match="2 machines"):
    machine_lib.for_record(machine_lib.read_run(run_dir))
  # the same CPU name with other cores is another machine (issue 46: one name, two speeds)
  same_name = dict(noted["machine"], cores=noted["machine"]["cores"] + 2)
  with pytest.raises(ValueError, match="2 machines"):
    machine_lib.for_record([noted, dict(noted, machine=same_name)])
  # a run that starts over forgets the earlier run's segments
  machine_lib.note_run_start(run_dir, fresh=True)
  assert len(machine_lib.read_run(run_dir)) == 1
  measured, load = machine_lib.for_record(None)
  assert measured["cpu"] == "later" and "when recorded" in measured["measured"] and load is None


def test_tables_name_each_rows_machine():
  """Rows from two machines in one table say so on every row (issue 46)."""
  from specdec_jax.metrics import compare  # pylint: disable=import-outside-toplevel
  a = dict(_record("a", 1.3), machine={"cpu": "Intel(R) Xeon(R) Processor", "cores": 2})
  b = dict(_record("b", 1.2), machine={"cpu": "AMD EPYC 7B13 64-Core Processor", "cores": 2})
  assert compare.machine_label(a) == "Intel Xeon, 2 cores"
  table = results.headline_table([a, b])
  assert "| Intel Xeon, 2 cores |" in table and "| AMD EPYC 7B13 64-Core, 2 cores |" in table


def test_the_diagnostic_tables_render_their_records_figures():
  """The tree-bound and loop-anatomy tables were typed by hand; now each cell is a record's."""
  best = {"depth": 2, "drafted_nodes": 3, "speed_over_best_chain": 1.1617, "flat_verify": 1.16}
  flat = {"depth": 2, "drafted_nodes": 16, "speed_over_best_chain": 0.86, "flat_verify": 1.373}
  rec = {"name": "tb", "metrics": {"draft": "d", "chain_record": "c", "temperature": 0.0,
                                   "best": best, "best_flat_verify": flat}}
  out = results.render("<!-- results:tree_bound tb -->\n<!-- /results:tree_bound -->", {"tb": rec})
  assert "| tb | d | c | 0 | 1.16x | (2, 3) | 1.37x | (2, 16) |" in out
  row = {"gamma": 1, "goal": 1.7, "alpha_for_goal": None, "tokens_per_target_call": 1.657,
         "speedup_end_to_end": 1.218, "speedup_end_to_end_with_free_draft": 1.5,
         "free_draft_tokens_per_call_for_goal": 1.948, "tokens_per_call_for_goal": 2.5665,
         "iteration_ms_free_draft": 1.0, "tokens_per_request": 40.0,
         "autoregressive_fixed_ms": 10.0, "fixed_ms": 12.0}
  rec = {"name": "la", "metrics": {
      "autoregressive_iteration_ms": 1.2, "lone_target_ms": 1.25,
      "rows": {"gamma1": row, "gamma2": dict(row, gamma=2, alpha_for_goal=0.891)}}}
  out = results.render("<!-- results:anatomy_goal la -->\n<!-- /results:anatomy_goal -->",
                       {"la": rec})
  # At 1.657 tokens per call 1.7x needs an iteration of ((10 + 48) / 1.7 - 12) x 1.657 / 40 =
  # 0.916 ms, under the free loop's 1.0: no budget for the draft (at gamma 2 neither).
  assert ("| la | 1.7x | 1 | 1.66 | 1.22x | 1.50x | 1.95 of 2 (0.95) | 2.57 of 2 (none) | "
          "none (free calls fall short) |") in out
  assert "|  |  | 2 | 1.66 | 1.22x | 1.50x | 1.95 of 3 (0.59) | 2.57 of 3 (0.89) |" in out
  row["tokens_per_target_call"] = 3.0  # iteration 1.659 ms: 0.659 left for one draft call
  out = results.render("<!-- results:anatomy_goal la -->\n<!-- /results:anatomy_goal -->",
                       {"la": rec})
  assert "| 3.00 | 1.22x | 1.50x | 1.95 of 2 (0.95) | 2.57 of 2 (none) | 0.66 ms (0.527) |" in out
  # Fixed costs past the goal's time: loop_anatomy writes infinity; no count, no alpha.
  rec["metrics"]["rows"]["gamma2"]["free_draft_tokens_per_call_for_goal"] = float("inf")
  out = results.render("<!-- results:anatomy_goal la -->\n<!-- /results:anatomy_goal -->",
                       {"la": rec})
  assert "| 2 | 1.66 | 1.22x | 1.50x | none (fixed costs exceed the goal) | 2.57 of 3" in out


def test_the_peer_table_renders_a_compare_hf_records_figures():
  """scripts/compare_hf.py's records: every cell from the record (the peer paragraph of
  docs/results.md was typed by hand), one row per temperature, a disagreement shown."""
  row = {"tokens_per_s": {"ours_ar": 56.91, "hf_plain": 23.51, "ours_spec": 55.05},
         "ar_vs_hf_plain": 2.4207, "ours_spec_vs_ours_ar": 0.967,
         "hf_assisted_vs_hf_plain": 0.7367, "hf_prompt_lookup_vs_hf_plain": 1.3313,
         "greedy_agreement": {"ours_ar=hf_plain": 1.0, "hf_assisted=hf_plain": 0.875}}
  rec = {"name": "peer", "load_average": [1.91, 2.0, 2.0],
         "machine": {"cpu": "AMD EPYC 7B13", "cores": 2},
         "metrics": {"kind": "compare_hf", "task": "summarize", "gamma": 3, "num_examples": 8,
                     "draft": "runs/train/smollm2_draft/export", "by_temperature": {"0": row}}}
  out = results.render("<!-- results:peer peer -->\n<!-- /results:peer -->", {"peer": rec})
  assert ("| peer | summarize | 0 | 3 | 8 | 56.9 tok/s | 23.5 tok/s | 2.42x | 0.97x "
          "(smollm2_draft) | assisted 0.74x, prompt lookup 1.33x | min 0.88 | AMD EPYC 7B13, "
          "2 cores | 1.9 |") in out


def test_the_draft_alpha_table_renders_an_acceptance_probes_figures():
  """experiments/feature_draft_alpha.py's outputs, imported as records: every cell from the
  record (docs/feature_draft.md's table was pasted), the trained draft's cost from its summary."""
  feature = {"alpha": 0.5907, "acceptance_rate": 0.3136, "tokens_per_target_call": 2.1417,
             "target_calls": 1214, "accept_at_least": [0.5593, 0.3394]}
  shared = {"alpha": 0.6568, "acceptance_rate": 0.3834, "tokens_per_target_call": 2.3985,
            "target_calls": 1084}
  train = {"steps": 4000, "train_seconds": 2920.3, "target_tokens_seen": 1186830}
  rec = {"name": "fa", "metrics": {"temperature": 0.0, "training": {"feature_draft": train},
                                   "rows": {"feature_draft": feature, "t5_shared_draft": shared}}}
  out = results.render("<!-- results:draft_alpha fa -->\n<!-- /results:draft_alpha -->",
                       {"fa": rec})
  assert ("| fa | feature_draft | 4,000 steps, 49 min, 1.19M tokens | 0 | 0.591 | 0.314 | "
          "0.56, 0.34 | 2.14 | 1,214 |") in out
  assert "| fa | t5_shared_draft | shipped | 0 | 0.657 | 0.383 | - | 2.40 | 1,084 |" in out


def test_the_weight_floor_table_renders_a_bench_loop_records_figures():
  """scripts/bench_loop.py's records (one layout each): the step over the same process's floor,
  the prefill-free step where the record has it and ms/token where an older one does not."""
  m = {"kind": "bench_loop", "layout": "auto->hybrid", "decode_path_mb": 513.13,
       "bandwidth_gb_s": 32.80, "bandwidth_probes_gb_s": {"kernel_gemv": 32.80, "xla_sum": 24.5},
       "memory_bound_ms_per_token": 16.40, "ar_ms_per_token": 20.44, "ar_step_ms": 19.96,
       "prompt_len": 16}
  old = {k: v for k, v in m.items() if k not in ("ar_step_ms", "bandwidth_probes_gb_s",
                                                 "prompt_len")}
  mach = {"cpu": "AMD EPYC", "cores": 2}
  recs = {"new": {"name": "new", "metrics": m, "machine": mach, "load_average": [1.4, 2, 2],
                  "commit": "3b3d986abc"},
          "old": {"name": "old", "metrics": dict(old, memory_bound_ms_per_token=12.35,
                                                 ar_ms_per_token=15.67),
                  "machine": mach, "load_average": [1.8, 2, 2], "commit": "cdcdf31abc"}}
  out = results.render("<!-- results:weight_floor new old -->\n<!-- /results:weight_floor -->",
                       recs)
  assert ("| new | auto->hybrid | 16 | 513 | kernel_gemv 32.8, xla_sum 24.5 (32.8) | 16.40 | "
          "19.96 | 20.44 | 1.22x | AMD EPYC, 2 cores | 1.4 | 3b3d986 |") in out
  assert ("| old | auto->hybrid | 16 | 513 | 32.8 (32.8) | 12.35 | - | 15.67 | 1.27x (ms/token) | "
          "AMD EPYC, 2 cores | 1.8 | cdcdf31 |") in out
