"""aot.json and the printed table: one object / one row per compiled program.

Why a fixed record: CI and the mesh files' comments quote these figures, so every program reports
the same fields (`program, topology, num_chips, mesh, per_chip_bytes {arguments, outputs,
temporaries, total}, hbm_bytes_per_chip, fits, flops, bytes_accessed, host_transfers_in_loop,
compile_seconds`), plus what explains a failure (needed and available bytes, the transfers found).
"""
from __future__ import annotations

import json
import os

GiB = 2 ** 30


def records(job, config_files=()) -> list[dict]:
  out = []
  for r in job.results:
    rec = dict(program=r.program, topology=job.topology.name,
               topology_name=job.topology.topology_name, num_chips=job.topology.num_chips,
               mesh=job.mesh_shape, per_chip_bytes=r.per_chip_bytes or None,
               hbm_bytes_per_chip=job.hbm_bytes_per_chip, fits=r.fits, flops=r.flops,
               bytes_accessed=r.bytes_accessed, xla_optimal_seconds=r.optimal_seconds,
               # None: not compiled (or out of memory), so nothing to inspect
               host_transfers_in_loop=len(r.host_transfers) if r.per_chip_bytes else None,
               compile_seconds=r.compile_seconds, kind=r.kind, config=list(config_files),
               models=job.models, **r.info)
    if r.fits is False:
      rec["needed_bytes"] = r.needed_bytes
      rec["available_bytes"] = r.available_bytes
    if r.host_transfers:
      rec["host_transfers"] = r.host_transfers[:20]
    if r.error:
      rec["error"] = r.error
    out.append(rec)
  return out


def write(output_dir: str, recs: list[dict], roofline=None) -> str:
  """aot.json, and with `roofline` (a `roofline.Layout`) its roofline.json."""
  os.makedirs(output_dir, exist_ok=True)
  path = os.path.join(output_dir, "aot.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(recs, f, indent=1)
  if roofline is not None:
    with open(os.path.join(output_dir, "roofline.json"), "w", encoding="utf-8") as f:
      json.dump(roofline.to_json(), f, indent=1)
  return path


def _gib(x) -> str:
  return "-" if x is None else f"{x / GiB:.2f}"


def table(job) -> str:
  """Per program: per-chip GiB (arguments, outputs, temporaries, total), fits, host transfers."""
  head = ("program", "args", "outs", "temps", "total", "HBM", "fits", "host xfers", "compile s")
  rows = []
  for r in job.results:
    b = r.per_chip_bytes or {}
    total = b.get("total", r.needed_bytes)
    fits = {True: "yes", False: "NO", None: "-"}[r.fits]
    rows.append((r.program, _gib(b.get("arguments")), _gib(b.get("outputs")),
                 _gib(b.get("temporaries")), _gib(total), _gib(job.hbm_bytes_per_chip), fits,
                 "-" if not b else str(len(r.host_transfers)),
                 "-" if r.compile_seconds is None else f"{r.compile_seconds:.1f}"))
  widths = [max(len(str(x[i])) for x in [head] + rows) for i in range(len(head))]
  fmt = lambda row: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(row, widths)))
  lines = [f"{job.topology.name} ({job.topology.num_chips} chips), mesh {job.mesh_shape}; "
           "bytes per chip in GiB", fmt(head)] + [fmt(r) for r in rows]
  return "\n".join(lines)


def failure_lines(job) -> list[str]:
  """One line per failing program: which, needed and available bytes, or the transfers."""
  out = []
  for r in job.failures:
    if r.fits is False:
      what = f" [{r.error}]" if r.error else ""
      out.append(f"{r.program} does not fit on {job.topology.name}: needs "
                 f"{_gib(r.needed_bytes)} GiB per chip{what}, {_gib(r.available_bytes)} GiB "
                 f"available ({r.needed_bytes} > {r.available_bytes} bytes)")
    elif r.host_transfers:
      out.append(f"{r.program}: {len(r.host_transfers)} host transfer(s) inside the loop, e.g. "
                 f"{r.host_transfers[0]}")
    elif r.error:
      out.append(f"{r.program}: {r.error}")
  return out
