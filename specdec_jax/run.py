r"""Entry point: decode, benchmark or sweep any config.

  python -m specdec_jax.run --gin_file=configs/local/smoke.gin --output_dir=/tmp/smoke
  python -m specdec_jax.run --gin_file=configs/local/default.gin --gin.TEMPERATURE=1.0 \
      --gin.GAMMA=[1,2,4] --output_dir=/tmp/ende_sweep

Flags are T5X's: `--gin_file` (repeatable, parsed in order), `--gin.NAME=VALUE` (rewritten to
`--gin_bindings`), `--gin_search_paths` (the working directory and the repository root are always
searched). Modes (`MODE`): speculative, autoregressive, benchmark (both on the same prompts, in one
process) and sweep (any of GAMMA / TEMPERATURE / DRAFT / DRAFT_CHECKPOINT a list).
Writes OUTPUT_DIR/metrics.json, predictions.jsonl, config.gin, machine.json (the machine and its
load as the run ran: what `scripts/results.py record` puts in a record) and tensorboard/.

Gin lives in the entry points and `specdec_jax.configurables` (which registers `RunConfig` and
every other configurable); library code below (models, decoding, runner, metrics) imports no gin.
"""
from __future__ import annotations

from collections.abc import Sequence

from absl import flags

from specdec_jax import configurables
from specdec_jax import distributed  # noqa: F401  (its multi-host flags)
from specdec_jax import gin_utils, logs
from specdec_jax.runner.run_config import RunConfig

FLAGS = flags.FLAGS
gin_utils.define_entry_flags("Where results, config.gin and TensorBoard events go.")
# `--help` lists the main module's key flags only: the shared flags are gin_utils' (and
# distributed's, absl.logging's --verbosity), so adopt them as this module's.
flags.adopt_module_key_flags(gin_utils)
flags.adopt_module_key_flags(distributed)
flags.declare_key_flag("verbosity")

def parse(gin_files: Sequence[str], gin_bindings: Sequence[str] = (),
          search_paths: Sequence[str] = ()) -> RunConfig:
  """Parses gin files and bindings (strictly) and returns the run's config."""
  configurables.parse(gin_files, gin_bindings, search_paths)
  return configurables.run_config()


def run(gin_files: Sequence[str], output_dir: str, gin_bindings: Sequence[str] = (),
        search_paths: Sequence[str] = ()) -> list[dict]:
  """Parses the config, writes config.gin, runs; returns the metrics objects."""
  from specdec_jax.runner.experiment import execute  # jax and friends: after flag errors
  cfg = parse(gin_files, gin_bindings, search_paths)
  # Written by execute, on process 0 only (nothing may touch jax's devices before the mesh is up).
  return execute(cfg, output_dir, config_text=gin_utils.config_text())


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected positional arguments: {list(argv[1:])}")
  if not FLAGS.output_dir:
    raise ValueError("--output_dir is required")
  distributed.initialize_from_flags()  # multi-host: --coordinator_address ... or --distributed
  run(FLAGS.gin_file, FLAGS.output_dir, FLAGS.gin_bindings, FLAGS.gin_search_paths)


def console_entry() -> None:
  logs.setup()  # library INFO filtered; --verbosity=1 shows it
  gin_utils.run(main)


if __name__ == "__main__":
  console_entry()
