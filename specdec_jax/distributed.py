"""Multi-host plumbing: start-up from flags, each process's share of a batch, gather to process 0.

Why: on a TPU pod slice (v4-32 = 4 hosts) every host runs the same program on its own chips. The
mesh spans all of them (`sharding.make_mesh` orders devices process by process, so the data axis
crosses hosts), each process loads only the rows its devices hold, and process 0 writes results.
On CPU the same code runs as several local processes (`tests/sharding/test_multiprocess.py`).

Flags (absl, defined here so every entry point that imports this module gets them):
  --coordinator_address=host:port  --num_processes=N  --process_id=I  [--local_device_ids=0,1]
  --distributed=auto  (Cloud TPU / SLURM: let `jax.distributed.initialize()` detect everything)
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
from absl import flags

# jax is imported inside the functions: entry points import this module for its flags before
# parsing them, and a flag error should not wait for jax to load.

_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0's coordinator (multi-host runs).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes (hosts).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's id, 0..num_processes-1.")
_LOCAL_DEVICES = flags.DEFINE_list(
    "local_device_ids", None, "Devices this process drives (default: all it sees).")
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "off", ["off", "auto"],
    "'auto': jax.distributed.initialize() with cluster auto-detection (Cloud TPU, SLURM).")


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None,
               local_device_ids: Optional[Sequence[int]] = None, auto: bool = False) -> bool:
  """Calls `jax.distributed.initialize` when a multi-process run is asked for.

  Returns True if it initialised. Must run before anything touches a device. A single process
  with no coordinator is left alone, so the same binary runs on a laptop.
  """
  import jax  # pylint: disable=import-outside-toplevel
  if auto:
    jax.distributed.initialize()
    return True
  if coordinator_address is None and (num_processes or 1) <= 1:
    return False
  missing = [n for n, v in (("coordinator_address", coordinator_address),
                            ("num_processes", num_processes), ("process_id", process_id))
             if v is None]
  if missing:
    raise ValueError(f"a multi-process run needs --coordinator_address, --num_processes and "
                     f"--process_id; missing: {', '.join('--' + m for m in missing)}")
  if not 0 <= process_id < num_processes:
    raise ValueError(f"--process_id={process_id} must be in [0, {num_processes})")
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             local_device_ids=local_device_ids)
  return True


def initialize_from_flags() -> bool:
  """`initialize` from the absl flags above (call from an entry point's main)."""
  ids = _LOCAL_DEVICES.value
  return initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                    None if ids is None else [int(i) for i in ids],
                    auto=_DISTRIBUTED.value == "auto")


def process_index() -> int:
  import jax  # pylint: disable=import-outside-toplevel
  return jax.process_index()


def is_main_process() -> bool:
  import jax  # pylint: disable=import-outside-toplevel
  return jax.process_index() == 0


def local_rows(sharding, global_batch: int) -> slice:
  """The rows of a [global_batch, ...] array this process's devices hold under `sharding`.

  Each process loads only these (e.g. `examples[local_rows(...)]`) and builds the global array
  with `sharding.shard_batch(..., process_local=True)`. With the batch replicated over processes
  (no data axis across hosts) this is every row.
  """
  import jax  # pylint: disable=import-outside-toplevel
  idx = sharding.addressable_devices_indices_map((global_batch,))
  starts, stops = [], []
  for index in idx.values():
    s = index[0]
    starts.append(0 if s.start is None else s.start)
    stops.append(global_batch if s.stop is None else s.stop)
  lo, hi = min(starts), max(stops)
  covered = set()
  for a, b in zip(starts, stops):
    covered.update(range(a, b))
  if covered != set(range(lo, hi)):
    raise ValueError(f"process {jax.process_index()} holds non-contiguous rows of the batch; "
                     "order the mesh so each process's devices are adjacent on the data axis")
  return slice(lo, hi)


def gather(tree: Any) -> Any:
  """Global arrays -> full numpy arrays on every process (a collective: all must call it).

  Only process 0 should write them (`is_main_process()`). One process: a plain device_get.
  """
  import jax  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  if jax.process_count() == 1:
    return jax.tree.map(np.asarray, tree)
  return multihost_utils.process_allgather(tree, tiled=True)


def agree(obj: Any) -> Any:
  """Process 0's value of a JSON-able `obj`, on every process (a collective: all must call it).

  Why: decisions that depend on timings or on files only process 0 reads (repeat counts of a timed
  program, measured costs, which examples a resumed run has done) must be the same everywhere, or
  the processes run different programs and the job hangs. One process: `obj` itself.
  """
  import json  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  if jax.process_count() == 1:
    return obj
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  payload = np.frombuffer(json.dumps(obj).encode(), np.uint8).astype(np.int32)
  n = int(multihost_utils.broadcast_one_to_all(np.int32(len(payload))))
  buf = np.zeros(n, np.int32)
  if is_main_process():
    buf[:] = payload
  out = np.asarray(multihost_utils.broadcast_one_to_all(buf)).astype(np.uint8)
  return json.loads(out.tobytes().decode())
