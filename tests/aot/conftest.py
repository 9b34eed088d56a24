"""tests/aot compiles for a TPU with no TPU attached: keep those programs out of the persistent
compilation cache (tests/conftest.py).

Why: jax writes a compile-only TPU executable to the cache but cannot load one back without a TPU
client ("PjRtCompiler must be constructed with a Client"), so each entry would be dead weight in
the cache and a warning on every later run. Whether a process uses the cache is decided once, so
the switch resets jax's cache state on the way in and out.
"""
import jax
import pytest
from jax._src import compilation_cache  # pylint: disable=protected-access


@pytest.fixture(autouse=True)
def _no_persistent_cache_for_tpu_programs():
  before = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  yield
  jax.config.update("jax_enable_compilation_cache", before)
  compilation_cache.reset_cache()
