"""Test setup for the whole suite.

Eight forced CPU devices, so sharded-equals-unsharded tests run anywhere (the flag must be set
before jax is imported). tests/models and tests/decoding also run with strict rank promotion
(their conftest), so silent broadcasting bugs in the core fail loudly.
"""
import os

# LLVM optimisation level 0 cuts XLA:CPU compile time 2-4x for these tiny models, and XLA:CPU's
# older elemental emitters compile a fusion faster than its MLIR fusion emitters (one decoding
# test module: 47 s against 65 s): compiling is ~60 % of the suite's time. Tests measure
# behaviour, never speed; the programs they compile compute the same functions (to rounding).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8"
                           " --xla_backend_optimization_level=0"
                           " --xla_cpu_use_fusion_emitters=false").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (after XLA_FLAGS on purpose)
import pytest  # noqa: E402

# Many tests compile the same programs (the zoo models' decode loops at the same shapes, built
# afresh per test, so jit's in-memory cache misses): XLA's persistent cache, keyed by the program,
# the compiler's flags and the jax/jaxlib versions, hands a compiled program to every later test,
# to the other xdist worker and to the next run. One directory per user under the user's cache
# directory (not a shared temp directory: jax trusts what it loads from it), least recently used
# entries dropped past 2 GiB (that needs `filelock`; without it, no cache). A caller's
# JAX_COMPILATION_CACHE_DIR wins, and an empty one turns the cache off. tests/aot turns it off
# for its TPU programs (tests/aot/conftest.py).
def _enable_compilation_cache():
  path = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  if path == "":
    jax.config.update("jax_enable_compilation_cache", False)
    return
  try:
    import filelock  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    return
  if path is None:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "specdec_jax", "test_xla_cache")
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_compilation_cache_max_size", 2 * 2 ** 30)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    # Loading an entry costs ~0.2 s here: programs that compile faster are not worth storing.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.3)


_enable_compilation_cache()


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: long-running test (skipped with -m 'not slow')")


@pytest.fixture
def clean_gin():
  """A test that parses gin starts and ends with an empty gin config (gin state is global)."""
  import gin  # pylint: disable=import-outside-toplevel
  gin.clear_config()
  yield
  gin.clear_config()


# Each XLA:CPU compilation maps ~6 memory regions that live as long as the executable is cached. A
# long-lived xdist worker compiles thousands of programs over the suite (46k maps after 15 min of
# tests/decoding + tests/models in one process), and a process past the kernel's vm.max_map_count
# (65530 by default) fails to map memory inside XLA: most likely the segfaulting workers CI saw,
# always late in the run. Past this many maps, the caches are dropped between test modules (they
# recompile on demand).
MAX_MAPS_BEFORE_CLEARING = 30_000


@pytest.fixture(scope="module", autouse=True)
def _bounded_compilation_caches():
  yield
  from specdec_jax.testing import memory_maps  # pylint: disable=import-outside-toplevel
  if memory_maps() > MAX_MAPS_BEFORE_CLEARING:
    import gc  # pylint: disable=import-outside-toplevel
    jax.clear_caches()
    gc.collect()
