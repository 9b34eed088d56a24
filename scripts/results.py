r"""Results as data: record a finished run's rows, and regenerate the docs' tables from records.

  python scripts/results.py record --run_dir=runs/default --name=main_ende_t0 \
      --command="python -m specdec_jax.run --gin_file=configs/local/default.gin ..."
  python scripts/results.py tables            # rewrite the generated tables in the docs
  python scripts/results.py tables --check    # exit 1 if a doc's table differs from its records
                                              # (or docs/ holds a table outside the markers)

Records live in docs/results/<name>.json (committed, small); a table in README.md, DESIGN.md,
MODEL_CARD.md or docs/*.md is the block between `<!-- results:KIND name ... -->` and
`<!-- /results:KIND -->` (specdec_jax/metrics/results.py renders them).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = os.path.join(ROOT, "docs", "results")
DOCS = ["README.md", "DESIGN.md", "MODEL_CARD.md"]


def record(args) -> None:
  sys.path.insert(0, ROOT)
  from specdec_jax.metrics import machine, results  # pylint: disable=import-outside-toplevel
  with open(os.path.join(args.run_dir, "metrics.json")) as f:
    metrics = json.load(f)
  rows = metrics if isinstance(metrics, list) else [metrics]
  if len(rows) != 1 and not args.row:
    raise SystemExit(f"{args.run_dir} holds {len(rows)} rows: choose one with --row=RUN_KEY")
  row = next((m for m in rows if not args.row or m.get("run") == args.row), None)
  if row is None:
    raise SystemExit(f"no row {args.row!r} in {args.run_dir}/metrics.json")
  try:
    path = results.save_record(RECORDS, args.name, row, command=args.command, commit=args.commit,
                               load=args.load or None, run_segments=machine.read_run(args.run_dir))
  except ValueError as e:
    raise SystemExit(f"{args.run_dir}: {e}") from None
  print(f"wrote {path}")


def tables(args) -> int:
  sys.path.insert(0, ROOT)
  from specdec_jax.aot import tables as aot_tables  # pylint: disable=import-outside-toplevel
  from specdec_jax.metrics import results  # pylint: disable=import-outside-toplevel
  records = results.load_records(RECORDS)
  docs = DOCS + [os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                 if f.endswith(".md")]
  stale, typed = [], []
  for doc in docs:
    path = os.path.join(ROOT, doc)
    with open(path) as f:
      text = f.read()
    new = results.render(text, records, aot_tables.TABLES)
    if new != text:
      stale.append(doc)
      if not args.check:
        with open(path, "w") as f:
          f.write(new)
    # docs/ holds results only: a table there is generated, never typed (README.md, DESIGN.md
    # and MODEL_CARD.md may describe shapes and settings in tables of their own).
    lines = results.typed_table_lines(new) if doc.startswith("docs" + os.sep) else []
    if lines:
      typed.append(doc)
      print(f"{doc}: a table typed by hand (lines {lines[0]}-{lines[-1]}): generate it from "
            "records")
  verb = "differ from their records" if args.check else "rewritten"
  print(f"{len(stale)} doc(s) {verb}: {stale}" if stale else "every generated table is current")
  return 1 if ((stale and args.check) or typed) else 0


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = ap.add_subparsers(dest="cmd", required=True)
  r = sub.add_parser("record", help="write docs/results/NAME.json from a finished run")
  r.add_argument("--run_dir", required=True)
  r.add_argument("--name", required=True)
  r.add_argument("--command", required=True, help="the command that produced the run")
  r.add_argument("--row", default="", help="the run key of the row, for a sweep")
  r.add_argument("--load", default="", help="1,5,15-minute load average while it ran "
                 "(default: as the run noted it finishing in RUN_DIR/machine.json, else now)")
  r.add_argument("--commit", default=None, help="the commit the run ran at (default: HEAD)")
  t = sub.add_parser("tables", help="regenerate the docs' tables from docs/results")
  t.add_argument("--check", action="store_true", help="only check; exit 1 if any differs")
  args = ap.parse_args(argv)
  if args.cmd == "record":
    record(args)
    return 0
  return tables(args)


if __name__ == "__main__":
  sys.exit(main())
