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
