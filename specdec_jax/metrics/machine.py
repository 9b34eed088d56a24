"""What a measurement ran on: the machine's identity (CPU model, cores, caches, a measured memory
read bandwidth, versions) and, for a run, when and under what load it ran (`OUTPUT_DIR/machine.json`).

Why a run writes its own: a record used to measure the machine when it was made (`scripts/results.py
record`, after the run), so a record made while a background job ran read a low bandwidth and the
load of that moment, not the run's. The run now notes the machine when it starts decoding and the
load when it finishes (one segment per process: a resumed run adds one), and the record takes
them from there; a record of a run that wrote none measures now and says so (`measured`).
"""
from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Mapping, Sequence
from typing import Any

MACHINE_FILE = "machine.json"


def machine() -> dict[str, Any]:
  """What a record was measured on: the CPU model, cores, cache sizes, a measured memory read
  bandwidth, the Python, jax and jaxlib versions.

  Why more than the CPU model: two machines of one name differed 1.6-1.8x against 2.6x in one
  table (issue 46); the caches and the bandwidth say whether a ~20 MB model fits on chip and what
  a weight-streaming step can cost, and the versions what compiled it."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  out = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
         "caches": _caches(), "memory_read_gb_s": round(memory_read_gb_s(), 1)}
  for package in ("jax", "jaxlib"):
    try:
      from importlib import metadata  # pylint: disable=import-outside-toplevel
      out[package] = metadata.version(package)
    except Exception:  # pylint: disable=broad-except
      pass
  return out


def _caches() -> dict[str, str]:
  """{'L1d': '48K', 'L2': '2048K', 'L3': '32768K'} of cpu0 (sysfs); {} where unreadable."""
  out = {}
  root = "/sys/devices/system/cpu/cpu0/cache"
  for index in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    try:
      read = lambda name: open(os.path.join(root, index, name)).read().strip()  # noqa: E731
      kind = read("type")
      out[f"L{read('level')}" + ({"Data": "d", "Instruction": "i"}.get(kind, ""))] = read("size")
    except OSError:
      continue
  return out


def memory_read_gb_s(mbytes: int = 256, repeats: int = 3) -> float:
  """GB/s of numpy summing a float32 array far larger than the caches (best of `repeats`; one
  thread): the record's machine identity, not a roofline (scripts/bench_loop.py times XLA's)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  x = np.ones(mbytes * 2 ** 20 // 4, np.float32)
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    x.sum()
    best = min(best, time.perf_counter() - t0)
  return x.nbytes / best / 1e9


def _load() -> list[float]:
  return [round(x, 2) for x in os.getloadavg()]


def note_run_start(output_dir: str, fresh: bool = False) -> None:
  """Appends a segment to `output_dir/machine.json`: the machine, the time and the load now.
  fresh: the run starts over (nothing of an earlier run in the directory is kept), so the
  earlier segments go too."""
  path = os.path.join(output_dir, MACHINE_FILE)
  segments = [] if fresh else (read_run(output_dir) or [])
  segments.append({"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(),
                   "load_start": _load()})
  _write(path, segments)


def note_run_end(output_dir: str) -> None:
  """Sets the last segment's `load_end` (1, 5 and 15 minute load averages as the run finishes:
  what a record reports) and its end time."""
  segments = read_run(output_dir)
  if not segments:
    return
  segments[-1].update(ended=time.strftime("%Y-%m-%dT%H:%M:%S"), load_end=_load())
  _write(os.path.join(output_dir, MACHINE_FILE), segments)


def read_run(output_dir: str) -> list[dict] | None:
  """The segments a run noted (oldest first), or None when it wrote no machine.json."""
  path = os.path.join(output_dir, MACHINE_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)["segments"]


def for_record(segments: Sequence[Mapping[str, Any]] | None
               ) -> tuple[dict[str, Any], list[float] | None]:
  """(the record's machine, the run's load average or None) from a run's segments: the last
  segment's machine and its end load (its start load if it never finished), `measured` saying
  where they come from. Without segments the machine is measured now. A run whose segments name
  two machines (CPU model, cores or caches: `_identity`) is refused: its figures mix machines."""
  if not segments:
    return dict(machine(), measured="when recorded (the run noted none)"), None
  hosts = sorted({_identity(s["machine"]) for s in segments})
  if len(hosts) > 1:
    raise ValueError(f"the run ran on {len(hosts)} machines ({'; '.join(hosts)}): one record "
                     "holds one machine's figures")
  last = segments[-1]
  where = f"at the run's start ({last['started']}"
  if len(segments) > 1:
    probes = [s["machine"].get("memory_read_gb_s") for s in segments]
    where += f", {len(segments)} segments, read probe {min(probes)}-{max(probes)} GB/s"
  return dict(last["machine"], measured=where + ")"), last.get("load_end") or last["load_start"]


def _identity(m: Mapping[str, Any]) -> str:
  """What tells two machines apart in a record (not the measured bandwidth, which varies)."""
  caches = ", ".join(f"{k} {v}" for k, v in sorted((m.get("caches") or {}).items()))
  return f"{m.get('cpu')}, {m.get('cores')} cores" + (f", {caches}" if caches else "")


def _write(path: str, segments: list) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump({"segments": segments}, f, indent=1)
    f.write("\n")
  os.replace(tmp, path)
