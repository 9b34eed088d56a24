"""Minimal safetensors reader/writer on numpy memory maps, bfloat16 included.

The format is an 8-byte little-endian header length, a JSON header
`{name: {dtype, shape, data_offsets}}` and raw little-endian bytes. Reading through `np.memmap`
keeps HF checkpoints lazy (a sharded load slices the map, never copies the whole file), and
handling BF16 via ml_dtypes avoids torch for the common case (`safetensors.numpy` has no bf16).
"""
from __future__ import annotations

import json
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
  """Returns (tensor entries, byte offset where the data section starts)."""
  with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
  header.pop("__metadata__", None)
  return header, 8 + n


def open_file(path: str) -> dict[str, np.ndarray]:
  """{tensor name: read-only memory-mapped numpy array}."""
  header, start = read_header(path)
  out = {}
  for name, entry in header.items():
    dtype = _DTYPES.get(entry["dtype"])
    if dtype is None:
      raise ValueError(f"{path}: tensor {name} has unsupported dtype {entry['dtype']}")
    begin, end = entry["data_offsets"]
    shape = tuple(entry["shape"])
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
