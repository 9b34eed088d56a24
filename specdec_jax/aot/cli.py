r"""Entry point: compile a run's or a training job's programs for a TPU slice, on this host.

  python -m specdec_jax.aot --gin_file=configs/paper/table2/ende_t5_small_t0.gin \
      --gin_file=configs/paper/mesh_tpu_v4_8.gin --topology=v4-8 --output_dir=/tmp/aot/ende
  python -m specdec_jax.aot --gin_file=configs/paper/train/ende_t5_xxl.gin \
      --gin_file=gin/mesh/tpu_v4_32.gin --topology=v4-32 --output_dir=/tmp/aot/xxl_train

Needs libtpu (`pip install -e '.[tpu]'`), no TPU. Flags as `specdec_jax.run` / `train`
(`--gin_file` repeatable, `--gin.NAME=VALUE`, `--gin_search_paths`); a config that binds
`TrainConfig.model` is a training job, any other a run. Writes OUTPUT_DIR/aot.json (one object
per program, rewritten after each compile so a job stopped part-way keeps what it compiled)
and prints a table; with `--roofline` also compiles one target step, one draft step
per model draft and the verify calls for T = 2..`--roofline_tokens`, and writes roofline.json and
roofline.md (c, v(T) and the paper's Table-2 rows predicted from its alpha; `aot.roofline`).
Exit status 1 when a program does
not fit or its loop transfers to the host (each named with the bytes needed and available), 2
when the config cannot be laid out on the slice (a mesh axis that does not divide a dimension).
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence

import gin
from absl import app, flags

from specdec_jax import configurables
from specdec_jax import gin_utils, logs, paths

FLAGS = flags.FLAGS
gin_utils.define_entry_flags("Where aot.json (and roofline.*) go.")
# `--help` lists the main module's key flags only: the shared flags are gin_utils' (and
# distributed's, absl.logging's --verbosity), so adopt them as this module's.
flags.adopt_module_key_flags(gin_utils)
flags.declare_key_flag("verbosity")
flags.DEFINE_string("topology", "v4-8", "TPU slice: v4-8, v4-16, v4-32, ..., v5e-8, or a "
                    "physical name such as v4:2x2x1.")
flags.DEFINE_bool("roofline", False, "Also compile single target / draft / verify steps and "
                  "predict c, v(T) and the Table-2 speedups from the chip's roofline "
                  "(scripts/aot_roofline.py records them under docs/results).")
flags.DEFINE_integer("roofline_tokens", 8, "Largest verify block T of the roofline.")
flags.DEFINE_list("only", [], "Compile only programs of these kinds (spec_prefill, spec_loop, "
                  "ar_prefill, ar_loop, train_step, target_step, verify, draft_step), e.g. "
                  "--only=spec_prefill,target_step,verify,draft_step for the roofline alone; "
                  "a program whose state comes from a prefill brings that prefill along.")

# gin's config_str wraps a long binding after `= \` onto the next line: the value may follow there.
_MACRO = re.compile(r"^([A-Z0-9_]+)_(CHECKPOINT|PRESET)\s*=\s*(?:\\\n\s*)?'([^']*)'\s*$", re.M)


def parse(gin_files: Sequence[str], gin_bindings: Sequence[str] = (),
          search_paths: Sequence[str] = ()):
  """(RunConfig or TrainConfig, checkpoint -> preset map from the gin macros)."""
  configurables.parse(gin_files, gin_bindings, search_paths)
  if configurables.is_training_job():
    cfg = configurables.train_config()
  else:
    cfg = configurables.run_config()
  return cfg, checkpoint_presets(gin.config_str())


def checkpoint_presets(config_text: str) -> dict[str, str]:
  """{checkpoint path: preset} from macro pairs such as T5_1_1_XXL_CHECKPOINT / _PRESET."""
  found: dict[str, dict[str, str]] = {}
  for stem, kind, value in _MACRO.findall(config_text):
    found.setdefault(stem, {})[kind] = value
  return {v["CHECKPOINT"]: v["PRESET"] for v in found.values() if {"CHECKPOINT", "PRESET"} <= set(v)}


def run(gin_files: Sequence[str], output_dir: str, topology: str, gin_bindings: Sequence[str] = (),
        search_paths: Sequence[str] = (), roofline_tokens: int = 0, only: Sequence[str] = (),
        log=print) -> int:
  """The whole job; returns the exit status (0 all fit, 1 a failure)."""
  from specdec_jax.aot import job as job_lib, report, roofline, topologies  # after flag errors
  paths.check_writable(output_dir, "the AOT report")  # the shipped assets are read-only
  topo = topologies.parse(topology)
  cfg, presets = parse(gin_files, gin_bindings, search_paths)
  job = job_lib.run_job(cfg, topo, presets=presets, roofline_tokens=roofline_tokens, only=only,
                        log=log, on_result=lambda so_far: report.write(
                            output_dir, report.records(so_far, gin_files)))
  recs = report.records(job, gin_files)
  layout = None
  if any(r["kind"] == roofline.TARGET_STEP for r in recs):
    layout = roofline.layout_from_aot(recs, f"{topo.name}, mesh {job.mesh_shape}")
  path = report.write(output_dir, recs, layout)
  log(report.table(job))
  if layout is not None:
    md = roofline.markdown(layout, recs)
    with open(os.path.join(output_dir, "roofline.md"), "w", encoding="utf-8") as f:
      f.write(md + "\n")
    log(md)
  log(f"wrote {path}")
  failures = report.failure_lines(job)
  for line in failures:
    print(f"error: {line}", file=sys.stderr)
  return 1 if failures else 0


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected positional arguments: {list(argv[1:])}")
  if not FLAGS.output_dir:
    raise app.UsageError("--output_dir is required")
  try:
    status = run(FLAGS.gin_file, FLAGS.output_dir, FLAGS.topology, FLAGS.gin_bindings,
                 FLAGS.gin_search_paths, FLAGS.roofline_tokens if FLAGS.roofline else 0,
                 FLAGS.only)
  except ValueError as e:  # a config that cannot be laid out on this slice: say why, no traceback
    print(f"error: {e}", file=sys.stderr)
    status = 2
  sys.exit(status)


def console_entry() -> None:
  logs.setup()  # libtpu quieted on this chip-less host; library INFO filtered
  gin_utils.run(main)


if __name__ == "__main__":
  console_entry()
