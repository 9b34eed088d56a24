r"""Entry point: train from scratch, fine-tune a checkpoint, or distil a draft.

  python -m specdec_jax.train --gin_file=configs/local/train/t5_draft_small.gin \
      --output_dir=/tmp/train/t5_draft_small

Re-running the same command resumes from the last checkpoint in OUTPUT_DIR/checkpoints with the
same data order. Distilling a draft (DistillSpec): `TrainConfig.teacher`, `divergence`
('fkl' | 'rkl' | 'jsd' | 'tvd'), `on_policy_fraction`; a task may be a directory that
`python -m specdec_jax.distill_data` wrote (the target's own continuations), e.g.
configs/local/train/t5_draft_small_seqkd_fkl.gin. Flags as in `specdec_jax.run` (`--gin_file`, `--gin.NAME=VALUE`,
`--gin_search_paths`, and the multi-host `--distributed=auto` / `--coordinator_address`...).
A config that binds `FeatureTrainConfig.target` trains a feature-level draft on that frozen
target instead (`training.feature_trainer`; e.g. configs/local/train/t5_feature_draft.gin).
Writes OUTPUT_DIR/config.gin, tensorboard/, batches.jsonl, train_summary.json and, with
`TrainConfig.export_dir`, the trained weights.

Sharded training: add a mesh module after the config, as for runs, e.g.
`--gin_file=gin/mesh/tpu_v4_32.gin`. The mesh modules bind `RunConfig.mesh = @MeshConfig()`; when
`TrainConfig.mesh` is not bound, that MeshConfig is the training mesh, so one module serves both
entry points. On several hosts every host runs the same command and OUTPUT_DIR must be a
directory all of them see (e.g. a gcsfuse mount): Orbax writes each host's shards there.
"""
from __future__ import annotations

import json
from collections.abc import Sequence

from absl import flags

from specdec_jax import configurables
from specdec_jax import distributed  # noqa: F401  (its multi-host flags)
from specdec_jax import gin_utils, lock, logs, paths

FLAGS = flags.FLAGS
gin_utils.define_entry_flags("Where checkpoints, TensorBoard events and the summary go.")
# `--help` lists the main module's key flags only: the shared flags are gin_utils' (and
# distributed's, absl.logging's --verbosity), so adopt them as this module's.
flags.adopt_module_key_flags(gin_utils)
flags.adopt_module_key_flags(distributed)
flags.declare_key_flag("verbosity")


def parse(gin_files: Sequence[str], gin_bindings: Sequence[str] = (),
          search_paths: Sequence[str] = ()):
  """Parses gin strictly and returns the `TrainConfig` it describes (a mesh module's MeshConfig
  is its mesh unless it binds its own), or the `FeatureTrainConfig` of a feature draft's job."""
  configurables.parse(gin_files, gin_bindings, search_paths)
  if configurables.is_feature_training_job():
    return configurables.feature_train_config()
  return configurables.train_config()


def train(gin_files: Sequence[str], output_dir: str, gin_bindings: Sequence[str] = (),
          search_paths: Sequence[str] = (), **kwargs) -> dict:
  import jax  # pylint: disable=import-outside-toplevel
  from specdec_jax.training.trainer import train as run_training
  configurables.parse(gin_files, gin_bindings, search_paths)
  if configurables.is_feature_training_job():  # a feature-level draft on its frozen target
    from specdec_jax.training import feature_trainer  # pylint: disable=import-outside-toplevel
    with lock.hold(output_dir, "training job"):
      return feature_trainer.train(configurables.feature_train_config(), output_dir)
  cfg = parse(gin_files, gin_bindings, search_paths)
  paths.check_writable(output_dir, "training output")  # the shipped assets are read-only
  if cfg.export_path(output_dir):  # refused now, not after the last step
    paths.check_writable(cfg.export_path(output_dir), "the export")
  text = gin_utils.config_text()  # written by the trainer once the resume key agrees
  if jax.process_index() != 0:  # every host runs the command; process 0 holds the directory
    return run_training(cfg, output_dir, config_text=text, **kwargs)
  with lock.hold(output_dir, "training job"):
    return run_training(cfg, output_dir, config_text=text, **kwargs)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected positional arguments: {list(argv[1:])}")
  if not FLAGS.output_dir:
    raise ValueError("--output_dir is required")
  distributed.initialize_from_flags()  # before anything touches a device
  summary = train(FLAGS.gin_file, FLAGS.output_dir, FLAGS.gin_bindings, FLAGS.gin_search_paths)
  print(json.dumps(summary, indent=1))


if __name__ == "__main__":
  logs.setup()  # library INFO filtered; --verbosity=1 shows it
  gin_utils.run(main)
