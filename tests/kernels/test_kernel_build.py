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
