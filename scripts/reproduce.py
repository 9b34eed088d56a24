r"""Runs a suite of configs and prints the Leviathan et al. Table 2 / Table 3 analogues in one place.

  python scripts/reproduce.py --suite=local --output_root=runs/local      # the local zoo grid
  python scripts/reproduce.py --suite=paper --output_root=gs://.../paper  # on TPU (seqio + T5X)
  python scripts/reproduce.py --suite=local --only=table3 --gin.NUM_EXAMPLES=8

Each config runs into OUTPUT_ROOT/<name> exactly as `python -m specdec_jax.run` would run it (and
resumes there if killed); extra `--gin.NAME=VALUE` flags apply to every config. Already finished
configs are only re-read. With `--processes=N` (3 by default when recording) each config runs in N
fresh processes (OUTPUT_ROOT/<name>/process<k>: fresh compiles, autoregressive and speculative
interleaved within each), and each row reported or recorded is the median process's, carrying
every process's figures under `between_runs`: a within-run bootstrap interval covers prompt
sampling only, and the same command has moved 1.00-1.16x between processes on one machine.
At the end: one Table-2-style table (task, draft, temperature, gamma, alpha, measured and
predicted speedup, quality of autoregressive vs speculative output) and one Table-3-style alpha
table, with the paper's numbers beside the paper rows.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SUITES = {
    "local": {"table2": ["configs/local/table2_ende.gin", "configs/local/table2_summarize.gin",
                         "configs/local/table2_code.gin"],
              "table3": ["configs/local/table3_ende.gin", "configs/local/table3_summarize.gin",
                         "configs/local/table3_code.gin"],
              "sweep": ["configs/local/gamma_sweep.gin"]},
    "paper": {"table2": sorted(os.path.relpath(p, ROOT) for p in
                               glob.glob(os.path.join(ROOT, "configs/paper/table2/*.gin"))),
              "table3": ["configs/paper/table3/ende.gin", "configs/paper/table3/cnndm.gin"],
              "sweep": ["configs/paper/gamma_sweep.gin"]},
}
# Leviathan et al. Table 2: (task, draft size, temperature) -> (gamma, alpha, speedup).
PAPER_TABLE2 = {
    ("ende", "small", 0): (7, 0.75, 3.4), ("ende", "base", 0): (7, 0.80, 2.8),
    ("ende", "large", 0): (7, 0.82, 1.7), ("ende", "small", 1): (7, 0.62, 2.6),
    ("ende", "base", 1): (5, 0.68, 2.4), ("ende", "large", 1): (3, 0.71, 1.4),
    ("cnndm", "small", 0): (5, 0.65, 3.1), ("cnndm", "base", 0): (5, 0.73, 3.0),
    ("cnndm", "large", 0): (3, 0.74, 2.2), ("cnndm", "small", 1): (5, 0.53, 2.3),
    ("cnndm", "base", 1): (3, 0.55, 2.2), ("cnndm", "large", 1): (3, 0.56, 1.7),
}


def _paper_key(m):
  task = {"wmt_t2t_ende_v003": "ende", "cnn_dailymail": "cnndm"}.get(m["task"])
  size = next((s for s in ("small", "base", "large") if s in str(m["draft"])), None)
  return (task, size, int(m["temperature"])) if task and size else None


def _f(x, spec=".2f"):
  return "-" if x is None else format(x, spec)


def table2(rows) -> str:
  from specdec_jax.metrics import quality
  head = ("task", "draft", "T", "gamma", "alpha", "speedup", "predicted", "quality AR",
          "quality spec", "match", "paper (gamma, alpha, speedup)")
  out = [head]
  for m in rows:
    q = m.get("quality") or {}
    paper = PAPER_TABLE2.get(_paper_key(m))
    out.append((m["task"], str(m["draft"]), f"{m['temperature']:g}",
                f"{m['gamma']}{' (auto)' if m.get('gamma_auto') else ''}", _f(m["alpha"]),
                _f(m["speedup"]), _f(m["speedup_predicted"]),
                _f(quality.headline(q.get("metric"), q.get("autoregressive"))),
                _f(quality.headline(q.get("metric"), q.get("speculative"))),
                _f(m.get("greedy_match_rate")),
                f"{paper[0]}, {paper[1]:.2f}, {paper[2]}x" if paper else ""))
  return _fmt(out)


def table3(rows) -> str:
  by = {}
  for m in rows:
    by.setdefault((m["task"], m["draft"]), {})[m["temperature"]] = m["alpha"]
  out = [("task", "draft", "alpha T=0", "alpha T=1")]
  for (task, draft), a in by.items():
    out.append((task, str(draft), _f(a.get(0.0), ".3f"), _f(a.get(1.0), ".3f")))
  return _fmt(out)


def _fmt(lines) -> str:
  widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
  return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines)


def _record(name: str, config: str, rows, bindings, dirs) -> None:
  """One record per row of a finished config (results as data: docs/results/), its machine and
  load as its processes (`dirs`) noted them while they ran."""
  from specdec_jax.metrics import machine, results  # pylint: disable=import-outside-toplevel
  command = " ".join(["python -m specdec_jax.run", f"--gin_file={config}",
                      *(f"--gin.{b.replace(' ', '')}" for b in bindings)])
  segments = [s for d in dirs for s in machine.read_run(d) or []] or None
  for m in rows:
    print("recorded", results.save_record(os.path.join(ROOT, "docs", "results"),
                                          results.row_name(name, m), m, command=command,
                                          run_segments=segments))


def _process_dirs(out: str, processes: int) -> list[str]:
  """Where each of a config's processes writes."""
  return [out] if processes == 1 else [os.path.join(out, f"process{k + 1}")
                                       for k in range(processes)]


