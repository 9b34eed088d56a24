"""Session fixture for tests/sharding. tests/conftest.py forces the 8 CPU devices they need."""
import pytest

from sharding_tiny import Runs


@pytest.fixture(scope="session")
def runs():
  return Runs()
