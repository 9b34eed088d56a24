"""Two local processes decode one batch over one global mesh (issue 3, check 4).

Why: a TPU pod slice is several hosts running the same program; bugs there (a key on one local
device, a batch loaded whole on every host, a result read from non-addressable shards) do not
show on one process. Two CPU processes with 4 forced devices each reproduce that on a laptop:
`jax.distributed.initialize` on localhost, process-local rows, results gathered to every process
(process 0 is the one that would write). Both must print the unsharded reference's tokens.
"""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiprocess_worker.py")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_decode_the_same_tokens(runs):
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  procs = [subprocess.Popen([sys.executable, WORKER, str(port), str(i), "2", "0.0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
           for i in range(2)]
  outs = []
  try:
    for p in procs:
      stdout, stderr = p.communicate(timeout=600)
      assert p.returncode == 0, stderr[-3000:]
      outs.append(json.loads(stdout.strip().splitlines()[-1]))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert [o["process"] for o in outs] == [0, 1]
  assert [o["main"] for o in outs] == [True, False]
  assert [o["rows"] for o in outs] == [[0, 4], [4, 8]]  # each loaded only its half
  ref = runs.reference(0.0)
  for o in outs:
    np.testing.assert_array_equal(np.asarray(o["tokens"]), ref.tokens_BxN)
    np.testing.assert_array_equal(np.asarray(o["lengths"]), ref.lengths_B)