def _speedup(m) -> float:
  """A process's speedup; 1.0 where 'auto' chose plain decoding (it timed the baseline only)."""
  return 1.0 if m.get("speedup") is None else float(m["speedup"])


def median_rows(processes: list[list[dict]]) -> list[dict]:
  """Row by row (processes run one config, so their rows align), the median process's row with
  `between_runs`: each process's speedup, interval, gamma and ms per token, and their range."""
  out = []
  for rows in zip(*processes):
    order = sorted(range(len(rows)), key=lambda k: _speedup(rows[k]))
    median = dict(rows[order[(len(rows) - 1) // 2]])
    median["between_runs"] = {
        "processes": len(rows),
        "median_process": order[(len(rows) - 1) // 2] + 1,
        "speedup": [r.get("speedup") for r in rows],
        "speedup_interval95": [r.get("speedup_interval95") for r in rows],
        "gamma": [r.get("gamma") for r in rows],
        "spec_ms_per_token": [r.get("spec_ms_per_token") for r in rows],
        "speedup_range": [min(map(_speedup, rows)), max(map(_speedup, rows))]}
    out.append(median)
  return out


def _run_config(config: str, out: str, bindings, processes: int) -> list[dict]:
  """The config's rows: one process in `out`, or the median of `processes` fresh ones."""
  import subprocess  # pylint: disable=import-outside-toplevel
  runs = []
  for k, d in enumerate(_process_dirs(out, processes)):
    done = os.path.join(d, "metrics.json")
    if os.path.exists(done):
      print(f"{config}: already done ({d})")
    elif processes == 1:
      from specdec_jax import run  # pylint: disable=import-outside-toplevel
      print(f"{config} -> {d}")
      run.run([config], d, bindings)
    else:
      print(f"{config} -> {d} (process {k + 1} of {processes})")
      subprocess.run([sys.executable, "-m", "specdec_jax.run", f"--gin_file={config}",
                      f"--output_dir={d}", *(f"--gin.{b}" for b in bindings)], check=True,
                     cwd=ROOT)
    with open(done) as f:
      metrics = json.load(f)
    runs.append(metrics if isinstance(metrics, list) else [metrics])
  return runs[0] if processes == 1 else median_rows(runs)


def main(argv=None) -> dict:
  from specdec_jax import gin_utils
  argv = gin_utils.rewrite_gin_args(list(sys.argv if argv is None else argv))
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--suite", choices=sorted(SUITES), default="local")
  p.add_argument("--only", default="table2,table3,sweep")
  p.add_argument("--output_root", required=True)
  p.add_argument("--gin_bindings", action="append", default=[])
  p.add_argument("--record", action="store_true",
                 help="write every row as a record under docs/results/ (<config>_<draft>_t<T>_g"
                      "<gamma>.json; `python scripts/results.py tables` then renders the docs)")
  p.add_argument("--processes", type=int, default=None,
                 help="fresh processes per config, the median reported (default: 3 with "
                      "--record, else 1)")
  args = p.parse_args(argv[1:])
  processes = args.processes if args.processes is not None else (3 if args.record else 1)
  if processes < 1 or (args.record and processes < 3):
    p.error(f"--processes must be >= 1, and >= 3 with --record (a headline is the median of "
            f"several processes), got {processes}")
  tables = {}
  for part in [s.strip() for s in args.only.split(",") if s.strip()]:
    rows = []
    for config in SUITES[args.suite][part]:
      name = os.path.splitext(os.path.relpath(config, "configs"))[0].replace("/", "_")
      out = os.path.join(args.output_root, name)
      metrics = _run_config(config, out, args.gin_bindings, processes)
      if args.record:
        _record(name, config, metrics, args.gin_bindings, _process_dirs(out, processes))
      rows.extend(metrics)
    tables[part] = rows
  if tables.get("table2"):
    print("\nTable 2 analogue (speedup = autoregressive wall time / speculative, same process)")
    print(table2(tables["table2"]))
  if tables.get("table3"):
    print("\nTable 3 analogue (alpha = mean over generated positions of sum_x min(p, q))")
    print(table3(tables["table3"]))
  if tables.get("sweep"):
    print("\nGamma sweep: plots under " + os.path.join(args.output_root, "*gamma_sweep*/plots"))
    print(table2(tables["sweep"]))
  print(f"\nTensorBoard: tensorboard --logdir {args.output_root}")
  return tables


if __name__ == "__main__":
  main()
