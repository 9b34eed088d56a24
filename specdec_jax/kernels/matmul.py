"""The packed small-T matmul: weights packed once into panels, one pass over them per call.

Layout: a kernel W [D, F] (T5X's (in, out) orientation) becomes panels `w_PxDx16` with
P = ceil(F / 16): panel p holds columns [16p, 16p + 16) for all D rows, contiguous, the last panel
zero-padded. `packed_matmul(x, w_PxDx16, F)` computes x @ W with the C++ kernel registered by
`specdec_jax.kernels.build` (an XLA FFI custom call: it runs inside jit and `lax.while_loop` like
any op, with no host callback), or with XLA's dot over the same panels when the kernel could not be
built. Why a kernel at all: see DESIGN.md, "Machine facts", and the package docstring.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.kernels import build

PANEL = 16


def num_panels(features: int) -> int:
  return -(-features // PANEL)


def pack_panels(w_DxF) -> jax.Array:
  """[..., D, F] -> float32 panels [..., ceil(F / 16), D, 16] (columns past F zero).

  Leading axes (the layer axis of scanned layers) are kept."""
  if w_DxF.ndim < 2:
    raise ValueError(f"pack_panels expects an [..., in, out] kernel, got shape {w_DxF.shape}")
  *lead, d, f = w_DxF.shape
  p = num_panels(f)
  w = jnp.asarray(w_DxF, jnp.float32)
  w = jnp.pad(w, [(0, 0)] * (len(lead) + 1) + [(0, p * PANEL - f)])
  return jnp.moveaxis(w.reshape(*lead, d, p, PANEL), -2, -3)


def unpack_panels(w_PxDx16, features: int) -> jax.Array:
  """The inverse of `pack_panels` (tests, and a packed tree's way back to the T5X layout)."""
  *lead, p, d, _ = w_PxDx16.shape
  return jnp.moveaxis(w_PxDx16, -3, -2).reshape(*lead, d, p * PANEL)[..., :features]


def packed_matmul(x_NxD: jax.Array, w_PxDx16: jax.Array, features: int) -> jax.Array:
  """x [..., D] @ W [D, features] with W given as panels; float32 in and out.

  Leading dimensions of x are flattened into rows: batch x tokens rows share one pass over the
  weights. Not differentiable (inference only: training never sees packed weights).
  """
  *lead, d = x_NxD.shape
  p, dw, panel = w_PxDx16.shape
  if dw != d or panel != PANEL or num_panels(features) != p:
    raise ValueError(f"packed_matmul: x [..., {d}] does not fit panels {w_PxDx16.shape} for "
                     f"{features} output features (need [ceil(F / 16), D, 16])")
  x2 = jnp.asarray(x_NxD, jnp.float32).reshape(-1, d)
  if build.load():
    call = jax.ffi.ffi_call(build.TARGET_NAME,
                            jax.ShapeDtypeStruct((x2.shape[0], features), jnp.float32))
    y = call(x2, jnp.asarray(w_PxDx16, jnp.float32))
  else:  # no compiler: the same product through XLA's dot (one log line said so)
    y = jnp.einsum("nd,pdk->npk", x2, w_PxDx16).reshape(x2.shape[0], p * PANEL)[:, :features]
  return y.reshape(*lead, features)


def xla_matmul(x_NxD: jax.Array, w_DxF: jax.Array) -> jax.Array:
  """XLA's dot on the unpacked kernel, as the models compute it without the kernel."""
  return jnp.einsum("...i,io->...o", x_NxD, w_DxF)
