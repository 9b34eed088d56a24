"""`python -m specdec_jax.run` on a mesh gives the unsharded run's tokens (issue 3, checks 1 and 4).

Why at the entry point: the sharded programs are tested on their own (test_equivalence.py), but a
run adds what they do not cover: a short last batch padded to the data axis, the donated-state
programs timed over several repeats, results gathered before they are written, and, with two
processes, only process 0 writing while both run every collective (timing-dependent choices
agreed). `smoke_sharded.gin` is smoke.gin on the (data 2, outer 2, inner 2) mesh with the draft on
2 of the 8 devices.
"""
import json
import os
import socket
import subprocess
import sys

import pytest

from specdec_jax.testing import run_in_process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# 7 examples in batches of 4: the last batch (3 rows) is padded to the data axis (2).
COMMON = ["--gin.NUM_EXAMPLES=7", "--gin.RunConfig.repeats=2"]


def _run(gin_file: str, out: str, *extra: str) -> dict:
  run_in_process(f"--gin_file={gin_file}", f"--output_dir={out}", *COMMON, *extra)
  return _predictions(out)


def _predictions(out: str) -> dict:
  with open(os.path.join(out, "predictions.jsonl")) as f:
    lines = [json.loads(line) for line in f]
  # benchmark mode: one line per (run, example) with the speculative and the autoregressive ids
  return {(p["run"], p["index"]): (p["output_ids"], p["autoregressive_output_ids"]) for p in lines}


@pytest.mark.parametrize("temperature", ["0.0", pytest.param("1.0", marks=pytest.mark.slow)])
def test_sharded_run_equals_unsharded_run(tmp_path, temperature):
  t = f"--gin.TEMPERATURE={temperature}"
  plain = _run("configs/local/smoke.gin", str(tmp_path / "plain"), t)
  sharded = _run("configs/local/smoke_sharded.gin", str(tmp_path / "sharded"), t)
  assert len(plain) == 7
  assert sharded == plain
  with open(tmp_path / "sharded" / "metrics.json") as f:
    metrics = json.load(f)
  assert metrics["num_examples"] == 7


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_run_writes_once_on_process_0(tmp_path):
  """Two local processes (4 forced CPU devices each) run smoke_sharded.gin over one global mesh."""
  plain = _run("configs/local/smoke.gin", str(tmp_path / "plain"))
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  env["JAX_PLATFORMS"] = "cpu"
  procs = []
  for i in range(2):
    cmd = [sys.executable, "-m", "specdec_jax.run", "--gin_file=configs/local/smoke_sharded.gin",
           f"--output_dir={tmp_path / f'p{i}'}", "--gin.MeshConfig.num_cpu_devices=4",
           f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}",
           *COMMON]
    procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True))
  try:
    for p in procs:
      out, _ = p.communicate(timeout=900)
      assert p.returncode == 0, out[-4000:]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert _predictions(str(tmp_path / "p0")) == plain
  assert not os.path.exists(tmp_path / "p1" / "predictions.jsonl")
  assert not os.path.exists(tmp_path / "p1" / "metrics.json")
