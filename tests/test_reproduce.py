"""scripts/reproduce.py: a recorded headline is the median of several fresh processes."""
import importlib.util
import os

import pytest

from specdec_jax.metrics import results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script():
  spec = importlib.util.spec_from_file_location(
      "reproduce", os.path.join(ROOT, "scripts", "reproduce.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _row(speedup, gamma, run="a"):
  return {"run": run, "task": "ende", "draft": "d", "temperature": 0.0, "gamma": gamma,
          "speedup": speedup, "alpha": 0.6, "spec_ms_per_token": 1.0,
          "speedup_interval95": None if speedup is None else [speedup - 0.02, speedup + 0.02]}


def test_the_median_process_is_reported_with_every_processs_figures():
  rep = _script()
  rows = rep.median_rows([[_row(1.16, 1)], [_row(None, 0)], [_row(1.12, 1)]])
  (m,) = rows
  assert m["speedup"] == 1.12 and m["between_runs"]["median_process"] == 3
  assert m["between_runs"]["gamma"] == [1, 0, 1]
  assert m["between_runs"]["speedup_range"] == [1.0, 1.16]  # plain decoding counts as 1.0x
  cell = results._speedup_cell(m)  # pylint: disable=protected-access
  assert cell.endswith("median of 3 processes: 1.00-1.16x"), cell


def test_recording_needs_at_least_three_processes():
  rep = _script()
  with pytest.raises(SystemExit):
    rep.main(["reproduce.py", "--output_root=/nonexistent", "--record", "--processes=2"])
