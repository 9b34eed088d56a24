r"""Entry point: generate sequence-level distillation data (DistillSpec) with the target or draft.

  python -m specdec_jax.distill_data \
      --gin_file=configs/local/train/generate/t5_target_greedy.gin \
      --output_dir=runs/seqkd/t5_target_greedy

Writes OUTPUT_DIR/<task>/sequences.jsonl and index.json per source task (`training.seqdata`);
re-running the same command resumes after a kill, every example written exactly once. A
finished OUTPUT_DIR/<task> is a training task: `TaskSpec.name = 'OUTPUT_DIR/<task>'` (see
configs/local/train/t5_draft_small_seqkd_*.gin). Flags as in `specdec_jax.train`.
"""
from __future__ import annotations

import json
from collections.abc import Sequence

from absl import flags

from specdec_jax import configurables
from specdec_jax import gin_utils, lock, logs, paths
from specdec_jax.training.distill_data import generate

FLAGS = flags.FLAGS
gin_utils.define_entry_flags("Where the generated sequences go.")
# `--help` lists the main module's key flags only: the shared flags are gin_utils' (and
# distributed's, absl.logging's --verbosity), so adopt them as this module's.
flags.adopt_module_key_flags(gin_utils)
flags.declare_key_flag("verbosity")


def parse(gin_files: Sequence[str], gin_bindings: Sequence[str] = (),
          search_paths: Sequence[str] = ()):
  """Parses gin strictly and returns the `DistillDataConfig` it describes."""
  configurables.parse(gin_files, gin_bindings, search_paths)
  return configurables.distill_data_config()


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected positional arguments: {list(argv[1:])}")
  if not FLAGS.output_dir:
    raise ValueError("--output_dir is required")
  cfg = parse(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths)
  paths.check_writable(FLAGS.output_dir, "distillation data")  # before the lock makes it
  with lock.hold(FLAGS.output_dir, "distillation-data job"):  # one writer per directory
    summary = generate(cfg, FLAGS.output_dir)  # checks the key before writing anything
    gin_utils.write_config(FLAGS.output_dir)
  print(json.dumps(summary, indent=1))


if __name__ == "__main__":
  logs.setup()  # library INFO filtered; --verbosity=1 shows it
  gin_utils.run(main)
