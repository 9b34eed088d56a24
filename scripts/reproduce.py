r"""Runs a suite of configs and prints the Leviathan et al. Table 2 / Table 3 analogues in one place.

  python scripts/reproduce.py --suite=local --output_root=runs/local      # the local zoo grid
  python scripts/reproduce.py --suite=paper --output_root=gs://.../paper  # on TPU (seqio + T5X)
  python scripts/reproduce.py --suite=local --only=table3 --gin.NUM_EXAMPLES=8

Each config runs into OUTPUT_ROOT/<name> exactly as `python -m specdec_jax.run` would run it (and
resumes there if killed); extra `--gin.NAME=VALUE` flags apply to every config. Already finished
configs are only re-read. At the end: one Table-2-style table (task, draft, temperature, gamma,
alpha, measured and predicted speedup, quality of autoregressive vs speculative output) and one
Table-3-style alpha table, with the paper's numbers beside the paper rows.
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


def _record(name: str, config: str, rows, bindings) -> None:
  """One record per row of a finished config (results as data: docs/results/)."""
  from specdec_jax.metrics import results  # pylint: disable=import-outside-toplevel
  command = " ".join(["python -m specdec_jax.run", f"--gin_file={config}",
                      *(f"--gin.{b.replace(' ', '')}" for b in bindings)])
  for m in rows:
    print("recorded", results.save_record(os.path.join(ROOT, "docs", "results"),
                                          results.row_name(name, m), m, command=command))


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
  args = p.parse_args(argv[1:])
  from specdec_jax import run
  tables = {}
  for part in [s.strip() for s in args.only.split(",") if s.strip()]:
    rows = []
    for config in SUITES[args.suite][part]:
      name = os.path.splitext(os.path.relpath(config, "configs"))[0].replace("/", "_")
      out = os.path.join(args.output_root, name)
      done = os.path.join(out, "metrics.json")
      if os.path.exists(done):
        with open(done) as f:
          metrics = json.load(f)
        print(f"{config}: already done ({out})")
      else:
        print(f"{config} -> {out}")
        metrics = run.run([config], out, args.gin_bindings)
      metrics = metrics if isinstance(metrics, list) else [metrics]
      if args.record:
        _record(name, config, metrics, args.gin_bindings)
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
