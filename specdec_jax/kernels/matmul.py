"""The packed small-T matmul: weights packed once into panels, one pass over them per call.

Layout: a kernel W [D, F] (T5X's (in, out) orientation) becomes panels `w_PxDx16` with
P = ceil(F / 16): panel p holds columns [16p, 16p + 16) for all D rows, contiguous, the last panel
zero-padded. `packed_matmul(x, w_PxDx16, F)` computes x @ W with the C++ kernel registered by
`specdec_jax.kernels.build` (an XLA FFI custom call: it runs inside jit and `lax.while_loop` like
any op, with no host callback), or with XLA's dot over the same panels when the kernel could not be
built. Why a kernel at all: see DESIGN.md, "Machine facts", and the package docstring.

Panels are float32, bfloat16 or int8. bfloat16 panels hold weights that ARE bfloat16 values (a
checkpoint stored in bfloat16 and loaded as float32: `is_bfloat16_exact`): the kernel widens each
one exactly and multiplies in float32 in the same order, so the result is bit-for-bit the float32
panels' while the call streams half the bytes (the decode step is memory-bound on CPU).

int8 panels (`pack_int8_panels`) are lossy: symmetric per output column (scale = max |w| / 127),
each panel [D + 4, 16] its D rows of int8 weights followed by its 16 column scales stored as
float32 bytes, so a panel is one contiguous stream and the layout one array. They are for drafts:
a draft may propose from any distribution (the verifier uses the q it actually drew from, so the
output stays the target's), and its step inside the loop is paced by the bytes it reads back from
L3 after each target call (DESIGN.md, "Machine facts"). Never for a target.

q4 panels (`pack_q4_panels`, uint8) are lossy the same way, at 5 bits a weight: Q4_1's
quantization (GGUF's; the bytes are laid out in panels, not as GGUF stores them): 4-bit codes in
blocks of 32 inputs, a float16 scale and minimum per column and block, w = scale x code +
minimum. Why: SmolLM2-135M's GGUF stores its projections as Q4_1, so re-quantizing their float32
dequantization recovers those codes, and a q4 self-draft computes with the target's own weights
(its products differ from the target's in float32 rounding only) from 5/32 of the
float32 bytes, where int8 panels give a coarser copy (one scale per column) from 8/32. A panel
is D / 32 blocks of 20 rows of 16 bytes: 16 rows of code pairs (row k of a block: input 2k in
the low nibble, 2k + 1 in the high one), the 16 scales (2 rows), the 16 minimums (2 rows).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.kernels import build

PANEL = 16
PANEL_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
INT8 = jnp.dtype(jnp.int8)
SCALE_ROWS = 4  # an int8 panel's 16 float32 column scales, as 4 rows of 16 bytes
Q4 = jnp.dtype(jnp.uint8)
Q4_BLOCK = 32  # inputs per q4 block (Q4_1's)
Q4_ROWS = Q4_BLOCK // 2 + 4  # a block's rows: 16 of code pairs, 2 of scales, 2 of minimums


def panel_inputs(w_PxDx16: jax.Array) -> int:
  """D, the input features of panels (an int8 panel's rows include its scales; a q4 panel is
  D / 32 blocks of Q4_ROWS rows)."""
  if w_PxDx16.dtype == Q4:
    return w_PxDx16.shape[-2] // Q4_ROWS * Q4_BLOCK
  return w_PxDx16.shape[-2] - (SCALE_ROWS if w_PxDx16.dtype == INT8 else 0)


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
  if jnp.dtype(dtype) not in PANEL_DTYPES:
    raise ValueError(f"pack_panels: dtype must be float32 or bfloat16, got {jnp.dtype(dtype)} "
                     "(int8: pack_int8_panels)")
  return pack_panels_raw(jnp.asarray(w_DxF, jnp.float32).astype(dtype))


def pack_int8_panels(w_DxF) -> jax.Array:
  """[..., D, F] -> int8 panels [..., ceil(F / 16), D + 4, 16]: per output column the scale
  max |w| / 127 (1 for an all-zero column), the weights round(w / scale), the 16 scales of a panel
  as float32 bytes in its last 4 rows. Lossy (a draft's layout, never a target's)."""
  if w_DxF.ndim < 2:
    raise ValueError(f"pack_int8_panels expects an [..., in, out] kernel, got shape {w_DxF.shape}")
  *lead, d, f = w_DxF.shape
  w = jnp.asarray(w_DxF, jnp.float32)
  amax_F = jnp.max(jnp.abs(w), axis=-2)
  scale_F = jnp.where(amax_F > 0, amax_F / 127.0, 1.0)
  q = jnp.clip(jnp.round(w / scale_F[..., None, :]), -127, 127).astype(jnp.int8)
  q_PxDx16 = pack_panels_raw(q)
  scale_Px1x16 = pack_panels_raw(scale_F[..., None, :])  # [..., P, 1, 16] float32
  scale_bytes = jax.lax.bitcast_convert_type(scale_Px1x16, jnp.int8)  # [..., P, 1, 16, 4]
  scale_Px4x16 = scale_bytes.reshape(*scale_bytes.shape[:-3], SCALE_ROWS * PANEL // 4, 4
                                     ).reshape(*scale_bytes.shape[:-3], SCALE_ROWS, PANEL)
  return jnp.concatenate([q_PxDx16, scale_Px4x16], axis=-2)


def pack_q4_panels(w_DxF) -> jax.Array:
  """[..., D, F] -> q4 panels [..., ceil(F / 16), D / 32 x 20, 16] uint8 (module docstring): per
  column and block of 32 inputs the minimum m and scale d = (max - min) / 15, both rounded to
  float16, the codes round((w - m) / d) in [0, 15] (a constant block: d = 0, codes 0). D must be
  a multiple of 32. Lossy (a draft's layout, never a target's)."""
  if w_DxF.ndim < 2:
    raise ValueError(f"pack_q4_panels expects an [..., in, out] kernel, got shape {w_DxF.shape}")
  *lead, d, f = w_DxF.shape
  if d % Q4_BLOCK:
    raise ValueError(f"pack_q4_panels: the input dimension {d} is not a multiple of {Q4_BLOCK} "
                     "(q4 blocks run over 32 inputs); use int8 panels for this model")
  nb, p = d // Q4_BLOCK, num_panels(f)
  w = jnp.asarray(w_DxF, jnp.float32).reshape(*lead, nb, Q4_BLOCK, f)
  lo_BxF, hi_BxF = jnp.min(w, axis=-2), jnp.max(w, axis=-2)
  m16 = lo_BxF.astype(jnp.float16)
  d16 = ((hi_BxF - m16.astype(jnp.float32)) / 15.0).astype(jnp.float16)
  d32 = d16.astype(jnp.float32)
  safe = jnp.where(d32 > 0, d32, 1.0)
  q = jnp.where(d32[..., None, :] > 0,
                jnp.round((w - m16.astype(jnp.float32)[..., None, :]) / safe[..., None, :]), 0.0)
  q = jnp.clip(q, 0, 15).astype(jnp.uint8)  # [..., nb, 32, F]
  pairs = q[..., 0::2, :] | (q[..., 1::2, :] << 4)  # [..., nb, 16, F]
  pad = [(0, 0)] * (len(lead) + 2) + [(0, p * PANEL - f)]

  def rows_of(v_BxF):  # [..., nb, F] float16 -> [..., nb, p, 2, 16]: a panel's 16 as 32 bytes
    raw = jax.lax.bitcast_convert_type(v_BxF, jnp.uint8)  # [..., nb, F, 2]
    raw = jnp.pad(raw, [(0, 0)] * (len(lead) + 1) + [(0, p * PANEL - f), (0, 0)])
    return raw.reshape(*lead, nb, p, 2, PANEL)

  codes = jnp.pad(pairs, pad).reshape(*lead, nb, Q4_BLOCK // 2, p, PANEL)
  d_rows, m_rows = rows_of(d16), rows_of(m16)
  codes = jnp.moveaxis(codes, -2, -3)  # [..., nb, p, 16, 16]
  block = jnp.concatenate([codes, d_rows, m_rows], axis=-2)  # [..., nb, p, 20, 16]
  block = jnp.moveaxis(block, -4, -3)  # [..., p, nb, 20, 16]
  return block.reshape(*lead, p, nb * Q4_ROWS, PANEL)


def dequantize_q4_panels(w_PxRx16: jax.Array) -> jax.Array:
  """float32 panels [..., P, D, 16] holding what q4 panels compute with (d x code + m)."""
  *lead, p, rows, _ = w_PxRx16.shape
  nb = rows // Q4_ROWS
  block = w_PxRx16.reshape(*lead, p, nb, Q4_ROWS, PANEL)
  pairs = block[..., :Q4_BLOCK // 2, :]
  codes = jnp.stack([pairs & 0xF, pairs >> 4], axis=-2)  # [..., p, nb, 16, 2, 16]
  codes = codes.reshape(*lead, p, nb, Q4_BLOCK, PANEL).astype(jnp.float32)

  def halves(rows_2x16):  # [..., p, nb, 2, 16] bytes -> [..., p, nb, 1, 16] float32
    raw = rows_2x16.reshape(*lead, p, nb, PANEL, 2)
    return jax.lax.bitcast_convert_type(raw, jnp.float16).astype(jnp.float32)[..., None, :]

  scale = halves(block[..., Q4_BLOCK // 2:Q4_BLOCK // 2 + 2, :])
  minimum = halves(block[..., Q4_BLOCK // 2 + 2:, :])
  return (codes * scale + minimum).reshape(*lead, p, nb * Q4_BLOCK, PANEL)


def pack_panels_raw(w_DxF) -> jax.Array:
  """[..., D, F] -> [..., ceil(F / 16), D, 16] keeping the dtype (columns past F zero)."""
  *lead, d, f = w_DxF.shape
  p = num_panels(f)
  w = jnp.pad(w_DxF, [(0, 0)] * (len(lead) + 1) + [(0, p * PANEL - f)])
  return jnp.moveaxis(w.reshape(*lead, d, p, PANEL), -2, -3)


def int8_scales(w_PxDx16: jax.Array) -> jax.Array:
  """An int8 panel tree's column scales [..., P * 16] (float32)."""
  *lead, p, rows, _ = w_PxDx16.shape
  tail = w_PxDx16[..., rows - SCALE_ROWS:, :].reshape(*lead, p, PANEL, 4)
  return jax.lax.bitcast_convert_type(tail, jnp.float32).reshape(*lead, p * PANEL)


