r"""Converts a T5X or Hugging Face checkpoint into the project's own format.

  python -m specdec_jax.convert --input_format=t5x \
      --input=/ckpts/t5_1_1_small/checkpoint_1000000 --output=/ckpts/small [--dtype=bfloat16]

  python -m specdec_jax.convert --input_format=gguf --input=SmolLM2-135M-Instruct.Q4_1.gguf \
      --output=/ckpts/smollm2

The output is an Orbax checkpoint with `model_config.json` beside it, so runs and gin files need
only the path (T5X checkpoints carry no config: give `--preset` or `--config_json`, or let the
config be inferred from the array shapes). Converting once also drops the optimizer state, which
is a third of a T5X Adafactor checkpoint. A GGUF file (`checkpoints.gguf_io`) is dequantized to
float32 and written with its tokenizer (tokenizer.json, the chat template in
tokenizer_config.json), so a run needs only the output path.
"""
from __future__ import annotations

import json
import os

from absl import app, flags, logging

from specdec_jax import logs, paths

FLAGS = flags.FLAGS
flags.DEFINE_enum("input_format", None, ["hf", "t5x", "t5x_orbax", "gguf"], "Format of --input.")
flags.DEFINE_string("input", None, "Checkpoint directory (T5X msgpack or GGUF file) to read.")
flags.DEFINE_string("output", None, "Directory to write (Orbax params/ + model_config.json).")
flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"], "Cast weights to this dtype on write.")
flags.DEFINE_string("preset", None, "Model preset (T5X formats store no config), e.g. t5_1_1_small.")
flags.DEFINE_string("config_json", None, "ModelConfig JSON file or inline JSON (instead of --preset).")
flags.DEFINE_bool("scan_layers", None, "Store the layers stacked (scan) or per layer; default: config.")
flags.declare_key_flag("verbosity")  # absl.logging's, listed by --help beside this module's


def _config_from_flags():
  from specdec_jax.checkpoints import orbax_io, storage
  from specdec_jax.models.model_config import get_preset
  if FLAGS.preset and FLAGS.config_json:
    raise app.UsageError("give --preset or --config_json, not both")
  if FLAGS.preset:
    return get_preset(FLAGS.preset)
  if FLAGS.config_json:
    text = FLAGS.config_json
    if os.path.isfile(text):
      return orbax_io.config_from_dict(storage.read_json(text, "--config_json"), text)
    try:
      raw = json.loads(text)
    except json.JSONDecodeError as e:
      raise app.UsageError(f"--config_json is neither a file nor valid JSON: {e}") from None
    return orbax_io.config_from_dict(raw, "--config_json")
  return None


def convert(input_format: str, input_path: str, output: str, dtype: str | None = None,
            config=None, scan_layers: bool | None = None) -> str:
  """Library form of the entry point; returns the output directory."""
  from specdec_jax.checkpoints import orbax_io, weights
  paths.check_writable(output, "the converted checkpoint")  # before reading a large input
  if input_format == "gguf":
    from specdec_jax.checkpoints import gguf_io
    if config is not None or scan_layers:
      raise ValueError("a GGUF file carries its config: --preset, --config_json and "
                       "--scan_layers do not apply")
    return gguf_io.convert(input_path, output, dtype, progress=True)
  found = weights.detect_format(input_path)
  if found != input_format:
    raise ValueError(f"--input_format={input_format} but {input_path} looks like {found!r}")
  cfg, params = weights.load_checkpoint(input_path, dtype=dtype, config=config,
                                        scan_layers=scan_layers, progress=True)
  logging.info("read %s checkpoint %s: %s", input_format, input_path, cfg)
  orbax_io.save(output, cfg, params)
  logging.info("wrote %s", output)
  return output


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  convert(FLAGS.input_format, FLAGS.input, FLAGS.output, FLAGS.dtype, _config_from_flags(),
          FLAGS.scan_layers)


if __name__ == "__main__":
  logs.setup()  # library INFO filtered; --verbosity=1 shows it
  flags.mark_flags_as_required(["input_format", "input", "output"])
  app.run(main)
