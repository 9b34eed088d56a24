"""The packed small-T matmul: weights packed once into panels, one pass over them per call.

Layout: a kernel W [D, F] (T5X's (in, out) orientation) becomes panels `w_PxDx16` with
P = ceil(F / 16): panel p holds columns [16p, 16p + 16) for all D rows, contiguous, the last panel
zero-padded. `packed_matmul(x, w_PxDx16, F)` computes x @ W with the C++ kernel registered by
`specdec_jax.kernels.build` (an XLA FFI custom call: it runs inside jit and `lax.while_loop` like
any op, with no host callback), or with XLA's dot over the same panels when the kernel could not be
built. Why a kernel at all: see DESIGN.md, "Machine facts", and the package docstring.

Panels are float32 or bfloat16. bfloat16 panels hold weights that ARE bfloat16 values (a checkpoint
stored in bfloat16 and loaded as float32: `is_bfloat16_exact`): the kernel widens each one exactly
and multiplies in float32 in the same order, so the result is bit-for-bit the float32 panels' while
the call streams half the bytes (the decode step is memory-bound on CPU).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.kernels import build

PANEL = 16
PANEL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def num_panels(features: int) -> int:
  return -(-features // PANEL)


def is_bfloat16_exact(w) -> bool:
  """Whether every entry of `w` is a bfloat16 value (so bfloat16 panels lose nothing)."""
  w = jnp.asarray(w, jnp.float32)
  return bool(jnp.array_equal(w, w.astype(jnp.bfloat16).astype(jnp.float32)))


def pack_panels(w_DxF, dtype=jnp.float32) -> jax.Array:
  """[..., D, F] -> panels [..., ceil(F / 16), D, 16] of `dtype` (float32 or bfloat16; columns
  past F zero). bfloat16 rounds: pack only weights that are bfloat16 values (`is_bfloat16_exact`).

  Leading axes (the layer axis of scanned layers) are kept."""
  if w_DxF.ndim < 2:
    raise ValueError(f"pack_panels expects an [..., in, out] kernel, got shape {w_DxF.shape}")
  *lead, d, f = w_DxF.shape
  p = num_panels(f)
  if jnp.dtype(dtype) not in PANEL_DTYPES:
    raise ValueError(f"pack_panels: dtype must be float32 or bfloat16, got {jnp.dtype(dtype)}")
  w = jnp.asarray(w_DxF, jnp.float32).astype(dtype)
  w = jnp.pad(w, [(0, 0)] * (len(lead) + 1) + [(0, p * PANEL - f)])
  return jnp.moveaxis(w.reshape(*lead, d, p, PANEL), -2, -3)


def unpack_panels(w_PxDx16, features: int) -> jax.Array:
  """The inverse of `pack_panels`, float32 (tests, and a packed tree's way back to the T5X
  layout)."""
  *lead, p, d, _ = w_PxDx16.shape
  w_PxDx16 = jnp.asarray(w_PxDx16, jnp.float32)
  return jnp.moveaxis(w_PxDx16, -3, -2).reshape(*lead, d, p * PANEL)[..., :features]


def packed_matmul(x_NxD: jax.Array, w_PxDx16: jax.Array, features: int) -> jax.Array:
  """x [..., D] @ W [D, features] with W given as panels (float32 or bfloat16); float32 in and
  out.

  Leading dimensions of x are flattened into rows: batch x tokens rows share one pass over the
  weights. Not differentiable (inference only: training never sees packed weights).
  """
  *lead, d = x_NxD.shape
  p, dw, panel = w_PxDx16.shape
  if dw != d or panel != PANEL or num_panels(features) != p:
    raise ValueError(f"packed_matmul: x [..., {d}] does not fit panels {w_PxDx16.shape} for "
                     f"{features} output features (need [ceil(F / 16), D, 16])")
  x2 = jnp.asarray(x_NxD, jnp.float32).reshape(-1, d)
  bf16 = w_PxDx16.dtype == jnp.bfloat16
  if build.load():
    call = jax.ffi.ffi_call(build.TARGET_NAME_BF16 if bf16 else build.TARGET_NAME,
                            jax.ShapeDtypeStruct((x2.shape[0], features), jnp.float32))
    y = call(x2, w_PxDx16 if bf16 else jnp.asarray(w_PxDx16, jnp.float32))
  else:  # no compiler: the same product through XLA's dot (one log line said so)
    w = jnp.asarray(w_PxDx16, jnp.float32)
    y = jnp.einsum("nd,pdk->npk", x2, w).reshape(x2.shape[0], p * PANEL)[:, :features]
  return y.reshape(*lead, features)


def xla_matmul(x_NxD: jax.Array, w_DxF: jax.Array) -> jax.Array:
  """XLA's dot on the unpacked kernel, as the models compute it without the kernel."""
  return jnp.einsum("...i,io->...o", x_NxD, w_DxF)
