r"""Record a roofline job's aot.json under docs/results and print its tables.

The paper's layout (T5-XXL and its draft each whole on one TPU v4 chip: a config without a mesh
is compiled on one chip) and the mesh file's (T5-XXL over 4 chips, the drafts over 2):

  python -m specdec_jax.aot --gin_file=configs/paper/gamma_sweep.gin --topology=v4-8 \
      --roofline --only=target_step,verify,draft_step --output_dir=/tmp/aot/roofline_one_chip
  python scripts/aot_roofline.py --name=roofline_tpu_v4_one_chip \
      --layout="paper: one TPU v4 chip" --command="..." /tmp/aot/roofline_one_chip/aot.json

  python -m specdec_jax.aot --gin_file=configs/paper/gamma_sweep.gin \
      --gin_file=configs/paper/mesh_tpu_v4_8.gin --topology=v4-8 --roofline \
      --only=target_step,verify,draft_step --output_dir=/tmp/aot/roofline_v4_8
  python scripts/aot_roofline.py --name=roofline_tpu_v4_mesh \
      --layout="configs/paper/mesh_tpu_v4_8.gin" --command="..." /tmp/aot/roofline_v4_8/aot.json
  python scripts/results.py tables      # docs/roofline_tpu_v4.md from the records

Several aot.json files of one slice and mesh may be given (the target's steps from one job, the
drafts' from another): their step objects are merged, later files winning. The record
(docs/results/NAME.json) holds the step objects verbatim (`metrics.aot`) and the layout's name;
the roofline is recomputed from them (`specdec_jax.aot.roofline`) whenever the tables are.
Without --name the tables are printed and nothing is written.

With --programs the record keeps every program of the job's aot.json instead (a job that
compiled decode programs, e.g. the Table-2 row's draft trees: docs/roofline_tpu_v4.md, "Trees"):

  python -m specdec_jax.aot --gin_file=configs/paper/trees/ende_t5_small_t0.gin \
      --gin_file=configs/paper/mesh_tpu_v4_8.gin --topology=v4-8 --only=spec_loop \
      --output_dir=/tmp/aot/trees_v4_8
  python scripts/aot_roofline.py --programs --name=aot_trees_tpu_v4_mesh \
      --layout="configs/paper/mesh_tpu_v4_8.gin" --command="..." /tmp/aot/trees_v4_8/aot.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from specdec_jax.aot import roofline  # noqa: E402  pylint: disable=wrong-import-position
from specdec_jax.aot import tree_roofline  # noqa: E402  pylint: disable=wrong-import-position
from specdec_jax.metrics import results  # noqa: E402  pylint: disable=wrong-import-position


def merged_steps(paths: list[str]) -> list[dict]:
  """The roofline steps of several jobs' aot.json, one per program name (later files win); an
  error if they mix slices or meshes."""
  steps: dict[str, dict] = {}
  for path in paths:
    with open(path, encoding="utf-8") as f:
      for rec in roofline.step_records(json.load(f)):
        steps[rec["program"]] = rec
  where = {(r["topology"], json.dumps(r["mesh"], sort_keys=True)) for r in steps.values()}
  if len(where) > 1:
    raise SystemExit(f"error: the files mix slices or meshes {sorted(where)}; a roofline needs one")
  return list(steps.values())


def all_programs(paths: list[str]) -> list[dict]:
  """Every object of several jobs' aot.json, one per program name (later files win)."""
  out: dict[str, dict] = {}
  for path in paths:
    with open(path, encoding="utf-8") as f:
      for rec in json.load(f):
        out[rec["program"]] = rec
  return list(out.values())


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("aot_json", nargs="+", help="aot.json of jobs run with --roofline")
  ap.add_argument("--layout", default="", help="the layout's name in the tables")
  ap.add_argument("--name", default="", help="write docs/results/NAME.json")
  ap.add_argument("--command", default="", help="the aot command(s) that wrote the files")
  ap.add_argument("--commit", default=None, help="the commit the jobs ran at (default: HEAD)")
  ap.add_argument("--load", default="", help="1,5,15-minute load average while they ran")
  ap.add_argument("--programs", action="store_true",
                  help="record every program of the files (decode programs), not the steps")
  args = ap.parse_args(argv)
  steps = all_programs(args.aot_json) if args.programs else merged_steps(args.aot_json)
  if not steps:
    raise SystemExit("error: no roofline steps in the files (run the aot job with --roofline)")
  layout = args.layout or f"{steps[0]['topology']}, mesh {steps[0]['mesh']}"
  rec = {"metrics": {"layout": layout, "aot": steps}}
  if args.programs:
    print(tree_roofline.compiled_trees_table([rec]))
  else:
    print(roofline.markdown(roofline.layout_of_record(rec), steps))
  if not args.name:
    return 0
  path = results.save_record(os.path.join(ROOT, "docs", "results"), args.name, rec["metrics"],
                             command=args.command, commit=args.commit, load=args.load)
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
