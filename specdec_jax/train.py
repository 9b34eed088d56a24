r"""Entry point: train from scratch, fine-tune a checkpoint, or distil a draft.

  python -m specdec_jax.train --gin_file=configs/local/train/t5_draft_small.gin \
      --output_dir=/tmp/train/t5_draft_small

Re-running the same command resumes from the last checkpoint in OUTPUT_DIR/checkpoints with the
same data order. Flags as in `specdec_jax.run` (`--gin_file`, `--gin.NAME=VALUE`,
`--gin_search_paths`). Writes OUTPUT_DIR/config.gin, tensorboard/, batches.jsonl,
train_summary.json and, with `TrainConfig.export_dir`, the trained weights.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence

import gin
from absl import flags, logging

from specdec_jax import gin_utils

FLAGS = flags.FLAGS
# The same flags as specdec_jax.run; defined only once so both entry points import together.
if "gin_file" not in FLAGS:
  flags.DEFINE_multi_string("gin_file", [], "Gin config files, parsed in order.")
  flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings (also given as --gin.NAME=VALUE).")
  flags.DEFINE_list("gin_search_paths", [], "Extra gin search paths.")
  flags.DEFINE_string("output_dir", None, "Where checkpoints, TensorBoard events and the "
                      "summary go.")


def register_configurables() -> None:
  from specdec_jax.training.data import TaskSpec
  from specdec_jax.training.trainer import TrainConfig
  for cls in (TrainConfig, TaskSpec):
    try:
      gin.get_configurable(cls.__name__)
    except ValueError:
      gin.external_configurable(cls, module="specdec")


def parse(gin_files: Sequence[str], gin_bindings: Sequence[str] = (),
          search_paths: Sequence[str] = ()):
  """Parses gin strictly and returns the `TrainConfig` it describes."""
  register_configurables()
  gin.clear_config()
  gin_utils.parse_gin_flags(gin_files, gin_bindings, search_paths)
  return gin.get_configurable("TrainConfig")()


def train(gin_files: Sequence[str], output_dir: str, gin_bindings: Sequence[str] = (),
          search_paths: Sequence[str] = (), **kwargs) -> dict:
  from specdec_jax.training.trainer import train as run_training
  cfg = parse(gin_files, gin_bindings, search_paths)
  text = gin_utils.write_config(output_dir)
  return run_training(cfg, output_dir, config_text=text, **kwargs)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected positional arguments: {list(argv[1:])}")
  if not FLAGS.output_dir:
    raise ValueError("--output_dir is required")
  summary = train(FLAGS.gin_file, FLAGS.output_dir, FLAGS.gin_bindings, FLAGS.gin_search_paths)
  print(json.dumps(summary, indent=1))


if __name__ == "__main__":
  logging.set_verbosity(logging.INFO)
  gin_utils.run(main)
