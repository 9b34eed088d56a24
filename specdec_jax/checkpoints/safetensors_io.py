"""Minimal safetensors reader/writer on numpy memory maps, bfloat16 included.

The format is an 8-byte little-endian header length, a JSON header
`{name: {dtype, shape, data_offsets}}` and raw little-endian bytes. Reading through `np.memmap`
keeps HF checkpoints lazy (a sharded load slices the map, never copies the whole file), and
handling BF16 via ml_dtypes avoids torch for the common case (`safetensors.numpy` has no bf16).
"""
from __future__ import annotations

import json
import os
import struct
from typing import Any, Mapping

import ml_dtypes
import numpy as np

_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype("<i8"), "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"), "I8": np.dtype("i1"), "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def read_header(path: str) -> tuple[dict[str, Any], int]:
  """Returns (tensor entries, byte offset where the data section starts).

  The header's length is checked against the file's size before it is read: a file whose first
  8 bytes lie (truncated, not safetensors) must give an error naming it, not a multi-GB read.
  """
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    prefix = f.read(8)
    if len(prefix) < 8:
      raise ValueError(f"{path}: not a safetensors file ({size} bytes, no header length)")
    (n,) = struct.unpack("<Q", prefix)
    if n > size - 8:
      raise ValueError(f"{path}: not a valid safetensors file: its header claims {n} bytes but "
                       f"the file has {size - 8} after the length field (truncated or corrupt?)")
    try:
      header = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise ValueError(f"{path}: the safetensors header is not valid JSON ({e})") from None
  if not isinstance(header, dict):
    raise ValueError(f"{path}: the safetensors header is not a JSON object")
  header.pop("__metadata__", None)
  return header, 8 + n


def open_file(path: str) -> dict[str, np.ndarray]:
  """{tensor name: read-only memory-mapped numpy array}."""
  header, start = read_header(path)
  size = os.path.getsize(path)
  out = {}
  for name, entry in header.items():
    dtype = _DTYPES.get(entry["dtype"])
    if dtype is None:
      raise ValueError(f"{path}: tensor {name} has unsupported dtype {entry['dtype']}")
    begin, end = entry["data_offsets"]
    shape = tuple(entry["shape"])
    if not 0 <= begin <= end or start + end > size or (
        end - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize):
      raise ValueError(f"{path}: tensor {name}'s data_offsets {[begin, end]} do not fit its "
                       f"shape {list(shape)} of {entry['dtype']} inside the file ({size} bytes)")
    if end == begin:
      out[name] = np.zeros(shape, dtype)
      continue
    out[name] = np.memmap(path, dtype=dtype, mode="r", offset=start + begin, shape=shape)
  return out


def save_file(tensors: Mapping[str, np.ndarray], path: str,
              metadata: Mapping[str, str] | None = None) -> None:
  """Writes tensors in name order with 8-byte aligned offsets (what the reference writer does)."""
  header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
  offset = 0
  arrays = {}
  for name in sorted(tensors):
    arr = np.ascontiguousarray(tensors[name])
    if arr.dtype.byteorder == ">":
      arr = arr.astype(arr.dtype.newbyteorder("<"))
    dtype_name = _NAMES.get(np.dtype(arr.dtype))
    if dtype_name is None:
      raise ValueError(f"cannot store {name} of dtype {arr.dtype} in safetensors")
    header[name] = {"dtype": dtype_name, "shape": list(arr.shape),
                    "data_offsets": [offset, offset + arr.nbytes]}
    arrays[name] = arr
    offset += arr.nbytes
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for name in sorted(arrays):
      f.write(arrays[name].tobytes())