def dequantize_panels(w_PxDx16: jax.Array) -> jax.Array:
  """float32 panels [..., P, D, 16] holding what int8 panels compute with (q x scale)."""
  *lead, p, rows, _ = w_PxDx16.shape
  q = w_PxDx16[..., :rows - SCALE_ROWS, :].astype(jnp.float32)
  return q * int8_scales(w_PxDx16).reshape(*lead, p, 1, PANEL)


def unpack_panels(w_PxDx16, features: int) -> jax.Array:
  """The inverse of `pack_panels`, float32 (tests, and a packed tree's way back to the T5X
  layout); int8 and q4 panels come back dequantized."""
  if w_PxDx16.dtype == INT8:
    w_PxDx16 = dequantize_panels(w_PxDx16)
  elif w_PxDx16.dtype == Q4:
    w_PxDx16 = dequantize_q4_panels(w_PxDx16)
  *lead, p, d, _ = w_PxDx16.shape
  w_PxDx16 = jnp.asarray(w_PxDx16, jnp.float32)
  return jnp.moveaxis(w_PxDx16, -3, -2).reshape(*lead, d, p * PANEL)[..., :features]


def packed_matmul(x_NxD: jax.Array, w_PxDx16: jax.Array, features: int) -> jax.Array:
  """x [..., D] @ W [D, features] with W given as panels (float32, bfloat16, int8 with its
  scales, or q4); float32 in and out.

  Leading dimensions of x are flattened into rows: batch x tokens rows share one pass over the
  weights. Not differentiable (inference only: training never sees packed weights).
  """
  *lead, d = x_NxD.shape
  p, _, panel = w_PxDx16.shape
  if panel_inputs(w_PxDx16) != d or panel != PANEL or num_panels(features) != p:
    raise ValueError(f"packed_matmul: x [..., {d}] does not fit panels {w_PxDx16.shape} for "
                     f"{features} output features (need [ceil(F / 16), D, 16]; int8: "
                     f"[ceil(F / 16), D + {SCALE_ROWS}, 16]; q4: [ceil(F / 16), D / 32 x "
                     f"{Q4_ROWS}, 16])")
  x2 = jnp.asarray(x_NxD, jnp.float32).reshape(-1, d)
  dtype = w_PxDx16.dtype
  if build.load():
    name = {jnp.dtype(jnp.bfloat16): build.TARGET_NAME_BF16,
            INT8: build.TARGET_NAME_INT8, Q4: build.TARGET_NAME_Q4}.get(dtype, build.TARGET_NAME)
    call = jax.ffi.ffi_call(name, jax.ShapeDtypeStruct((x2.shape[0], features), jnp.float32))
    y = call(x2, w_PxDx16 if name != build.TARGET_NAME else jnp.asarray(w_PxDx16, jnp.float32))
  else:  # no compiler: the same product through XLA's dot (one log line said so)
    w = (dequantize_panels(w_PxDx16) if dtype == INT8 else dequantize_q4_panels(w_PxDx16)
         if dtype == Q4 else jnp.asarray(w_PxDx16, jnp.float32))
    y = jnp.einsum("nd,pdk->npk", x2, w).reshape(x2.shape[0], p * PANEL)[:, :features]
  return y.reshape(*lead, features)


def xla_matmul(x_NxD: jax.Array, w_DxF: jax.Array) -> jax.Array:
  """XLA's dot on the unpacked kernel, as the models compute it without the kernel."""
  return jnp.einsum("...i,io->...o", x_NxD, w_DxF)
