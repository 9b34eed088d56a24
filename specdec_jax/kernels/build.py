"""Compiles the kernels' C++ at first use into a per-user cache and registers them with XLA.

Why at first use and not at install: `-march=native` must see the machine that runs the program,
and the FFI headers must be those of the jaxlib that loads the library. The cache key hashes the
source, the jax/jaxlib versions, the compiler, its flags and the CPU's feature flags, so a library
is rebuilt exactly when one of them changes (a home directory shared between machines included).
The build writes to a temporary name and renames it, so two processes building at once both end
with a complete library.

Without a compiler, or when the build fails, `load()` returns False and logs one line; callers
then use XLA's dot (see `specdec_jax.kernels.matmul`).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from typing import Optional

import jax
from absl import logging

SOURCE = "packed_matmul.cc"
TARGET_NAME = "specdec_packed_matmul"  # the custom call's name in the compiled program
SYMBOL = "SpecdecPackedMatmul"
TARGET_NAME_BF16 = "specdec_packed_matmul_bf16"  # the same product over bfloat16 panels
SYMBOL_BF16 = "SpecdecPackedMatmulBf16"
TARGET_NAME_INT8 = "specdec_packed_matmul_int8"  # over int8 panels with their column scales
SYMBOL_INT8 = "SpecdecPackedMatmulI8"
TARGET_NAME_Q4 = "specdec_packed_matmul_q4"  # over q4 panels (4-bit blocks of 32, Q4_1's layout)
SYMBOL_Q4 = "SpecdecPackedMatmulQ4"
TARGET_NAME_CACHE_WRITE = "specdec_cache_write"  # a cache block written in place (cache_write)
SYMBOL_CACHE_WRITE = "SpecdecCacheWrite"
TARGET_NAME_ATTN_LOGITS = "specdec_attention_logits"  # q k^T + bias over filled slots
SYMBOL_ATTN_LOGITS = "SpecdecAttentionLogits"
TARGET_NAME_ATTN_VALUES = "specdec_attention_values"  # weights x v over filled slots
SYMBOL_ATTN_VALUES = "SpecdecAttentionValues"
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno")
BUILD_TIMEOUT_S = 300


def cache_dir() -> str:
  """`$SPECDEC_JAX_CACHE_DIR`, else `$XDG_CACHE_HOME/specdec_jax`, else `~/.cache/specdec_jax`."""
  explicit = os.environ.get("SPECDEC_JAX_CACHE_DIR")
  if explicit:
    return explicit
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "specdec_jax")


def compiler() -> Optional[str]:
  """`$CXX` or g++ on the PATH (None: no compiler, the kernels are off)."""
  return shutil.which(os.environ.get("CXX", "g++"))


def _cpu_flags() -> str:
  """The CPU's feature flags: `-march=native` output is only valid on a CPU that has them."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("flags"):
          return line
  except OSError:
    pass
  import platform  # pylint: disable=import-outside-toplevel
  return platform.machine() + platform.processor()


def _source_bytes() -> bytes:
  return resources.files("specdec_jax.kernels").joinpath(SOURCE).read_bytes()


def library_path(cxx: str) -> str:
  import jaxlib  # pylint: disable=import-outside-toplevel
  version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
  key = hashlib.sha256()
  for part in (_source_bytes(), jax.__version__, jaxlib.__version__, cxx, version, " ".join(FLAGS),
               _cpu_flags()):
    key.update(part if isinstance(part, bytes) else part.encode())
  return os.path.join(cache_dir(), "kernels", key.hexdigest()[:16], "libspecdec_kernels.so")


def build(cxx: str, out_path: str) -> None:
  """Compiles the source into `out_path` (atomically). Raises RuntimeError with the compiler's
  message on failure."""
  os.makedirs(os.path.dirname(out_path), exist_ok=True)
  with tempfile.TemporaryDirectory(dir=os.path.dirname(out_path)) as tmp:
    src = os.path.join(tmp, SOURCE)
    with open(src, "wb") as f:
      f.write(_source_bytes())
    lib = os.path.join(tmp, "lib.so")
    cmd = [cxx, *FLAGS, "-I", jax.ffi.include_dir(), src, "-o", lib]
    try:
      proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                            check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
      raise RuntimeError(f"{' '.join(cmd)} failed: {e}") from e
    if proc.returncode != 0:
      raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    os.replace(lib, out_path)


@functools.lru_cache(maxsize=None)
def load() -> bool:
  """Builds (once per cache key) and registers the kernels with XLA:CPU. True if they are usable.

  Cached per process, so the log line about a missing compiler or a failed build appears once.
  """
  cxx = compiler()
  if cxx is None:
    logging.warning("specdec_jax kernels off: no C++ compiler ($CXX or g++) found; dense layers "
                    "use XLA's dot")
    return False
  try:
    path = library_path(cxx)
    if not os.path.exists(path):
      build(cxx, path)
    lib = ctypes.cdll.LoadLibrary(path)
    for name, symbol in ((TARGET_NAME, SYMBOL), (TARGET_NAME_BF16, SYMBOL_BF16),
                         (TARGET_NAME_INT8, SYMBOL_INT8), (TARGET_NAME_Q4, SYMBOL_Q4),
                         (TARGET_NAME_CACHE_WRITE, SYMBOL_CACHE_WRITE),
                         (TARGET_NAME_ATTN_LOGITS, SYMBOL_ATTN_LOGITS),
                         (TARGET_NAME_ATTN_VALUES, SYMBOL_ATTN_VALUES)):
      jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
  except (RuntimeError, OSError, AttributeError) as e:
    logging.warning("specdec_jax kernels off: building or loading %s failed (%s); dense layers "
                    "use XLA's dot", SOURCE, e)
    return False
  return True
