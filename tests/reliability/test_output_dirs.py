"""Faults the framework survives: output directories (one writer, no claim without a result,
standard JSON).

Each test names the fault it reproduces; on the main branch before these fixes each failed:
two runs into one directory both wrote (16 lines for 8 examples), a run that failed before its
first batch locked its directory against the corrected rerun, and a NaN in a metric wrote the
non-standard JSON token NaN into metrics.json.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from specdec_jax import lock
from specdec_jax.metrics.records import BatchRecord
from specdec_jax.runner.collect import finite_json
from specdec_jax.runner.store import ResultStore

HOLDER = textwrap.dedent("""
    import sys, time
    from specdec_jax import lock
    with lock.hold(sys.argv[1], "run"):
      print("held", flush=True)
      time.sleep(600)
""")


def _hold_in_child(directory):
  child = subprocess.Popen([sys.executable, "-c", HOLDER, directory], stdout=subprocess.PIPE,
                           text=True)
  assert child.stdout.readline().strip() == "held"
  return child


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path):
  child = _hold_in_child(str(tmp_path))
  try:
    with pytest.raises(lock.DirectoryLocked, match=f"pid {child.pid}"):
      with lock.hold(str(tmp_path), "run"):
        pass
  finally:
    child.kill()
    child.wait()


def test_the_lock_of_a_killed_holder_is_taken_over(tmp_path):
  child = _hold_in_child(str(tmp_path))
  os.kill(child.pid, signal.SIGKILL)
  child.wait()
  with lock.hold(str(tmp_path), "run") as path:  # no error: the kernel released the flock
    assert json.load(open(path))["pid"] == os.getpid()


def test_the_lock_is_released_when_the_body_raises(tmp_path):
  with pytest.raises(KeyError):
    with lock.hold(str(tmp_path), "run"):
      raise KeyError("boom")
  with lock.hold(str(tmp_path), "run"):
    pass


def _record(indices):
  return BatchRecord(group="t0", indices=tuple(indices), points={}, autoregressive=None)


def test_a_run_that_wrote_no_batch_has_no_claim(tmp_path):
  ResultStore(str(tmp_path), {"max_decode_length": 10 ** 9})  # e.g. failed with out of memory
  store = ResultStore(str(tmp_path), {"max_decode_length": 64})  # the corrected rerun
  assert store.fresh  # starts over: nothing of the failed run (its machine.json segments) kept
  store.add_batch(_record([0, 1]), [])
  with pytest.raises(ValueError, match="different configuration"):
    ResultStore(str(tmp_path), {"max_decode_length": 128})  # now there is a result to protect
  assert not ResultStore(str(tmp_path), {"max_decode_length": 64}).fresh  # a resumption
  assert ResultStore(str(tmp_path), {"max_decode_length": 64}, resume=False).fresh


def test_metrics_json_stays_standard_json():
  payload = finite_json({"alpha": float("nan"), "speedup": [1.5, float("inf")], "n": 3})
  assert payload == {"alpha": None, "speedup": [1.5, None], "n": 3}
  json.dumps(payload, allow_nan=False)
