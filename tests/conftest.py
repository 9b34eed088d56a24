"""Test setup for the whole suite.

Eight forced CPU devices, so sharded-equals-unsharded tests run anywhere (the flag must be set
before jax is imported). tests/models and tests/decoding also run with strict rank promotion
(their conftest), so silent broadcasting bugs in the core fail loudly.
"""
import os

# LLVM optimisation level 0 cuts XLA:CPU compile time 2-4x for these tiny models; tests measure
# behaviour, never speed.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8"
                           " --xla_backend_optimization_level=0").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (after XLA_FLAGS on purpose)
import pytest  # noqa: E402


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
