"""Helpers shared by the checkpoint tests (imported by name; pytest puts this folder on sys.path)."""
import os

import ml_dtypes
import numpy as np

from specdec_jax.checkpoints.tree import expected_shapes, flatten, unflatten

BF16 = ml_dtypes.bfloat16
# CI clones the repository with shared/ beside it; so does the development checkout.
T5X_TINY = os.environ.get("SPECDEC_T5X_TINY", os.path.abspath(os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "reference", "t5x_testdata",
    "test_t5_tiny.checkpoint_0")))


def random_params(config, seed=0, dtype=np.float32):
  """A nested tree with the config's exact shapes and distinct random values per array."""
  rng = np.random.default_rng(seed)
  flat = {p: rng.standard_normal(s).astype(np.float32).astype(dtype)
          for p, s in expected_shapes(config).items()}
  return unflatten(flat)


def assert_trees_bit_identical(a, b):
  fa, fb = flatten(a), flatten(b)
  assert sorted(fa) == sorted(fb)
  for k in fa:
    x, y = np.asarray(fa[k]), np.asarray(fb[k])
    assert x.dtype == y.dtype, (k, x.dtype, y.dtype)
    assert x.shape == y.shape, (k, x.shape, y.shape)
    assert x.tobytes() == y.tobytes(), k
