"""Compile one program for the slice and read what the compiler says about it.

Why the compiler's figures: per-chip argument, output and temporary bytes come from
`compiled.memory_analysis()` after the TPU compiler has partitioned, fused and scheduled the
program, so they include what a hand count misses (gathered weights, fusion temporaries, the while
loop's buffers). The budget is the compiler's own usable HBM per chip ("available HBM" in its
out-of-memory message: the chip's HBM minus what the runtime reserves), measured once per slice by
compiling a program that cannot fit. A program that does not fit either fails to compile
(RESOURCE_EXHAUSTED, whose message names the bytes needed) or compiles with a total over the
budget; both are reported as `fits: false` with the bytes needed and available, not a traceback.
The total counts what the program needs on a chip while the runner runs it: its arguments (plus the
weights it does not read, which stay resident), its outputs, temporaries and code, with donated
buffers that an output reuses counted once.

flops and bytes_accessed are XLA's cost analysis of one chip's program; a while loop's body is
counted once, not once per iteration.
"""
from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from specdec_jax.aot import hlo

_OOM = re.compile(r"RESOURCE_EXHAUSTED|Ran out of memory", re.I)
_SIZE = r"([\d.]+)\s*([KMGT]?i?B?)"
_NEEDED = re.compile(r"required for ([\w\s]+?) \(" + _SIZE + r"\) exceeds available HBM \(" +
                     _SIZE + r"\)")
_AVAILABLE = re.compile(r"available HBM \(" + _SIZE + r"\)")
_UNITS = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def parse_size(number: str, unit: str) -> int:
  """'30.75', 'G' -> bytes (the TPU compiler prints binary units: G = GiB)."""
  return int(round(float(number) * _UNITS[unit[:1].upper() if unit else ""]))


def usable_hbm_bytes(devices) -> Optional[int]:
  """The compiler's usable HBM per chip, from the message of a program that cannot fit (a 1 TiB
  argument on one chip); None if the message does not say."""
  mesh = Mesh(np.asarray(devices[:1]), ("x",))
  huge = jax.ShapeDtypeStruct((2 ** 40 // 4,), np.float32, sharding=NamedSharding(mesh, P()))
  try:
    jax.jit(lambda x: x[:8] * 2).lower(huge).compile()
  except Exception as e:  # pylint: disable=broad-except  (JaxRuntimeError; the message is the point)
    m = _AVAILABLE.search(str(e))
    if m:
      return parse_size(*m.groups())
  return None


@dataclasses.dataclass
class Result:
  """What one compile says; `record()` is the aot.json object."""
  program: str
  kind: str
  compiled: Any = None
  per_chip_bytes: dict = dataclasses.field(default_factory=dict)
  fits: Optional[bool] = None
  needed_bytes: Optional[int] = None
  available_bytes: Optional[int] = None
  flops: Optional[float] = None
  bytes_accessed: Optional[float] = None
  optimal_seconds: Optional[float] = None  # the TPU cost model's own estimate, where it gives one
  host_transfers: list = dataclasses.field(default_factory=list)
  compile_seconds: Optional[float] = None
  error: Optional[str] = None
  info: dict = dataclasses.field(default_factory=dict)


def per_chip_bytes(x: jax.ShapeDtypeStruct) -> int:
  """Bytes one chip holds of an abstract array (its shard under the array's sharding)."""
  shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    itemsize = 8  # a threefry key: two uint32
  else:
    itemsize = np.dtype(x.dtype).itemsize
  return int(np.prod(shape, dtype=np.int64)) * itemsize


def unused_argument_bytes(lowered, args, kwargs) -> int:
  """Per-chip bytes of the arguments the program never reads (jit drops them: an autoregressive
  step reads no encoder weights). The runner keeps every model's weights on the chip all the
  same, so they count against the budget. 0 if jax's bookkeeping is not what this expects."""
  leaves = [x for x in jax.tree.leaves((args, kwargs)) if isinstance(x, jax.ShapeDtypeStruct)]
  try:
    compile_args = lowered._lowering.compile_args  # pylint: disable=protected-access
    kept = compile_args["kept_var_idx"]
    if len(compile_args["all_args_info"].in_avals) != len(leaves):
      return 0
  except (AttributeError, KeyError, TypeError):
    return 0
  return sum(per_chip_bytes(x) for i, x in enumerate(leaves) if i not in kept)


def compile_program(name: str, kind: str, call, available: Optional[int], *,
                    has_loop: bool) -> Result:
  """Lowers `fn(*args, **kwargs)` (`call` = (fn, args, kwargs)) and compiles it; memory, cost
  and host transfers of the result."""
  fn, args, kwargs = call
  res = Result(name, kind, available_bytes=available)
  t0 = time.perf_counter()
  lowered = fn.lower(*args, **kwargs)
  unused = unused_argument_bytes(lowered, args, kwargs)
  try:
    compiled = lowered.compile()
  except Exception as e:  # pylint: disable=broad-except
    res.compile_seconds = round(time.perf_counter() - t0, 2)
    text = str(e)
    if not _OOM.search(text):
      raise
    res.fits = False
    m = _NEEDED.search(text)
    if m:
      res.needed_bytes = parse_size(m.group(2), m.group(3))
      res.available_bytes = parse_size(m.group(4), m.group(5))
      res.error = f"compiler: {m.group(0)}"
    else:
      res.error = text.splitlines()[0][:300]
    return res
  res.compile_seconds = round(time.perf_counter() - t0, 2)
  res.compiled = compiled
  mem = compiled.memory_analysis()
  b = dict(arguments=int(mem.argument_size_in_bytes), outputs=int(mem.output_size_in_bytes),
           temporaries=int(mem.temp_size_in_bytes), aliased=int(mem.alias_size_in_bytes),
           code=int(mem.generated_code_size_in_bytes), unused_arguments=unused)
  # Donated arguments that an output reuses are counted once (`aliased`); weights the program
  # does not read are on the chip all the same (`unused_arguments`).
  b["total"] = (b["arguments"] + unused + b["outputs"] - b["aliased"] + b["temporaries"] +
                b["code"])
  res.per_chip_bytes = b
  res.needed_bytes = b["total"]
  res.fits = available is None or b["total"] <= available
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
  res.flops = float(cost.get("flops", 0.0))
  res.bytes_accessed = float(cost.get("bytes accessed", 0.0))
  if "optimal_seconds" in cost:
    res.optimal_seconds = float(cost["optimal_seconds"])
  text = compiled.as_text()
  if has_loop and hlo.count_whiles(text) == 0:
    raise RuntimeError(f"{name}: the compiled program holds no while loop; expected the decode "
                       "loop (was it unrolled or removed?)")
  res.host_transfers = hlo.host_transfers_in_loops(text)
  return res
