"""Multi-head dot-product attention as T5X computes it, split so a cache can sit in the middle.

No 1/sqrt(head_dim) scaling of the logits by default: T5X folds it into the query kernel's
initialisation, and pretrained checkpoints already contain it; the HF families scale at run time
(`config.attention_scale`, applied to the float32 queries). Logits and softmax run in float32 (T5X's
`float32_logits`), because draft and target probabilities are compared to the last bit.
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.kernels import decode_attention
from specdec_jax.models.model_config import ModelConfig
from specdec_jax.models.kv_cache import LayerKV
from specdec_jax.models.layers import FUSED_PROJECTIONS, Dense


class MultiHeadAttention(nn.Module):
  """Parameters `query`, `key`, `value` (embed, joined_kv) and `out` (joined_kv, embed).

  Grouped-query attention (`config.kv_heads` < num_heads): `key` and `value` project to kv_heads
  heads, and query heads g * G .. g * G + G - 1 (G = num_heads / kv_heads) read key head g, as
  HF's `repeat_kv`. The keys are never repeated: the query heads of a group are folded into the
  rows of one product, so the cache and its reads shrink by G. `config.qkv_bias` (Qwen2): the
  three input projections carry biases.

  `matmul`: the layout and product of the projections a decode step runs (see `layers.Dense`).
  In the packed layouts a self-attention's three input projections are one matrix `qkv`
  ([embed, q + k + v], `layers.FUSED_PROJECTIONS`): they read the same input, and one call
  streams the three (see there for why). `kv_from_encoder` (cross-attention): keys and values
  project the encoder output once per request, many rows at once, where XLA's GEMM is the right
  tool; they stay "xla".
  """

  config: ModelConfig
  matmul: str = "xla"
  kv_from_encoder: bool = False

  def setup(self):
    cfg = self.config
    inner, dt = cfg.num_heads * cfg.head_dim, jnp.dtype(cfg.dtype)
    kv_inner, bias = cfg.kv_heads * cfg.head_dim, cfg.qkv_bias
    mm, mkv = self.matmul, "xla" if self.kv_from_encoder else self.matmul
    self.splits = (inner, inner + kv_inner)
    if self.fused:  # packed weights only (`models.packed` builds them): no init of its own
      self.qkv = Dense(inner + 2 * kv_inner, ("embed", "joined_kv"), dt, matmul=mm, use_bias=bias)
    else:
      self.query = Dense(inner, ("embed", "joined_kv"), dt, init_scale=1.0 / cfg.head_dim,
                         matmul=mm, use_bias=bias)
      self.key = Dense(kv_inner, ("embed", "joined_kv"), dt, matmul=mkv, use_bias=bias)
      self.value = Dense(kv_inner, ("embed", "joined_kv"), dt, matmul=mkv, use_bias=bias)
    self.out = Dense(cfg.emb_dim, ("joined_kv", "embed"), dt, matmul=mm)

  @property
  def fused(self) -> bool:
    return self.matmul in FUSED_PROJECTIONS and not self.kv_from_encoder

  def _heads(self, x_BxTxI: jax.Array) -> jax.Array:
    b, t, inner = x_BxTxI.shape
    x = x_BxTxI.reshape(b, t, inner // self.config.head_dim, self.config.head_dim)
    return nn.with_logical_constraint(x, ("batch", "length", "heads", "kv"))

  def project_q(self, x_BxTxD: jax.Array) -> jax.Array:
    return self.project_qkv(x_BxTxD)[0] if self.fused else self._heads(self.query(x_BxTxD))

  def project_kv(self, x_BxSxD: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Keys and values [B, S, kv_heads, K]."""
    if self.fused:
      return self.project_qkv(x_BxSxD)[1:]
    return self._heads(self.key(x_BxSxD)), self._heads(self.value(x_BxSxD))

  def project_qkv(self, x_BxTxD: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Queries, keys and values of one input (self-attention): one product when fused."""
    if not self.fused:
      return (self.project_q(x_BxTxD),) + self.project_kv(x_BxTxD)
    q, k, v = jnp.split(self.qkv(x_BxTxD), self.splits, axis=-1)
    return self._heads(q), self._heads(k), self._heads(v)

  def attend(self, q_BxTxHxK: jax.Array, k_BxHxKxS: jax.Array, v_BxHxSxK: jax.Array,
             bias_BxHxTxS: jax.Array, limit_B: Optional[jax.Array] = None) -> jax.Array:
    """softmax(q k^T + bias) v, then the output projection. Returns B x T x D. Keys and values
    come in the cache's head-major layouts (`kv_cache.LayerKV`), which both products read as
    they are. `limit_B` (the kernels' path only): every slot at or past limit_B[b] is masked for
    example b, and both products read the slots before it alone (`kernels.decode_attention`)."""
    # Both products as batched (b, h) matmuls with the operands in the order written: [T, K] x
    # [K, S] and [T, S] x [S, K]. Left to `jnp.einsum`, XLA:CPU computed the second as
    # ([S, K]^T x [T, S]^T) into [H, K, T], a GEMM path ~1.5-2x slower at T = 2..9 (verification).
    # Grouped queries: [B, H, T, K] -> [B, kv_heads, G * T, K] is a free reshape (heads of a group
    # are adjacent), and the logits [B, kv_heads, G * T, S] reshape back to [B, H, T, S] freely.
    b, t, h, k = q_BxTxHxK.shape
    g_kv, s = k_BxHxKxS.shape[1], k_BxHxKxS.shape[3]
    q_BxHxTxK = jnp.transpose(q_BxTxHxK, (0, 2, 1, 3)).astype(jnp.float32)
    if self.config.attention_scale != 1.0:
      q_BxHxTxK = q_BxHxTxK * jnp.float32(self.config.attention_scale)
    q_BxGxRxK = q_BxHxTxK.reshape(b, g_kv, (h // g_kv) * t, k)
    if limit_B is not None:
      logits_BxGxRxS = decode_attention.logits(q_BxGxRxK, k_BxHxKxS, bias_BxHxTxS, limit_B)
      weights = jax.nn.softmax(logits_BxGxRxS, axis=-1)
      y_BxGxRxK = decode_attention.values(weights, v_BxHxSxK, limit_B)
    else:
      logits_BxGxRxS = jax.lax.dot_general(q_BxGxRxK, k_BxHxKxS.astype(jnp.float32),
                                           (((3,), (2,)), ((0, 1), (0, 1))))
      logits_BxHxTxS = logits_BxGxRxS.reshape(b, h, t, s) + bias_BxHxTxS.astype(jnp.float32)
      weights = jax.nn.softmax(logits_BxHxTxS, axis=-1).astype(v_BxHxSxK.dtype)
      y_BxGxRxK = jax.lax.dot_general(weights.reshape(b, g_kv, (h // g_kv) * t, s), v_BxHxSxK,
                                      (((3,), (2,)), ((0, 1), (0, 1))))
    y_BxTxHxK = jnp.transpose(y_BxGxRxK.reshape(b, h, t, k), (0, 2, 1, 3))
    return self.out(y_BxTxHxK.reshape(b, t, h * k))

  def __call__(self, x_BxTxD: jax.Array, bias_BxHxTxS: jax.Array) -> jax.Array:
    """Plain self-attention with no cache (the encoder)."""
    kv = LayerKV.from_heads(*self.project_kv(x_BxTxD))
    return self.attend(self.project_q(x_BxTxD), kv.k_BxHxKxS, kv.v_BxHxSxK, bias_BxHxTxS)
