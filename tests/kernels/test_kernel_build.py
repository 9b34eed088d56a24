"""Building the kernel library: cached per key, and XLA's dot with one log line without it.

Why: the kernel is compiled at first use on the user's machine; a machine without a compiler (or
a failed build) must still decode, with XLA's dot, and say so once rather than at every layer.
"""
import os

import jax.numpy as jnp
import numpy as np
import pytest
from absl import logging

from specdec_jax.kernels import build
from specdec_jax.kernels import matmul as km


@pytest.fixture
def fresh_load():
  """`build.load` re-evaluated in the test, and restored (built, registered) afterwards."""
  build.load.cache_clear()
  yield
  build.load.cache_clear()
  assert build.load()


def _warnings(monkeypatch):
  lines = []
  monkeypatch.setattr(logging, "warning", lambda msg, *a: lines.append(msg % a if a else msg))
  return lines


def test_without_a_compiler_xla_dot_and_one_log_line(fresh_load, monkeypatch):
  monkeypatch.setenv("CXX", "no-such-compiler-for-specdec")
  lines = _warnings(monkeypatch)
  assert not build.load()
  assert not build.load()  # asked again (every layer asks): no second line
  assert len(lines) == 1 and "no C++ compiler" in lines[0]
  rng = np.random.default_rng(0)
  w = rng.standard_normal((20, 37)).astype(np.float32)
  x = rng.standard_normal((2, 3, 20)).astype(np.float32)
  np.testing.assert_allclose(np.asarray(km.packed_matmul(jnp.asarray(x), km.pack_panels(w), 37)),
                             x @ w, rtol=1e-5, atol=1e-5)


def test_a_failed_build_is_logged_once_with_the_reason(fresh_load, monkeypatch, tmp_path):
  monkeypatch.setenv("SPECDEC_JAX_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
  lines = _warnings(monkeypatch)
  assert not build.load()
  assert len(lines) == 1 and "failed" in lines[0] and build.SOURCE in lines[0]


def test_library_is_cached_by_key(monkeypatch, tmp_path):
  monkeypatch.setenv("SPECDEC_JAX_CACHE_DIR", str(tmp_path))
  cxx = build.compiler()
  if cxx is None:
    pytest.skip("no C++ compiler")
  path = build.library_path(cxx)
  assert path.startswith(str(tmp_path)) and path == build.library_path(cxx)
  monkeypatch.setattr(build, "FLAGS", build.FLAGS + ("-DSPECDEC_TEST_FLAG",))
  assert build.library_path(cxx) != path  # flags are part of the key
  assert not os.path.exists(path)


# Instruction sets below this machine's: the kernel's narrower paths, built and run here.
NARROWER_PATHS = {"avx2": ("-mno-avx512f",), "scalar": ("-mno-avx512f", "-mno-avx2", "-mno-fma")}


@pytest.mark.slow  # two extra builds of the library: ~1 minute on the 2-core machine
@pytest.mark.parametrize("path", list(NARROWER_PATHS))
def test_narrower_instruction_paths_compute_the_same_products(path, tmp_path):
  """The library built with AVX-512 off (the AVX2 loops), and with AVX2 and FMA off too (the
  scalar fallback), computes every panel layout's product as this machine's build does, to
  float32 accuracy: a host without AVX-512 runs code this machine's `-march=native` build
  never compiles (q4 panels' AVX2 loop, for one)."""
  cxx = build.compiler()
  if cxx is None:
    pytest.skip("no C++ compiler")
  assert build.load()
  lib = tmp_path / "lib.so"
  with open(tmp_path / build.SOURCE, "wb") as f:
    f.write(build._source_bytes())  # pylint: disable=protected-access
  import subprocess  # pylint: disable=import-outside-toplevel
  import ctypes  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  proc = subprocess.run([cxx, *build.FLAGS, *NARROWER_PATHS[path], "-I", jax.ffi.include_dir(),
                         str(tmp_path / build.SOURCE), "-o", str(lib)], capture_output=True,
                        text=True, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  handle = ctypes.cdll.LoadLibrary(str(lib))
  rng = np.random.default_rng(3)
  d, f = 96, 53
  w = rng.standard_normal((d, f)).astype(np.float32)
  layouts = {build.SYMBOL: km.pack_panels(w), build.SYMBOL_BF16: km.pack_panels(w, jnp.bfloat16),
             build.SYMBOL_INT8: km.pack_int8_panels(w), build.SYMBOL_Q4: km.pack_q4_panels(w)}
  for symbol, panels in layouts.items():
    name = f"specdec_test_{path}_{symbol}"
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(handle, symbol)), platform="cpu")
    for rows in (1, 2, 3, 5, 9):
      x = rng.standard_normal((rows, d)).astype(np.float32)
      call = jax.ffi.ffi_call(name, jax.ShapeDtypeStruct((rows, f), jnp.float32))
      got = np.asarray(call(jnp.asarray(x), panels))
      want = np.asarray(km.packed_matmul(jnp.asarray(x), panels, f))
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=f"{symbol} {rows}")
