"""kernels/decode_attention: attention over the filled slots only, exact where decoding needs it.

Why: the calls skip every slot at or past the limit, so (1) what they compute over the filled
slots must be q k^T + bias and weights x v; (2) a larger limit whose extra slots the bias masks
must give the same bits (a T-token verify reads further than a 1-token step at the same
position); (3) a query row must not depend on the other rows of its call (the verify's rows
against the autoregressive step's); (4) the model's layer takes this path where the kernels
run, or none of it matters.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.kernels import build, decode_attention
from specdec_jax.models import packed
from specdec_jax.testing import tiny_pair

pytestmark = pytest.mark.skipif(not build.load(), reason="the kernels did not build")


def _inputs(t=4, heads=3, groups=3, dim=16, slots=96, index=(30, 70), bias_heads=1, seed=0):
  rng = np.random.default_rng(seed)
  b, r = len(index), heads * t
  q = rng.normal(size=(b, groups, r, dim)).astype(np.float32)
  k = rng.normal(size=(b, groups, dim, slots)).astype(np.float32)
  v = rng.normal(size=(b, groups, slots, dim)).astype(np.float32)
  pos_BxT = np.asarray(index)[:, None] + np.arange(t)[None]
  visible_BxTxS = np.arange(slots)[None, None] <= pos_BxT[:, :, None]
  bias = np.where(visible_BxTxS, 0.0, -1e9).astype(np.float32)[:, None]
  if bias_heads > 1:  # a per-head bias (T5's relative positions): every head its own offset
    bias = bias + rng.normal(size=(b, groups * heads, t, slots)).astype(np.float32)
  return q, k, v, bias, (np.asarray(index) + t).astype(np.int32)


@pytest.mark.parametrize("bias_heads", [1, 9])
def test_the_calls_compute_attention_over_the_filled_slots(bias_heads):
  q, k, v, bias, limit = _inputs(bias_heads=bias_heads)
  b, g, r, _ = q.shape
  t = bias.shape[2]
  logits = np.asarray(decode_attention.logits(q, k, bias, limit))
  # bias rows for each (group, row): head g * (r / t) + row // t (one head: head 0), position
  heads = np.arange(g)[:, None] * (r // t) + np.arange(r)[None] // t
  bias_BxGxRxS = bias[:, heads if bias_heads > 1 else np.zeros_like(heads), np.arange(r) % t]
  want = np.einsum("bgrk,bgks->bgrs", q, k) + bias_BxGxRxS
  for e in range(b):
    np.testing.assert_allclose(logits[e, ..., :limit[e]], want[e, ..., :limit[e]], rtol=1e-5,
                               atol=1e-4)
    assert np.all(np.isneginf(logits[e, ..., limit[e]:]))  # the weight a masked slot gets: 0
  w = np.asarray(jax.nn.softmax(jnp.asarray(logits), axis=-1))
  y = np.asarray(decode_attention.values(w, v, limit))
  np.testing.assert_allclose(y, np.einsum("bgrs,bgsk->bgrk", w, v), rtol=1e-5, atol=1e-5)


def test_a_larger_limit_over_masked_slots_gives_the_same_bits():
  q, k, v, bias, limit = _inputs()
  out = []
  for lim in (limit, limit + 9, np.full_like(limit, 96)):
    w = jax.nn.softmax(decode_attention.logits(q, k, bias, lim), axis=-1)
    out.append(np.asarray(decode_attention.values(w, v, lim)))
  assert np.array_equal(out[0], out[1]) and np.array_equal(out[0], out[2])


def test_a_row_does_not_depend_on_the_other_rows_of_its_call():
  """The 1-token step's row at position p against row 0 of a 4-token call from p: the same
  query, the same visible slots, bit for bit."""
  q4, k, v, bias4, limit4 = _inputs(t=4, heads=1)
  q1, bias1, limit1 = q4[:, :, :1], bias4[:, :, :1], limit4 - 3
  y = {}
  for name, (q, bias, lim) in {"one": (q1, bias1, limit1), "four": (q4, bias4, limit4)}.items():
    w = jax.nn.softmax(decode_attention.logits(q, k, bias, lim), axis=-1)
    y[name] = np.asarray(decode_attention.values(w, v, lim))
  assert np.array_equal(y["one"][:, :, 0], y["four"][:, :, 0])


def test_the_decoder_layer_attends_through_the_calls_on_the_kernels_path():
  target, params, _, _ = tiny_pair("llama")
  model, mparams = packed.pack(target, params, "kernel")
  cache = model.prefill(mparams, jnp.asarray([[5, 6, 7, 8]]), 32)
  text = jax.jit(model.extend).lower(mparams, cache, jnp.asarray([[3]])).as_text()
  assert f"stablehlo.custom_call @{build.TARGET_NAME_ATTN_LOGITS}(" in text
  assert f"stablehlo.custom_call @{build.TARGET_NAME_ATTN_VALUES}(" in text
  # A prefill-sized block keeps XLA's products (faster there): the calls are for decode steps.
  wide = jnp.arange(decode_attention.MAX_BLOCK + 1)[None] % 7 + 3
  text = jax.jit(model.extend).lower(mparams, model.prefill(mparams, jnp.asarray([[5, 6]]), 96),
                                     wide).as_text()
  assert f"@{build.TARGET_NAME_ATTN_LOGITS}(" not in text
  assert "@specdec_cache_write(" in text  # still the kernels' path
