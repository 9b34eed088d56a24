"""What a run prints: a compact table of named metrics within 100 columns (issue 31).

Why: the printed row was 15 columns and ~170 characters, "quality AR 2.92" named no metric, the
adaptive row showed gamma 8 (its maximum) and '-' for its costs, and re-running a finished run
re-calibrated for 40 s and rewrote c, v and the prediction beside the first run's speedup.
"""
import json
import os

import pytest

from specdec_jax import run
from specdec_jax.metrics import machine, report
from specdec_jax.runner import autotune, pipeline

SMOKE = "configs/local/smoke.gin"
BINDINGS = ["NUM_EXAMPLES = 4", "BATCH_SIZE = 2", "MAX_DECODE_LENGTH = 8", "RunConfig.repeats = 1"]

pytestmark = pytest.mark.usefixtures("clean_gin")


def _row(**kw):
  m = {"task": "translate_en_de", "target": "t5_target", "draft": "t5_shared_draft",
       "temperature": 0.0, "gamma": 3, "gamma_auto": True, "num_examples": 100, "alpha": 0.623,
       "alpha_interval95": [0.594, 0.651], "tokens_per_target_call": 2.14, "speedup": 1.08,
       "speedup_interval95": [0.98, 1.18], "speedup_predicted": 1.23, "c": 0.112, "v": 1.0,
       "ar_ms_per_token": 4.32, "spec_ms_per_token": 4.01, "greedy_match_rate": 1.0,
       "mean_gamma": 2.9, "calibration": {"prompts": 48, "held_out": True},
       "quality": {"metric": "bleu", "autoregressive": {"bleu": 12.95},
                   "speculative": {"bleu": 12.95}, "speculative_within_interval": True}}
  m.update(kw)
  return m


def test_summary_names_its_metrics_within_100_columns():
  rows = [_row(),
          _row(draft="runs/train/t5_shared_draft_seqkd_fkl/export", temperature=0.7, gamma=8,
               gamma_auto=False, adaptive={"gamma_max": 8}, mean_gamma=2.43,
               speedup_predicted=None, v=None),
          _row(draft=None, gamma=None, gamma_auto=False, alpha=None, alpha_interval95=None,
               speedup=None, speedup_interval95=None, speedup_predicted=None, c=None,
               spec_ms_per_token=None, tokens_per_target_call=None, mean_gamma=None)]
  lines = report.summary(rows)
  assert all(len(line) <= report.WIDTH for line in lines), max(lines, key=len)
  text = "\n".join(lines)
  for name in ("alpha [95% CI]", "tokens/call", "speedup [95% CI]", "predicted", " n "):
    assert name in text, name
  assert "1.08x [0.98,1.18]" in text and "0.623 [0.59,0.65]" in text
  assert "auto 3" in text and "adapt 2.4" in text  # what 'auto' chose; the adaptive mean gamma
  assert "BLEU 12.95 (AR 12.95, inside its 95% CI)" in text  # the metric named
  assert "calibrated on 48 held-out prompts" in lines[0]
  sweep = report.summary([_row(gamma=g, gamma_auto=False) for g in range(1, 9)])
  assert len(sweep) <= 12 and all(len(line) <= report.WIDTH for line in sweep)


def test_adaptive_row_carries_its_mean_gamma_and_costs():
  from specdec_jax.metrics.records import ProgramRecord
  from specdec_jax.timing import Costs
  counters = {"drafted": 30, "accepted": 20, "emitted": 40, "target_calls": 12,
              "beta_sum": 20.0, "beta_count": 30, "iterations": 12,
              "accepts_per_position": [10, 6, 4], "accepted_length_hist": [2, 4, 2, 4]}
  m = report.build(report.Setting("t", "tgt", "d", 0.0, 8, 2),
                   report.Measured([ProgramRecord(1.0, dict(counters, drafted=0, accepted=0))],
                                   [ProgramRecord(0.5, counters)]),
                   Costs(target_ms=2.0, draft_ms=0.2, c=0.1, v={1: 1.0}), predictable=False)
  assert m["mean_gamma"] == pytest.approx(2.5) and m["c"] == 0.1
  assert m["speedup_predicted"] is None  # the fixed-gamma formula does not predict it


@pytest.mark.slow  # ~16 s: two smoke runs; the table's format is tested above without a run
def test_run_prints_a_compact_table_and_a_rerun_measures_nothing(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)  # a relative --output_dir, as the README's commands give
  out = "runs/smoke"
  first = run.run([SMOKE], out, BINDINGS)
  printed = capsys.readouterr().out.splitlines()
  assert printed and all(len(line) <= 100 for line in printed), printed
  assert len(printed) < 25 and any("speedup [95% CI]" in line for line in printed)
  with open(os.path.join(out, "metrics.json"), "rb") as f:
    stored = f.read()
  mtime = os.path.getmtime(os.path.join(out, "metrics.json"))
  noted = machine.read_run(out)  # the machine and load as the run ran, for its record
  assert len(noted) == 1 and noted[0]["machine"]["memory_read_gb_s"] > 0
  assert len(noted[0]["load_start"]) == len(noted[0]["load_end"]) == 3

  def refuse(*_, **__):
    raise AssertionError("a finished run loaded models or re-calibrated")
  monkeypatch.setattr(pipeline, "load", refuse)
  monkeypatch.setattr(autotune, "resolve_points", refuse)
  import gin
  gin.clear_config()
  again = run.run([SMOKE], out, BINDINGS)
  reprinted = capsys.readouterr().out.splitlines()
  stored_json = json.loads(stored)
  assert again == (stored_json if isinstance(stored_json, list) else [stored_json])
  assert [m["run"] for m in again] == [m["run"] for m in first]
  with open(os.path.join(out, "metrics.json"), "rb") as f:
    assert f.read() == stored  # nothing rewritten
  assert os.path.getmtime(os.path.join(out, "metrics.json")) == mtime
  assert machine.read_run(out) == noted  # nothing decoded, no segment added
  assert any("stored results of a finished run" in line for line in reprinted)
  assert reprinted[:3] == printed[:3]  # the same table
