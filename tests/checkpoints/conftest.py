"""Fixtures for the checkpoint tests."""
import os

import pytest

from ckpt_testutil import T5X_TINY
from specdec_jax.models.model_config import get_preset


@pytest.fixture
def small_config():
  return get_preset("t5_test_draft")


@pytest.fixture
def t5x_tiny_path():
  if not os.path.exists(T5X_TINY):
    pytest.skip(f"T5X's own test checkpoint is absent at {T5X_TINY}; it lives in "
                "shared/reference/t5x_testdata beside the checkout (CI has it)")
  return T5X_TINY
