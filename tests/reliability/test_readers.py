"""Readers check before they trust: a lying safetensors header gives an error naming the file.

Before: a header length larger than the file was read as given (MemoryError on a 2^60 claim);
offsets past the end of the file mapped garbage or crashed inside numpy.
"""
import struct

import numpy as np
import pytest

from specdec_jax.checkpoints import safetensors_io


def _valid(path):
  safetensors_io.save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(path))
  return path.read_bytes()


def test_a_header_length_past_the_end_of_the_file_is_refused(tmp_path):
  path = tmp_path / "model.safetensors"
  data = _valid(path)
  path.write_bytes(struct.pack("<Q", 2 ** 60) + data[8:])
  with pytest.raises(ValueError, match=r"model\.safetensors.*header claims"):
    safetensors_io.open_file(str(path))


def test_a_truncated_file_is_refused(tmp_path):
  path = tmp_path / "model.safetensors"
  data = _valid(path)
  path.write_bytes(data[:-8])  # the last two floats are gone
  with pytest.raises(ValueError, match=r"model\.safetensors.*tensor w.*do not fit"):
    safetensors_io.open_file(str(path))
  path.write_bytes(data[:5])
  with pytest.raises(ValueError, match="no header length"):
    safetensors_io.open_file(str(path))


def test_a_header_that_is_not_json_is_refused(tmp_path):
  path = tmp_path / "model.safetensors"
  path.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{x" + b"\0" * 8)
  with pytest.raises(ValueError, match=r"model\.safetensors.*not valid JSON"):
    safetensors_io.open_file(str(path))


def test_a_valid_file_still_reads(tmp_path):
  path = tmp_path / "model.safetensors"
  _valid(path)
  np.testing.assert_array_equal(safetensors_io.open_file(str(path))["w"],
                                np.arange(6, dtype=np.float32).reshape(2, 3))
