"""Quiet by default, informative on demand: the log set-up every entry point calls first.

Why one module: a run's signal (what was loaded, the costs, the chosen gamma, progress, the table)
drowned in library output: 31 lines of Orbax INFO on the main run, 808 rouge "Using default
tokenizer" lines on a sweep, absl and jax start-up lines, and libtpu's `E0000 ... unexpected
worker hostname` on every CPU run once the `tpu` extra is installed. Every entry point (run,
train, distill_data, convert, check_exactness, aot) calls `setup()` before absl parses its flags,
so they all behave alike:
- `--verbosity` (absl's flag, `-v`): 0, the default, shows this project's INFO lines and every
  library's warnings except the known-harmless ones below; 1 (or more) shows everything,
  libraries' INFO included; -1 warnings only; -2 errors only.
- Filtering is by where a record was logged (its file), because Orbax and rouge log through absl's
  own logger like this project does: a record from a file outside `specdec_jax/` is a library's.
- Python `warnings` go through the same filter (`logging.captureWarnings`).
- Lines fit a terminal: by default a record is `I12:34:56 pipeline.py] message` (level, time,
  file) and a message line longer than `WIDTH` columns is wrapped with an indent; absl's full
  prefix (date, thread id, file:line) and unwrapped lines are `--log_prefix=full` away.
- libtpu on a host without TPU chips: it is still loaded (jax tries every installed backend, and
  the AOT tool compiles with it) and complains about the unset slice description; `setup` sets
  the variables it asks for (only where no chip is present and the user set none), which silences
  it without changing what runs (the AOT tool names its topology explicitly).
"""
from __future__ import annotations

import glob
import importlib.util
import logging
import os
import re
import textwrap
import time

from absl import flags
from absl import logging as absl_logging

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# Library warnings that say nothing actionable about a run (message patterns).
HARMLESS = tuple(re.compile(p) for p in (
    r"Unable to initialize backend",          # jax probing backends that are not installed
    r"Transparent hugepages are not enabled",  # TPU runtime start-up time, not correctness
    r"Using default tokenizer",                # rouge_score, once per score call
    r"No GPU/TPU found, falling back to CPU",
))

# What libtpu reads about its slice; unset on a host without chips, it logs E0000 lines.
_TPU_HOST_ENV = {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "v4-8",
                 "TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0"}


def _tpu_chips() -> int:
  """TPU chips on this host (0 without any), as jax's own start-up counts them."""
  try:
    from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel
    return int(hardware_utils.num_available_tpu_chips_and_device_id()[0])
  except Exception:  # pylint: disable=broad-except  (a private API of another jax version)
    return len(glob.glob("/dev/accel[0-9]*") + glob.glob("/dev/vfio/[0-9]*"))


def quiet_tpu_runtime() -> bool:
  """Sets libtpu's slice variables that are unset where libtpu is installed but this host has no
  TPU chip (a value the user or jax set stays); returns whether it looked. Must run before
  libtpu is loaded."""
  if importlib.util.find_spec("libtpu") is None or "JAX_FORCE_TPU_INIT" in os.environ:
    return False
  if _tpu_chips():
    return False
  for key, value in _TPU_HOST_ENV.items():
    os.environ.setdefault(key, value)
  return True


def is_ours(record: logging.LogRecord) -> bool:
  """Whether a record was logged by this package's code (absl reports the caller's file)."""
  path = os.path.abspath(record.pathname or "")
  return path == PACKAGE_DIR or path.startswith(PACKAGE_DIR + os.sep)


class QuietLibraries(logging.Filter):
  """Drops libraries' records below WARNING and their known-harmless warnings, unless
  `--verbosity` is 1 or more (absl's DEBUG); this package's records always pass."""

  def filter(self, record: logging.LogRecord) -> bool:
    if absl_logging.get_verbosity() >= absl_logging.DEBUG or is_ours(record):
      return True
    if record.levelno < logging.WARNING:
      return False
    message = record.getMessage()
    return not any(p.search(message) for p in HARMLESS)


