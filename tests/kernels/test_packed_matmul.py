"""The packed kernel computes x @ W like XLA's dot, for every row count and odd shapes.

Why: the kernel replaces XLA's dot in every decode-step projection and the output head, so any
error in the panel layout, the row chunking (rows beyond 6 are further passes), the zero-padded
last panel (F not a multiple of 16) or the thread split would change the logits the acceptance
rule compares. Float64 numpy is the reference; float32 tolerance.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.kernels import build
from specdec_jax.kernels import matmul as km

SHAPES = [(64, 48), (37, 53), (5, 17), (16, 16), (100, 1), (1, 33)]  # (D, F)


@pytest.fixture(scope="module", autouse=True)
def _kernel_built():
  assert build.load(), "the kernel library did not build (see the log line)"


def _reference(x, w):
  return np.asarray(x, np.float64) @ np.asarray(w, np.float64)


def _check(y, x, w):
  ref = _reference(x, w)
  scale = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(w, np.float64)) + 1e-30
  np.testing.assert_array_less(np.abs(np.asarray(y, np.float64) - ref) / scale, 1e-5)


def _check_every_row_count(rng, panels, deq_DxF, target_name):
  """`panels` times 1..16 rows is x @ `deq_DxF` to float32 accuracy, a row's result the same
  whatever rows come with it, through the custom call `target_name`."""
  d, f = deq_DxF.shape
  mm = jax.jit(km.packed_matmul, static_argnums=2)
  x = rng.standard_normal((16, d)).astype(np.float32)
  alone = np.asarray(mm(x[:1], panels, f))
  for t in range(1, 17):
    y = mm(x[:t], panels, f)
    _check(y, x[:t], deq_DxF)
    np.testing.assert_array_equal(np.asarray(y)[:1], alone)
  assert f'custom_call_target="{target_name}"' in mm.lower(x, panels, f).compile().as_text()


@pytest.mark.parametrize("d,f", SHAPES)
def test_matches_reference_for_every_row_count_up_to_16(d, f):
  rng = np.random.default_rng(d * 1000 + f)
  w = rng.standard_normal((d, f)).astype(np.float32)
  panels = km.pack_panels(w)
  mm = jax.jit(km.packed_matmul, static_argnums=2)
  for t in range(1, 17):
    x = rng.standard_normal((t, d)).astype(np.float32)
    y = mm(x, panels, f)
    assert y.shape == (t, f) and y.dtype == jnp.float32
    _check(y, x, w)
    np.testing.assert_allclose(np.asarray(y), np.asarray(km.xla_matmul(x, w)), rtol=1e-5,
                               atol=1e-5)


def test_many_rows_leading_dims_and_threaded_panels():
  """B x T rows (flattened), more rows than one chunk, and a matrix big enough for the pool."""
  rng = np.random.default_rng(1)
  d, f = 256, 1030  # 65 panels of 256 x 16: above the threading threshold, F % 16 = 6
  w = rng.standard_normal((d, f)).astype(np.float32)
  x = rng.standard_normal((3, 13, d)).astype(np.float32)
  y = jax.jit(km.packed_matmul, static_argnums=2)(x, km.pack_panels(w), f)
  assert y.shape == (3, 13, f)
  _check(np.asarray(y).reshape(-1, f), x.reshape(-1, d), w)


def test_each_row_is_independent_of_the_others():
  """A row's result is bitwise the same whatever rows it is computed with (one accumulation
  order per row): a verify block scores its first token exactly as a single-token step does."""
  rng = np.random.default_rng(2)
  d, f = 96, 80
  w = km.pack_panels(rng.standard_normal((d, f)).astype(np.float32))
  x = rng.standard_normal((16, d)).astype(np.float32)
  mm = jax.jit(km.packed_matmul, static_argnums=2)
  alone = np.asarray(mm(x[:1], w, f))
  for t in range(2, 17):
    np.testing.assert_array_equal(np.asarray(mm(x[:t], w, f))[:1], alone)


def test_pack_layout_and_round_trip():
  w = np.arange(3 * 20, dtype=np.float32).reshape(3, 20)
  panels = np.asarray(km.pack_panels(w))
  assert panels.shape == (2, 3, 16)
  np.testing.assert_array_equal(panels[0], w[:, :16])
  np.testing.assert_array_equal(panels[1, :, :4], w[:, 16:])
  assert not panels[1, :, 4:].any()  # zero padding past F
  np.testing.assert_array_equal(np.asarray(km.unpack_panels(panels, 20)), w)
  stacked = np.stack([w, w + 1])  # scanned layers: a leading layer axis is kept
  assert km.pack_panels(stacked).shape == (2, 2, 3, 16)
  np.testing.assert_array_equal(np.asarray(km.unpack_panels(km.pack_panels(stacked), 20)),
                                stacked)


def test_shape_mismatch_is_named():
  panels = km.pack_panels(np.ones((8, 20), np.float32))
  with pytest.raises(ValueError, match="does not fit panels"):
    km.packed_matmul(jnp.ones((2, 9)), panels, 20)
  with pytest.raises(ValueError, match="does not fit panels"):
    km.packed_matmul(jnp.ones((2, 8)), panels, 40)


def test_runs_inside_jit_and_while_loop_as_a_custom_call_without_host_ops():
  rng = np.random.default_rng(3)
  w = rng.standard_normal((24, 24)).astype(np.float32) / 5
  panels = km.pack_panels(w)

  def loop(x):
    return jax.lax.fori_loop(0, 5, lambda i, x: jnp.tanh(km.packed_matmul(x, panels, 24)), x)
  x = rng.standard_normal((3, 24)).astype(np.float32)
  compiled = jax.jit(loop).lower(x).compile().as_text()
  assert re.search(r"\bwhile\(", compiled)
  assert f'custom_call_target="{build.TARGET_NAME}"' in compiled
  assert "callback" not in compiled
  want = x.astype(np.float64)
  for _ in range(5):
    want = np.tanh(want @ w)
  np.testing.assert_allclose(np.asarray(jax.jit(loop)(x)), want, rtol=1e-5, atol=1e-5)


def _bf16_values(a):
  return np.asarray(jnp.asarray(a, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32))


@pytest.mark.parametrize("d,f", SHAPES + [(256, 1030)])
def test_bfloat16_panels_are_bit_identical_to_float32_panels_of_bfloat16_weights(d, f):
  """Weights that are bfloat16 values (a bfloat16 checkpoint loaded as float32): bfloat16 panels
  give bit-for-bit the float32 panels' product (the widening is exact, the order the same) from
  half the bytes. (256, 1030) runs on the thread pool; rows 1..16 cover every chunking."""
  rng = np.random.default_rng(d + 7 * f)
  w = _bf16_values(rng.standard_normal((d, f)))
  assert km.is_bfloat16_exact(w) and not km.is_bfloat16_exact(w + 1e-4)
  p32, p16 = km.pack_panels(w), km.pack_panels(w, jnp.bfloat16)
  assert p16.dtype == jnp.bfloat16 and p16.nbytes * 2 == p32.nbytes
  mm = jax.jit(km.packed_matmul, static_argnums=2)
  for t in range(1, 17):
    x = rng.standard_normal((t, d)).astype(np.float32)
    y16 = mm(x, p16, f)
    np.testing.assert_array_equal(np.asarray(y16), np.asarray(mm(x, p32, f)))
    _check(y16, x, w)
  hlo = jax.jit(km.packed_matmul, static_argnums=2).lower(x, p16, f).compile().as_text()
  assert f'custom_call_target="{build.TARGET_NAME_BF16}"' in hlo
  np.testing.assert_array_equal(np.asarray(km.unpack_panels(p16, f)), w)


def test_pack_panels_refuses_other_dtypes():
  with pytest.raises(ValueError, match="float32 or bfloat16"):
    km.pack_panels(np.ones((4, 4), np.float32), jnp.float16)


@pytest.mark.parametrize("d,f", SHAPES + [(256, 1030)])
def test_int8_panels_compute_their_dequantized_weights(d, f):
  """int8 panels (a draft's lossy layout): per column, the weights round to the nearest multiple
  of scale = max |w| / 127 (an all-zero column stays zero), the scales ride in each panel's last
  4 rows, and the kernel computes x @ (q x scale) to float32 accuracy for every row count, each
  row bitwise the same whatever rows it comes with. (256, 1030) runs on the thread pool."""
  rng = np.random.default_rng(d + 11 * f)
  w = rng.standard_normal((d, f)).astype(np.float32)
  w[:, 0] = 0.0
  p8 = km.pack_int8_panels(w)
  assert p8.dtype == jnp.int8 and p8.shape == (km.num_panels(f), d + km.SCALE_ROWS, 16)
  assert km.panel_inputs(p8) == d
  scale_F = np.asarray(km.int8_scales(p8))[:f]
  np.testing.assert_allclose(scale_F[1:], np.abs(w[:, 1:]).max(axis=0) / 127, rtol=1e-6)
  assert scale_F[0] == 1.0
  deq = np.asarray(km.unpack_panels(p8, f))
  assert (np.abs(deq - w) <= scale_F / 2 * (1 + 1e-5)).all()
  np.testing.assert_allclose(deq / scale_F, np.round(w / scale_F), atol=1e-4)
  assert not deq[:, 0].any()
  _check_every_row_count(rng, p8, deq, build.TARGET_NAME_INT8)


@pytest.mark.parametrize("layout", ["int8", "q4"])
def test_lossy_panels_without_the_kernel_compute_the_same(layout, monkeypatch):
  """No compiler: XLA's dot over the dequantized panels, the same product. Refused by name: x
  as wide as an int8 panel's rows (its scales are not inputs), a q4 width not a multiple of 32."""
  rng = np.random.default_rng(5)
  d = 40 if layout == "int8" else 64
  w = rng.standard_normal((d, 37)).astype(np.float32)
  x = rng.standard_normal((3, d)).astype(np.float32)
  pw = km.pack_int8_panels(w) if layout == "int8" else km.pack_q4_panels(w)
  with_kernel = np.asarray(km.packed_matmul(x, pw, 37))
  monkeypatch.setattr(build, "load", lambda: False)
  without = np.asarray(km.packed_matmul(x, pw, 37))
  np.testing.assert_allclose(without, with_kernel, rtol=1e-5, atol=1e-5)
  if layout == "int8":
    with pytest.raises(ValueError, match="does not fit panels"):
      km.packed_matmul(jnp.ones((2, 44)), pw, 37)
  else:
    with pytest.raises(ValueError, match="not a multiple of 32"):
      km.pack_q4_panels(np.ones((48, 16), np.float32))


@pytest.mark.parametrize("d,f", [(64, 48), (96, 53), (32, 1), (256, 1030)])
def test_q4_panels_compute_their_dequantized_weights(d, f):
  """q4 panels (a draft's lossy layout, GGUF's Q4_1): per column and block of 32 inputs a
  float16 minimum and scale (max - min) / 15, codes in [0, 15] within half a step of each weight
  (a constant column: scale 0, every weight its minimum); the kernel computes x @ dequantized to
  float32 accuracy for every row count (1..16: one to three passes per panel), each row bitwise
  the same whatever rows it comes with. (256, 1030) runs on the thread pool."""
  rng = np.random.default_rng(d + 13 * f)
  w = rng.standard_normal((d, f)).astype(np.float32)
  w[:, 0] = 0.25
  p4 = km.pack_q4_panels(w)
  assert p4.dtype == jnp.uint8 and p4.shape == (km.num_panels(f), d // 32 * km.Q4_ROWS, 16)
  assert km.panel_inputs(p4) == d
  deq = np.asarray(km.unpack_panels(p4, f))
  blocks = w.reshape(d // 32, 32, f)
  lo, hi = blocks.min(axis=1), blocks.max(axis=1)
  step = (hi - lo) / 15
  err = np.abs(deq - w).reshape(d // 32, 32, f)
  assert (err <= (step / 2 + (np.abs(lo) + np.abs(hi)) * 2 ** -10)[:, None, :] + 1e-6).all()
  np.testing.assert_array_equal(deq[:, 0], np.full(d, 0.25, np.float32))
  _check_every_row_count(rng, p4, deq, build.TARGET_NAME_Q4)


def test_q4_panels_recover_q4_1_weights_exactly():
  """Weights that are Q4_1 values (float16 scale and minimum per block of 32, codes 0..15 with
  both ends used, as llama.cpp's quantizer leaves them: SmolLM2's GGUF projections) come back
  bit for bit: a q4 self-draft of a Q4_1 checkpoint computes with the target's own weights."""
  rng = np.random.default_rng(7)
  d, f = 96, 40
  codes = rng.integers(0, 16, (d // 32, 32, f))
  codes[:, 3, :], codes[:, 17, :] = 0, 15
  scale = (rng.random((d // 32, 1, f)) * 0.02 + 1e-3).astype(np.float16).astype(np.float32)
  minimum = (-rng.random((d // 32, 1, f)) * 0.1).astype(np.float16).astype(np.float32)
  w = (scale * codes + minimum).reshape(d, f).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(km.unpack_panels(km.pack_q4_panels(w), f)), w)
