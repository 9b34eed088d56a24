"""Decode attention over a cache's filled slots only: q k^T and weights x v as two custom calls.

Why: a decode step's cache has a slot for every position the request may reach (the prompt's
bucket, the longest decode, gamma), and XLA's two products read every slot at every step though
all slots at or past index + T are masked. On SmolLM2 that was ~2.6 ms per 1,000 slots a step,
for the target and for a self-draft reading the same cache (HumanEval's caches hold ~770-1,030
slots of which ~250 are filled on average). The calls read slots < `limit_B` only; the softmax
between them stays XLA's (over every slot: the logits past the limit are -inf, weight 0).

Exactness: each logit and each output element is summed in one fixed order (packed_matmul.cc),
so a row's result does not depend on T, on the other rows or on the limit past its own causal
position: the rows of a 1-token step and of a T-token verify at one position agree bit for bit,
as greedy speculative decoding needs. Against XLA's products the sums are ordered differently
(float32 rounding). Only where the kernels run (a CPU run on one device, the packed layouts),
as `cache_write`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.kernels import build

# The widest block (tokens per call) the calls take. Why: they are written for decode steps (a
# few query rows, one thread per call); a prompt's prefill is a block of hundreds of rows, where
# XLA's batched products ran faster (SmolLM2, a 256-token prefill 396 ms against 505, 1,024
# tokens 2.9 s against 4.7; level at 64). Every chain's verify and the trees configured here fit
# (the widest, (4, 3, 2, 1), verifies 65 tokens); a wider block takes XLA's products, as every
# block did before.
MAX_BLOCK = 96


def logits(q_BxGxRxK: jax.Array, k_BxGxKxS: jax.Array, bias_BxHxTxS: jax.Array,
           limit_B: jax.Array) -> jax.Array:
  """[B, G, R, S] float32: q k^T + bias at slots < limit_B[b], -inf past them. Rows r = a
  group's query heads x T (head-major, as `MultiHeadAttention.attend` reshapes them); the bias
  has one head or all H = G x R / T."""
  b, g, r, _ = q_BxGxRxK.shape
  call = jax.ffi.ffi_call(build.TARGET_NAME_ATTN_LOGITS,
                          jax.ShapeDtypeStruct((b, g, r, k_BxGxKxS.shape[3]), jnp.float32))
  return call(q_BxGxRxK.astype(jnp.float32), k_BxGxKxS.astype(jnp.float32),
              bias_BxHxTxS.astype(jnp.float32), limit_B.astype(jnp.int32))


def values(w_BxGxRxS: jax.Array, v_BxGxSxK: jax.Array, limit_B: jax.Array) -> jax.Array:
  """[B, G, R, K] float32: sum over slots s < limit_B[b] of w[.., s] v[.., s, :]."""
  b, g, r, _ = w_BxGxRxS.shape
  call = jax.ffi.ffi_call(build.TARGET_NAME_ATTN_VALUES,
                          jax.ShapeDtypeStruct((b, g, r, v_BxGxSxK.shape[3]), jnp.float32))
  return call(w_BxGxRxS.astype(jnp.float32), v_BxGxSxK.astype(jnp.float32),
              limit_B.astype(jnp.int32))
