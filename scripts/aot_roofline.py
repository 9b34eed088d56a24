r"""The roofline table (docs/roofline_tpu_v4.md) from the aot.json of roofline jobs.

  python -m specdec_jax.aot --gin_file=configs/paper/gamma_sweep.gin \
      --gin_file=configs/paper/mesh_tpu_v4_8.gin --topology=v4-8 --roofline \
      --only=target_step,verify,draft_step --output_dir=/tmp/aot/roofline_v4_8
  python scripts/aot_roofline.py /tmp/aot/roofline_v4_8/aot.json

Several aot.json files of the same slice and mesh may be given (e.g. the target's steps from a
Table-2 row's job and the drafts' steps from another): their step records are merged, later files
winning. Prints c, v(T) and, for each Table-2 row whose draft was compiled, the predicted speedup
at the paper's alpha beside the paper's measured one: once with each step charged XLA's bytes
accessed (cost_analysis), once with only its arguments (weights and caches read once).
"""
from __future__ import annotations

import json
import sys

from specdec_jax.aot import roofline, topologies


def main(paths: list[str]) -> int:
  if not paths:
    print(__doc__, file=sys.stderr)
    return 2
  records, meshes, topos = {}, set(), set()
  for path in paths:
    with open(path, encoding="utf-8") as f:
      for rec in json.load(f):
        if rec.get("kind") in (roofline.TARGET_STEP, roofline.VERIFY, roofline.DRAFT_STEP):
          records[rec["program"]] = rec
          meshes.add(json.dumps(rec["mesh"], sort_keys=True))
          topos.add(rec["topology"])
  if len(meshes) != 1 or len(topos) != 1:
    print(f"error: the files mix slices {sorted(topos)} or meshes {sorted(meshes)}; a roofline "
          "needs one", file=sys.stderr)
    return 2
  topo = topologies.parse(topos.pop())
  where = f"{topo.name}, mesh {json.loads(meshes.pop())}"
  for basis in roofline.BASES:
    roof = roofline.from_records(list(records.values()), topo.chip, basis)
    if roof is None:
      print("error: no target_step[T=1] record (run the job with --roofline)", file=sys.stderr)
      return 2
    print(roofline.markdown(roof, where) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
