r"""Compare two points of one finished run on the prompts both decoded (metrics/compare.py).

  python scripts/compare_points.py --run_dir=runs/tree              # lists the run's points
  python scripts/compare_points.py --run_dir=runs/tree --a=gamma=tree --b=gamma=4 \
      [--record=NAME --command="python -m specdec_jax.run ..."]   # docs/results/NAME.json

--a / --b pick a point by a substring of its run key (exactly one must match). The tokens-per-call
ratio counts no time, so any machine gives it; the time-per-token ratio is a measurement only when
the run decoded both points interleaved on a quiet machine (the record keeps the load).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pick(keys, part: str) -> str:
  hits = [k for k in keys if part in k]
  if len(hits) != 1:
    raise SystemExit(f"--a/--b {part!r} matches {len(hits)} of the run's points: {keys}")
  return hits[0]


def main(argv=None) -> int:
  sys.path.insert(0, ROOT)
  from specdec_jax.metrics import compare, results  # pylint: disable=import-outside-toplevel
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--run_dir", required=True)
  p.add_argument("--a")
  p.add_argument("--b")
  p.add_argument("--record", help="write docs/results/RECORD.json")
  p.add_argument("--command", default="", help="the run's command, kept in the record")
  p.add_argument("--load", help="the run's load average 'l1,l5,l15' (default: the current one)")
  args = p.parse_args(argv)
  path = os.path.join(args.run_dir, "batches.jsonl")
  if not os.path.exists(path):
    raise SystemExit(f"{path}: no such file (a finished or partial run directory is needed)")
  with open(path) as f:
    batches = [json.loads(line) for line in f if line.strip()]
  keys = compare.point_keys(batches)
  if not (args.a and args.b):
    print("\n".join(keys))
    return 0
  out = compare.paired(batches, _pick(keys, args.a), _pick(keys, args.b))
  print(json.dumps(out, indent=1))
  if args.record:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()
    rec = results.make_record(args.record, dict(out, kind="comparison"), command=args.command,
                              commit=commit, date=time.strftime("%Y-%m-%d"),
                              machine=results.machine(),
                              load_average=[float(x) for x in args.load.split(",")]
                              if args.load else os.getloadavg())
    print(f"wrote {results.write_record(os.path.join(ROOT, 'docs', 'results'), rec)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
