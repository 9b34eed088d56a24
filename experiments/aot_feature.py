r"""Record an AOT job of a feature-level draft under docs/results, with its roofline c.

The job (configs/paper/feature/ende_t5_xxl_feature_t0.gin on the v4-8 mesh file):

  ALLOW_MULTIPLE_LIBTPU_LOAD=1 python -m specdec_jax.aot \
      --gin_file=configs/paper/feature/ende_t5_xxl_feature_t0.gin \
      --gin_file=configs/paper/mesh_tpu_v4_8.gin --topology=v4-8 \
      --only=spec_prefill,spec_loop --output_dir=/tmp/aot/feature_v4_8
  python experiments/aot_feature.py --name=aot_feature_t5_xxl_v4_8 --command="..." \
      /tmp/aot/feature_v4_8/aot.json
  python scripts/results.py tables      # docs/aot_results.md's table from the records

The record keeps the job's programs verbatim (`metrics.aot`), the draft's config and the
roofline's c (`aot.feature_roofline.c_table`): the draft's step and its per-iteration fusion
beside the token drafts of the recorded mesh layout (docs/results/roofline_tpu_v4_mesh.json),
its chips taken from the job's mesh (the target over model_outer x model_inner, the drafts over
model_inner). The draft is `FeatureDraftConfig.for_target` of the target preset (what the
builder compiled for the gin's FEATURE preset).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# pylint: disable=wrong-import-position
from specdec_jax.aot import feature_roofline, roofline  # noqa: E402
from specdec_jax.metrics import results  # noqa: E402
from specdec_jax.models.model_config import get_preset  # noqa: E402
from specdec_jax.models.feature_draft_config import FeatureDraftConfig  # noqa: E402

LAYOUT_RECORD = "roofline_tpu_v4_mesh"


def metrics_of(programs: list[dict], target_preset: str, dtype: str, layout_name: str) -> dict:
  """The record's metrics: the programs, the draft's config and c on the job's mesh."""
  drafts = sorted({p["draft"] for p in programs if "draft" in p})
  if len(drafts) != 1:
    raise SystemExit(f"error: one feature draft per record, the job has {drafts}")
  mesh = programs[0]["mesh"]
  with open(os.path.join(ROOT, "docs", "results", f"{LAYOUT_RECORD}.json")) as f:
    layout = roofline.layout_of_record(json.load(f))
  layout = feature_roofline.layout_for_mesh(
      layout, layout_name, mesh["model_outer"] * mesh["model_inner"], mesh["model_inner"])
  cfg = FeatureDraftConfig.for_target(get_preset(target_preset), dtype=dtype)
  gamma = max(p.get("gamma", 0) for p in programs)
  c = feature_roofline.c_table(layout, drafts[0], cfg, gamma, chips=mesh["model_inner"])
  return {"layout": layout_name, "aot": programs, "feature_draft": drafts[0],
          "feature_config": dataclasses.asdict(cfg), "roofline_layout_record": LAYOUT_RECORD,
          "roofline": c}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("aot_json", help="aot.json of the job")
  ap.add_argument("--layout", default="", help="the layout's name (default: the mesh file's)")
  ap.add_argument("--target_preset", default="t5_1_1_xxl")
  ap.add_argument("--dtype", default="bfloat16", help="the run's compute dtype")
  ap.add_argument("--name", default="", help="write docs/results/NAME.json")
  ap.add_argument("--command", default="", help="the aot command that wrote the file")
  ap.add_argument("--commit", default=None, help="the commit the job ran at (default: HEAD)")
  ap.add_argument("--load", default="", help="1,5,15-minute load average while it ran")
  args = ap.parse_args(argv)
  with open(args.aot_json, encoding="utf-8") as f:
    programs = json.load(f)
  layout = args.layout or next((c for c in programs[0]["config"] if "mesh" in c), "one chip")
  metrics = metrics_of(programs, args.target_preset, args.dtype, layout)
  print(feature_roofline.compiled_table([{"metrics": metrics}]))
  if not args.name:
    return 0
  path = results.save_record(os.path.join(ROOT, "docs", "results"), args.name, metrics,
                             command=args.command, commit=args.commit or None,
                             load=args.load or None)
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