_FILTER = QuietLibraries()

WIDTH = 110  # columns a log line fits by default (`--log_prefix=short`)
if "log_prefix" not in flags.FLAGS:
  flags.DEFINE_enum("log_prefix", "short", ["short", "full"],
                    "Log line prefix: 'short' (level, time, file; lines wrapped to 110 columns) "
                    "or 'full' (absl's: date, time, thread id, file:line; lines as logged).")


class ShortFormatter(logging.Formatter):
  """`I12:34:56 file.py] message`, every line within `width` columns (long lines wrapped with an
  indent); absl's own formatter where `--log_prefix=full`."""

  def __init__(self, full: logging.Formatter, width: int = WIDTH):
    super().__init__()
    self.full, self.width = full, width

  def format(self, record: logging.LogRecord) -> str:
    if flags.FLAGS["log_prefix"].value == "full":  # read per record: parsed after `setup`
      return self.full.format(record)
    prefix = (f"{record.levelname[:1]}{time.strftime('%H:%M:%S', time.localtime(record.created))}"
              f" {os.path.basename(record.pathname or '?')}] ")
    text = record.getMessage()
    if record.exc_info:
      text += "\n" + self.formatException(record.exc_info)
    lines = []
    for i, line in enumerate(text.splitlines() or [""]):
      first = prefix if i == 0 else "    "
      if len(first) + len(line) <= self.width:  # as logged (a table row keeps its spacing)
        lines.append(first + line)
        continue
      lines += textwrap.wrap(line, self.width, initial_indent=first, subsequent_indent="    ",
                             break_on_hyphens=False, break_long_words=True)
    return "\n".join(lines)


def setup(verbosity: int = absl_logging.INFO) -> None:
  """What every entry point calls before `app.run`: libtpu quieted on a chip-less host, the
  default verbosity (`--verbosity` overrides it when absl parses the flags), library INFO and
  harmless warnings filtered, Python warnings routed through the same filter, lines within
  `WIDTH` columns (`ShortFormatter`). Idempotent."""
  quiet_tpu_runtime()
  flags.FLAGS.set_default("verbosity", verbosity)  # what --help shows; the flag overrides it
  absl_logging.set_verbosity(verbosity)
  handler = absl_logging.get_absl_handler()
  if _FILTER not in handler.filters:
    handler.addFilter(_FILTER)
  python_handler = handler.python_handler  # where absl's handler formats its records
  if not isinstance(python_handler.formatter, ShortFormatter):
    python_handler.setFormatter(
        ShortFormatter(python_handler.formatter or absl_logging.PythonFormatter()))
  logging.captureWarnings(True)


def bar(desc: str, total: int | None = None, unit: str = "it", initial: int = 0):
  """A tqdm progress bar on stderr (count, rate, ETA) for the minutes a run spends calibrating,
  decoding or sampling. Off (`.disable` true) below the default verbosity (`--verbosity=-1`, and
  in library use, where absl's verbosity keeps its -1 default), with TQDM_DISABLE=1, and where
  stderr is not a terminal (a log file gets the callers' periodic log lines instead of
  carriage-return frames), and on processes other than 0 of a multi-host job."""
  import jax  # pylint: disable=import-outside-toplevel
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  quiet = absl_logging.get_verbosity() < absl_logging.INFO or jax.process_index() != 0
  return tqdm(total=total, desc=desc, unit=unit, initial=initial, dynamic_ncols=True,
              disable=quiet or None)


def ticker(progress_bar):
  """`tick(done, total)` feeding `progress_bar` (what `timing.interleaved` calls)."""
  def tick(done: int, total: int) -> None:
    if progress_bar.total != total:
      progress_bar.total = total
    progress_bar.update(done - progress_bar.n)
  return tick
