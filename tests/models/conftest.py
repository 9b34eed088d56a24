"""Core tests run with strict rank promotion: an implicit broadcast is an error here."""
import jax
import pytest


@pytest.fixture(autouse=True)
def _strict_rank_promotion():
  with jax.numpy_rank_promotion("raise"):
    yield
