"""The suite's own guard against a worker crash: compiled programs hold memory maps, and
`jax.clear_caches()` (what tests/conftest.py calls between modules past a threshold) releases them.

Why: a long-lived xdist worker crossed vm.max_map_count (65530) and segfaulted inside XLA late in
CI runs; if a jax upgrade stopped clear_caches from unmapping executables, the guard would be
silently useless and the crash would come back. This fails first.
"""
import gc
import sys

import jax
import jax.numpy as jnp
import pytest

from specdec_jax.testing import memory_maps


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps is Linux's")
def test_clearing_the_caches_unmaps_compiled_programs():
  jax.clear_caches()
  gc.collect()
  before = memory_maps()
  fns = [jax.jit(lambda x, i=i: jnp.sin(x) * i) for i in range(40)]
  for i, f in enumerate(fns):
    f(jnp.ones((i + 1,))).block_until_ready()
  grown = memory_maps()
  assert grown > before + 40  # several maps per compiled program
  jax.clear_caches()
  gc.collect()
  assert memory_maps() < before + (grown - before) // 2
