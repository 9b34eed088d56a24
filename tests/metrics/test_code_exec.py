"""pass@k by execution (specdec_jax/metrics/code_exec.py): the sandbox and the estimator.

Why these tests: pass@k is how "quality unchanged by speculation" is checked on HumanEval, so a
sandbox that lets a wrong program pass (or a right one fail) falsifies that claim, and one that
lets generated code write outside its directory or open a socket is a hazard on the machine
that runs it.
"""
import math
import os
import socket

import pytest

from specdec_jax.metrics import code_exec

PROBLEM = {"prompt": "def add(a, b):\n", "entry_point": "add",
           "test": "def check(candidate):\n  assert candidate(2, 3) == 5\n"
                   "  assert candidate(-1, 1) == 0\n"}


def run(body, **kw):
  return code_exec.run_program(
      code_exec.program(PROBLEM["prompt"], body, PROBLEM["test"], PROBLEM["entry_point"]), **kw)


def test_a_correct_solution_passes_and_a_wrong_one_fails():
  assert run("  return a + b\n") == code_exec.Outcome(True, "passed")
  out = run("  return a - b\n")
  assert not out.passed and "AssertionError" in out.result


def test_an_infinite_loop_times_out():
  out = run("  while True:\n    pass\n", timeout_s=1.0)
  assert out == code_exec.Outcome(False, "timed out")


def test_the_memory_limit_holds_and_the_parent_forks_nothing_in_python(recwarn):
  """2 GiB against a 256 MiB limit fails inside the program (MemoryError), and no Python code
  ran between fork and exec in this (jax-threaded) process: no fork warning was raised."""
  import jax  # pylint: disable=import-outside-toplevel
  jax.numpy.zeros(1).block_until_ready()  # a backend up: jax warns of a fork from here on
  out = run("  x = bytearray(2 << 30)\n  return a + b\n", memory_bytes=256 << 20)
  assert not out.passed and "MemoryError" in out.result
  assert not [w for w in recwarn if "fork" in str(w.message)]


def test_writing_outside_the_temporary_directory_fails(tmp_path):
  target = tmp_path / "escaped.txt"
  body = (f"  open({str(target)!r}, 'w').write('x')\n"
          "  return a + b\n")
  out = run(body)
  assert not out.passed and "sandbox" in out.result and not target.exists()
  low_level = (f"  import os\n  os.close(os.open({str(target)!r}, os.O_CREAT | os.O_WRONLY))\n"
               "  return a + b\n")
  assert not run(low_level).passed and not target.exists()
  keep = tmp_path / "keep.txt"
  keep.write_text("mine")
  assert not run(f"  import os\n  os.remove({str(keep)!r})\n  return a + b\n").passed
  assert keep.read_text() == "mine"


def test_writing_inside_the_temporary_directory_is_allowed():
  body = ("  open('scratch.txt', 'w').write('ok')\n"
          "  assert open('scratch.txt').read() == 'ok'\n  return a + b\n")
  assert run(body).passed


@pytest.mark.parametrize("body", [
    "  import socket\n  socket.socket()\n  return a + b\n",
    "  import subprocess\n  subprocess.run(['true'])\n  return a + b\n",
    "  import ctypes\n  ctypes.CDLL(None)\n  return a + b\n",
])
def test_sockets_processes_and_ctypes_are_refused(body):
  out = run(body)
  assert not out.passed and "sandbox" in out.result


def test_the_parent_is_untouched():
  """The hook lives in the child only: this process still opens sockets."""
  run("  return a + b\n")
  socket.socket().close()
  assert os.getcwd()


def test_completions_stop_at_the_next_top_level_block():
  assert code_exec.truncate_completion("  return 1\n\ndef other():\n  pass") == "  return 1\n"
  assert code_exec.truncate_completion("  return 1\n") == "  return 1\n"


def test_pass_at_k_matches_the_closed_form():
  for n in range(1, 8):
    for c in range(n + 1):
      for k in range(1, n + 1):
        closed = 1.0 - math.comb(n - c, k) / math.comb(n, k)
        assert code_exec.pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12)
  assert code_exec.pass_at_k(200, 3, 1) == pytest.approx(3 / 200)
  with pytest.raises(ValueError):
    code_exec.pass_at_k(3, 1, 4)


def test_samples_of_one_problem_are_counted_together():
  counts = code_exec.per_problem(["a", "a", "b", "b"], [True, False, False, False])
  assert counts == {"a": (2, 1), "b": (2, 0)}
  assert code_exec.mean_pass_at_k(list(counts.values()), 1) == pytest.approx(0.25)
  assert code_exec.mean_pass_at_k(list(counts.values()), 2) == pytest.approx(0.5)
  assert code_exec.ks_for(list(counts.values()), (1, 2, 10)) == [1, 2]


def test_check_samples_runs_each_pair():
  outs = code_exec.check_samples([PROBLEM, PROBLEM], ["  return a + b\n", "  return 0\n"],
                                 workers=2)
  assert [o.passed for o in outs] == [True, False]


def test_the_metrics_block_scores_both_sides_and_compares_them():
  problems = [dict(PROBLEM, task_id=f"p{i}") for i in range(4)]
  right, wrong = "  return a + b\n", "  return a\n"
  out = code_exec.block(problems, [right, right, wrong, wrong], [right, wrong, right, wrong])
  assert out["num_problems"] == 4 and out["autoregressive"] == {"pass_at_1": 0.5}
  assert out["speculative"] == {"pass_at_1": 0.5}
  lo, hi = out["autoregressive_interval95"]["pass_at_1"]
  assert lo <= 0.5 <= hi and out["speculative_within_interval"] is True
  assert code_exec.block(problems, None, [right] * 4)["autoregressive"] is None


def test_the_printed_note_carries_pass_at_1():
  from specdec_jax.metrics import report
  m = {"draft": "d", "temperature": 1.0, "gamma": 3, "quality": {"pass_at_k": {
      "autoregressive": {"pass_at_1": 0.25}, "speculative": {"pass_at_1": 0.3},
      "speculative_within_interval": True}}}
  assert "pass@1 0.300 (AR 0.250, inside its 95% CI)" in report.row_note(m, label=False)
