"""Every entry point's `--help` names its flags (issue 31).

Why: absl's `--help` lists the main module's key flags only, and the shared ones (--gin_file,
--output_dir, ...) are defined in gin_utils, so `aot --help` listed none, and check_exactness did
not even define the --gin_file its own docstring's command uses. Each entry point adopts the
shared flags and absl.logging's --verbosity; this test runs `python -m specdec_jax.<entry> --help`
for each, as a user would.
"""
import os
import subprocess
import sys

from specdec_jax.paths import PACKAGE_PARENT

GIN = ("--gin_file", "--gin_bindings", "--gin_search_paths", "--output_dir", "--verbosity")
EXPECTED = {
    "run": GIN + ("--distributed", "--coordinator_address"),
    "train": GIN + ("--distributed",),
    "distill_data": GIN,
    "check_exactness": GIN + ("--num_samples", "--num_tokens", "--fault", "--significance"),
    "aot": GIN + ("--topology", "--roofline", "--only"),
    "convert": ("--input_format", "--input", "--output", "--dtype", "--preset", "--verbosity"),
}


def _env():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + os.environ.get("PYTHONPATH", "")
  return env


def test_every_entry_point_help_names_its_flags():
  procs = {e: subprocess.Popen([sys.executable, "-m", f"specdec_jax.{e}", "--help"],
                               cwd=PACKAGE_PARENT, env=_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
           for e in EXPECTED}
  for entry, proc in procs.items():
    out, _ = proc.communicate(timeout=600)  # absl's --help exits with status 1
    assert "Traceback" not in out, (entry, out[-2000:])
    missing = [f for f in EXPECTED[entry]
               if f + ":" not in out and f"--[no]{f[2:]}:" not in out]
    assert not missing, (entry, missing, out[-2000:])
    verbosity = out[out.index("--verbosity:"):][:500]
    assert "(default: '0')" in verbosity, (entry, verbosity)  # quiet INFO by default (logs.py)


def test_check_exactness_takes_the_documented_flags(tmp_path):
  """The docstring's command shape (--gin_file, --gin.NAME=VALUE) parses and runs."""
  proc = subprocess.run(
      [sys.executable, "-m", "specdec_jax.check_exactness", "--gin_file=configs/local/smoke.gin",
       "--gin.TEMPERATURE=1.0", "--num_samples=200", "--num_tokens=1", "--bootstrap=10",
       f"--output_dir={tmp_path}"], cwd=PACKAGE_PARENT, env=_env(), capture_output=True,
      text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (tmp_path / "exactness.json").is_file()
