"""Quiet by default, informative on demand (`specdec_jax.logs`, issue 31).

Why: the main run printed 31 lines of Orbax INFO, a sweep 808 rouge lines, and every CPU run
libtpu's `E0000 ... unexpected worker hostname` once the tpu extra was installed. The filter is
checked on records directly; the smoke run's stderr end to end (library lines, libtpu lines).
"""
import logging
import os
import re
import subprocess
import sys

import pytest
from absl import logging as absl_logging

from specdec_jax import logs
from specdec_jax.paths import PACKAGE_PARENT

# A log line: the short prefix (level, time, file]) or absl's full one (level, date, time,
# thread, file:line])
ABSL_LINE = re.compile(r"^[IWEF](?:\d{4} )?[\d:.]+\s+(?:\d+ )?(\S+?)(?::\d+)?\]")
PROJECT_FILES = {f for _, _, fs in os.walk(logs.PACKAGE_DIR) for f in fs if f.endswith(".py")}


def _record(path, level, msg):
  return logging.LogRecord("absl", level, path, 1, msg, (), None)


@pytest.fixture
def verbosity():
  old = absl_logging.get_verbosity()
  yield absl_logging.set_verbosity
  absl_logging.set_verbosity(old)


def test_library_info_is_filtered_unless_verbose(verbosity):
  lib = "/site-packages/orbax/checkpoint/_src/checkpointer.py"
  ours = os.path.join(logs.PACKAGE_DIR, "runner", "pipeline.py")
  f = logs.QuietLibraries()
  verbosity(absl_logging.INFO)
  assert not f.filter(_record(lib, logging.INFO, "Restoring checkpoint"))
  assert f.filter(_record(ours, logging.INFO, "measured costs"))
  assert f.filter(_record(lib, logging.WARNING, "something is off"))
  assert not f.filter(_record("/site-packages/rouge_score/x.py", logging.INFO,
                              "Using default tokenizer."))
  assert not f.filter(_record("/site-packages/jax/_src/xla_bridge.py", logging.WARNING,
                              "Unable to initialize backend 'tpu'"))
  verbosity(absl_logging.DEBUG)  # --verbosity=1: everything
  assert f.filter(_record(lib, logging.INFO, "Restoring checkpoint"))


def test_tpu_runtime_is_quieted_only_on_a_chipless_host(monkeypatch):
  for k in logs._TPU_HOST_ENV:
    monkeypatch.delenv(k, raising=False)
  monkeypatch.setattr(logs.importlib.util, "find_spec", lambda name: object())
  monkeypatch.setattr(logs, "_tpu_chips", lambda: 4)
  assert not logs.quiet_tpu_runtime()  # a TPU host: libtpu must see the real slice
  assert "TPU_WORKER_HOSTNAMES" not in os.environ
  monkeypatch.setattr(logs, "_tpu_chips", lambda: 0)
  monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5e-8")
  assert logs.quiet_tpu_runtime() and os.environ["TPU_WORKER_HOSTNAMES"] == "localhost"
  assert os.environ["TPU_ACCELERATOR_TYPE"] == "v5e-8"  # the user's own setting wins


def test_log_lines_fit_110_columns_and_the_full_prefix_is_a_flag_away():
  """`logs.ShortFormatter` (installed by `setup`): level, time and file, every line of a long
  message within `WIDTH` columns (wrapped with an indent, nothing dropped), a short line as
  logged; absl's own prefix (thread id, file:line) and the line as logged with --log_prefix=full."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  logs.setup()
  fmt = absl_logging.get_absl_handler().python_handler.formatter
  assert isinstance(fmt, logs.ShortFormatter)
  words = [f"v({i})=1.{i:03d}" for i in range(40)]
  long = _record(os.path.join(logs.PACKAGE_DIR, "runner", "pipeline.py"), logging.INFO,
                 "costs: " + " ".join(words) + "\n  | a | table |")
  out = fmt.format(long).splitlines()
  assert ABSL_LINE.match(out[0]).group(1) == "pipeline.py"
  assert max(map(len, out)) <= logs.WIDTH and len(out) >= 4
  assert " ".join(" ".join(out).split()).endswith(" ".join(words) + " | a | table |")
  assert out[-1] == "      | a | table |"  # a short line keeps its spacing, indented
  flags.FLAGS.log_prefix = "full"
  try:
    full = fmt.format(long)
    assert re.match(r"^I\d{4} [\d:.]+\s+\d+ pipeline.py:1\] costs: ", full)
    assert len(full.splitlines()[0]) > logs.WIDTH
  finally:
    flags.FLAGS.log_prefix = "short"


def library_lines(stderr: str) -> list[str]:
  """absl-formatted lines logged from files outside the package."""
  out = []
  for line in stderr.splitlines():
    m = ABSL_LINE.match(line)
    if m and os.path.basename(m.group(1)) not in PROJECT_FILES:
      out.append(line)
  return out


def run_module(*args, timeout=900):
  """`python -m specdec_jax.<args>` from the repository root as a user runs it: no forced
  platform (so an installed libtpu loads as it would), the package from this checkout."""
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", "")
  return subprocess.run([sys.executable, "-m", *args], cwd=PACKAGE_PARENT, env=env,
                        capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.slow  # ~27 s: a whole smoke run in a subprocess; the filter itself is tested above
def test_smoke_run_prints_no_library_lines(tmp_path):
  """The smoke run with its models loaded from Orbax checkpoints (Orbax logs ~15 INFO lines
  per restore) and a head restriction its converted draft has no ranking for (one warning)."""
  from specdec_jax.checkpoints import loader, orbax_io
  for name in ("target", "draft"):
    model, params = loader.load_model(f"t5_test_{name}", seed=0)
    orbax_io.save(str(tmp_path / name), model.config, params)
  proc = run_module("specdec_jax.run", "--gin_file=configs/local/smoke.gin",
                    f"--output_dir={tmp_path / 'run'}", "--gin.RunConfig.repeats=1",
                    f"--gin.TARGET_CHECKPOINT='{tmp_path / 'target'}'",
                    f"--gin.DRAFT_CHECKPOINT='{tmp_path / 'draft'}'",
                    "--gin.RunConfig.draft_head_vocab=8")
  assert proc.returncode == 0, proc.stderr[-3000:]
  noise = library_lines(proc.stderr)
  assert len(noise) <= 2, noise
  for bad in ("orbax", "E0000", "unexpected worker hostname", "InitGoogle", "TPU accelerator"):
    assert bad not in proc.stderr, bad
  lines = proc.stderr.splitlines()
  assert any("measure.py" in line for line in lines)  # ours still speak (the costs' line)
  assert max(map(len, lines)) <= logs.WIDTH, max(lines, key=len)  # it fits a terminal
  assert sum("full output head" in line for line in lines) == 1  # no ranking: one warning line
