r"""Compare two points of one finished run on the prompts both decoded (metrics/compare.py).

  python experiments/compare_points.py --run_dir=runs/tree              # lists the run's points
  python experiments/compare_points.py --run_dir=runs/tree --a=gamma=tree --b=gamma=4 \
      [--record=NAME --command="python -m specdec_jax.run ..."]   # docs/results/NAME.json

--b_run_dir takes b from another run (a point of the same name there, e.g. two GAMMA='tree' runs
with different trees), paired with a by the prompts both decoded (group and prompt indices); b's
key then gets the suffix ' (b run)'. The time ratio of two runs is not interleaved: it is a
measurement only when both ran on the same quiet machine.

--a / --b pick a point by a substring of its run key (exactly one must match). The tokens-per-call
ratio counts no time, so any machine gives it; the time-per-token ratio is a measurement only when
the run decoded both points interleaved on a quiet machine (the record keeps the load).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pick(keys, part: str) -> str:
  hits = [k for k in keys if k == part] or [k for k in keys if part in k]  # exact match first
  if len(hits) != 1:
    raise SystemExit(f"--a/--b {part!r} matches {len(hits)} of the run's points: {keys}")
  return hits[0]


def _read(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _with_b_run(batches: list[dict], other: list[dict]) -> list[dict]:
  """a's batch lines with the other run's points added, renamed '<key> (b run)', where both
  runs decoded the same prompts (group and indices)."""
  by_prompts = {(o["group"], tuple(o["indices"])): o for o in other}
  out = []
  for line in batches:
    o = by_prompts.get((line["group"], tuple(line["indices"])))
    if o is not None:
      extra = {f"{k} (b run)": v for k, v in o.get("points", {}).items()}
      out.append(dict(line, points={**line.get("points", {}), **extra}))
  return out


def main(argv=None) -> int:
  sys.path.insert(0, ROOT)
  from specdec_jax.metrics import compare, machine, results  # pylint: disable=import-outside-toplevel
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--run_dir", required=True)
  p.add_argument("--a")
  p.add_argument("--b")
  p.add_argument("--b_run_dir", help="take b from this run (paired by prompts)")
  p.add_argument("--record", help="write docs/results/RECORD.json")
  p.add_argument("--command", default="", help="the run's command, kept in the record")
  p.add_argument("--load", help="the run's load average 'l1,l5,l15' (default: as the runs "
                 "noted it in machine.json, else the current one)")
  p.add_argument("--commit", help="the commit the run ran at (default: HEAD)")
  args = p.parse_args(argv)
  path = os.path.join(args.run_dir, "batches.jsonl")
  if not os.path.exists(path):
    raise SystemExit(f"{path}: no such file (a finished or partial run directory is needed)")
  batches = _read(path)
  if args.b_run_dir:
    batches = _with_b_run(batches, _read(os.path.join(args.b_run_dir, "batches.jsonl")))
  keys = compare.point_keys(batches)
  if not (args.a and args.b):
    print("\n".join(keys))
    return 0
  out = compare.paired(batches, _pick(keys, args.a), _pick(keys, args.b))
  print(json.dumps(out, indent=1))
  if args.record:  # the machine and load as the run (and the b run) noted them
    segments = [s for d in (args.run_dir, args.b_run_dir) if d
                for s in machine.read_run(d) or []] or None
    path = results.save_record(os.path.join(ROOT, "docs", "results"), args.record,
                               dict(out, kind="comparison"), command=args.command,
                               commit=args.commit, load=args.load, run_segments=segments)
    print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
