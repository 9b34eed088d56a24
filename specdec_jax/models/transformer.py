"""T5 v1.1 encoder-decoder and the decoder-only LM, as one Linen module tree.

The tree is T5X's (`token_embedder`, `encoder/layers_{i}/...`, `decoder/layers_{i}/...`,
`decoder/logits_dense`), so T5X checkpoints load by name. The decoder-only LM is the same decoder
without cross-attention (T5X's decoder-only layout: relative position biases, gated GELU).

The decoder has one code path, `extend`: a training forward pass is an extend of all target
tokens into an empty cache, and verification is an extend of gamma + 1 tokens. Positions, masks and
relative-position buckets come from the per-example cache index, so examples sit where they are.
A block that is not a chain (several continuations of the prefix, e.g. a draft tree) gives each
new token a position offset and the new tokens it sees (`masked_block`); the model takes that
layout as data.
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.kernels import cache_write, decode_attention
from specdec_jax.models.attention import MultiHeadAttention
from specdec_jax.models.model_config import ModelConfig
from specdec_jax.models.kv_cache import DecodeCache, LayerKV
from specdec_jax.models.layers import (Dense, Embed, LayerNorm, MlpBlock, RelativePositionBiases,
                                       apply_rope, mask_to_bias, rope_tables, scatter_logits)


def _norm(cfg: ModelConfig, name: str) -> LayerNorm:
  return LayerNorm(cfg.layer_norm_epsilon, jnp.dtype(cfg.dtype), cfg.norm_offset, name=name)


def _scan(module_cls, length: int, **method_kwargs):
  """`nn.scan` over stacked layers: parameters get a leading layer axis under the name `layers`
  (T5X's scanned layout), one rng per layer. `method_kwargs`: {method: {"in_axes": ...}}."""
  common = dict(variable_axes={"params": 0}, split_rngs={"params": True}, length=length,
                metadata_params={nn.PARTITION_NAME: "layers"})
  return nn.scan(module_cls, methods={m: {**common, **kw} for m, kw in method_kwargs.items()})


class EncoderLayer(nn.Module):
  """Pre-norm self-attention and gated-GELU MLP. `scanned`: return (x, None) for `nn.scan`."""

  config: ModelConfig
  scanned: bool = False

  @nn.compact
  def __call__(self, x_BxExD: jax.Array, bias_BxHxExE: jax.Array):
    cfg = self.config
    h = _norm(cfg, "pre_attention_layer_norm")(x_BxExD)
    x_BxExD = x_BxExD + MultiHeadAttention(cfg, name="attention")(h, bias_BxHxExE)
    h = _norm(cfg, "pre_mlp_layer_norm")(x_BxExD)
    y_BxExD = x_BxExD + MlpBlock(cfg, name="mlp")(h)
    return (y_BxExD, None) if self.scanned else y_BxExD


class Encoder(nn.Module):
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BxExD: jax.Array, mask_BxE: jax.Array) -> jax.Array:
    cfg = self.config
    pos_BxE = jnp.broadcast_to(jnp.arange(x_BxExD.shape[1]), mask_BxE.shape)
    bias = RelativePositionBiases(cfg, bidirectional=True, name="relpos_bias")(pos_BxE, pos_BxE)
    bias = bias + mask_to_bias(mask_BxE[:, None, None, :] & mask_BxE[:, None, :, None], bias.dtype)
    if cfg.scan_layers:
      stack = _scan(EncoderLayer, cfg.num_encoder_layers, __call__={"in_axes": nn.broadcast})
      x_BxExD, _ = stack(cfg, scanned=True, name="layers")(x_BxExD, bias)
    else:
      for i in range(cfg.num_encoder_layers):
        x_BxExD = EncoderLayer(cfg, name=f"layers_{i}")(x_BxExD, bias)
    return _norm(cfg, "encoder_norm")(x_BxExD)


class DecoderLayer(nn.Module):
  """Pre-norm self-attention (cached), cross-attention (T5 only), gated MLP.

  `rope` ((cos, sin) [B, T, K], rotary models only): queries and keys are rotated to their
  tokens' positions before the keys are cached, so a cached key never moves again.

  `matmul`: layout and product of the projections a decode step runs (`layers.Dense`)."""

  config: ModelConfig
  matmul: str = "xla"

  def setup(self):
    cfg, mm = self.config, self.matmul
    self.pre_self_attention_layer_norm = _norm(cfg, "pre_self_attention_layer_norm")
    self.self_attention = MultiHeadAttention(cfg, matmul=mm)
    if cfg.is_encoder_decoder:
      self.pre_cross_attention_layer_norm = _norm(cfg, "pre_cross_attention_layer_norm")
      self.encoder_decoder_attention = MultiHeadAttention(cfg, matmul=mm, kv_from_encoder=True)
    self.pre_mlp_layer_norm = _norm(cfg, "pre_mlp_layer_norm")
    self.mlp = MlpBlock(cfg, matmul=mm)

  def cross_kv(self, encoded_BxExD: jax.Array) -> LayerKV:
    return LayerKV.from_heads(*self.encoder_decoder_attention.project_kv(encoded_BxExD))

  def cross_kv_step(self, encoded_BxExD: jax.Array) -> tuple[jax.Array, LayerKV]:
    """`cross_kv` in `nn.scan`'s (carry, output) form: stacks every layer's K/V."""
    return encoded_BxExD, self.cross_kv(encoded_BxExD)

  def __call__(self, x_BxTxD: jax.Array, kv: LayerKV, slots_BxT: jax.Array, self_bias: jax.Array,
               cross_kv: Optional[LayerKV], cross_bias: Optional[jax.Array],
               rope: Optional[tuple[jax.Array, jax.Array]] = None) -> tuple[jax.Array, LayerKV]:
    t = x_BxTxD.shape[1]
    h = self.pre_self_attention_layer_norm(x_BxTxD)
    q, k, v = self.self_attention.project_qkv(h)
    if rope is not None:
      q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    limit_B = None
    if self.matmul != "xla" and cache_write.available():  # the kernels' single CPU device
      kv = kv.write_in_place(k, v, slots_BxT[:, 0])  # slots: index + 0..T-1 (block_biases)
      if kv.k_BxHxKxS.dtype == jnp.float32 and t <= decode_attention.MAX_BLOCK:
        # every slot past the block is masked: attention reads the slots before it alone
        limit_B = slots_BxT[:, 0] + t
    else:
      kv = kv.write(k, v, slots_BxT)
    x_BxTxD = x_BxTxD + self.self_attention.attend(q, kv.k_BxHxKxS, kv.v_BxHxSxK, self_bias,
                                                   limit_B)
    if cross_kv is not None:
      h = self.pre_cross_attention_layer_norm(x_BxTxD)
      q = self.encoder_decoder_attention.project_q(h)
      x_BxTxD = x_BxTxD + self.encoder_decoder_attention.attend(
          q, cross_kv.k_BxHxKxS, cross_kv.v_BxHxSxK, cross_bias)
    return x_BxTxD + self.mlp(self.pre_mlp_layer_norm(x_BxTxD)), kv


class Decoder(nn.Module):
  """The decoder stack and the output head. `matmul`, `head_ids`: see `Transformer`.

  Rotary models (`config.uses_rope`) have no relative-position table: their self-attention bias
  is the mask alone ([B, 1, T, S]) and positions enter as rotations. Tied models
  (`config.tie_embeddings`) have no `logits_dense`: the head is the embedding table the caller
  passes."""

  config: ModelConfig
  matmul: str = "xla"
  head_ids: Optional[tuple[int, ...]] = None

  def setup(self):
    cfg, mm = self.config, self.matmul
    if not cfg.uses_rope:
      self.relpos_bias = RelativePositionBiases(cfg, bidirectional=False)
    if cfg.scan_layers:  # one module, parameters stacked on a leading axis: decoder/layers/...
      self.layers = _scan(DecoderLayer, cfg.num_decoder_layers,
                          __call__={"in_axes": (0, nn.broadcast, nn.broadcast, 0, nn.broadcast,
                                                nn.broadcast)},
                          cross_kv_step={"in_axes": ()})(cfg, mm)
    else:
      self.layers = [DecoderLayer(cfg, mm) for _ in range(cfg.num_decoder_layers)]  # layers_{i}
    self.decoder_norm = _norm(cfg, "decoder_norm")
    head = cfg.vocab_size if self.head_ids is None else len(self.head_ids)
    if not cfg.tie_embeddings:
      self.logits_dense = Dense(head, ("embed", "vocab"), jnp.float32, matmul=mm)

  def cross_kv(self, encoded_BxExD: jax.Array) -> tuple[LayerKV, ...] | LayerKV:
    """Per-layer cross-attention K/V: a tuple, or one LayerKV stacked [L, ...] when scanned."""
    if self.config.scan_layers:
      return self.layers.cross_kv_step(encoded_BxExD)[1]
    return tuple(layer.cross_kv(encoded_BxExD) for layer in self.layers)

  def __call__(self, x_BxTxD: jax.Array, cache: DecodeCache, offsets: Optional[jax.Array] = None,
               visible: Optional[jax.Array] = None, table_VxD: Optional[jax.Array] = None
               ) -> tuple[jax.Array, DecodeCache]:
    """Runs T new tokens per example, written to slots `cache.index_B` + 0..T-1; returns float32
    logits. By default they form a causal chain (positions = slots). `offsets` and `visible`
    (both or neither; `masked_block`) give each new token another position and another set of
    new tokens to attend to: the block is then any set of continuations of the cached prefix.
    `table_VxD`: the embedding, the head of a tied model."""
    logits_BxTxV, _, cache = self.with_hidden(x_BxTxD, cache, (), offsets, visible, table_VxD)
    return logits_BxTxV, cache

  def with_hidden(self, x_BxTxD: jax.Array, cache: DecodeCache, hidden_layers: tuple[int, ...],
                  offsets: Optional[jax.Array] = None, visible: Optional[jax.Array] = None,
                  table_VxD: Optional[jax.Array] = None
                  ) -> tuple[jax.Array, Optional[jax.Array], DecodeCache]:
    """`__call__` that also returns the residual stream at `hidden_layers` [B, T, n, D] (None
    when empty), from the same pass: index i is the input of layer i (0: the token embeddings,
    L: the last layer's output, before the final norm). Why here: a feature-level draft reads
    the target's own states of the verified tokens, and a second call would cost a target step."""
    t = x_BxTxD.shape[1]
    relpos = None if self.config.uses_rope else self.relpos_bias
    self_bias, cross_bias, slots_BxT, pos_BxT = block_biases(
        relpos, cache, t, offsets, visible, mask_dtype=self.config.dtype)
    rope = rope_tables(self.config, pos_BxT) if self.config.uses_rope else None
    x_BxTxD, new_kv, hidden = self._stack(x_BxTxD, cache, slots_BxT, (self_bias, cross_bias),
                                          rope, hidden_layers)
    logits_BxTxV = self._head(self.decoder_norm(x_BxTxD), table_VxD)
    cache = cache.replace(self_kv=new_kv, index_B=cache.index_B + t)
    return logits_BxTxV, hidden, cache

  def _stack(self, x_BxTxD, cache: DecodeCache, slots_BxT, biases, rope,
             hidden_layers: tuple[int, ...]):
    """The decoder layers: (output, new self K/V, stacked residuals at `hidden_layers` or None).
    `biases`: (self-attention bias, cross-attention bias or None)."""
    self_bias, cross_bias = biases
    n = self.config.num_decoder_layers
    if any(not 0 <= i <= n for i in hidden_layers):
      raise ValueError(f"hidden layers {hidden_layers} out of range 0..{n} (0: the embeddings, "
                       f"{n}: the last layer's output)")
    if self.config.scan_layers:
      if hidden_layers:
        raise ValueError("hidden states need unrolled decoder layers (scan_layers=False)")
      x_BxTxD, new_kv = self.layers(x_BxTxD, cache.self_kv, slots_BxT, self_bias, cache.cross_kv,
                                    cross_bias, rope)
      return x_BxTxD, new_kv, None
    new_kv, stream = [], [x_BxTxD]
    for i, layer in enumerate(self.layers):
      cross = None if cache.cross_kv is None else cache.cross_kv[i]
      x_BxTxD, kv = layer(x_BxTxD, cache.self_kv[i], slots_BxT, self_bias, cross, cross_bias, rope)
      new_kv.append(kv)
      stream.append(x_BxTxD)
    hidden = (jnp.stack([stream[i] for i in hidden_layers], axis=2).astype(jnp.float32)
              if hidden_layers else None)
    return x_BxTxD, tuple(new_kv), hidden

  def _head(self, y_BxTxD: jax.Array, table_VxD: Optional[jax.Array]) -> jax.Array:
    """float32 logits over the vocabulary: `logits_dense`, or the tied embedding (its rows of the
    restricted head's ids when there is one: the restriction needs no copy of the table)."""
    cfg = self.config
    y_BxTxD = y_BxTxD.astype(jnp.float32)
    if cfg.tie_embeddings:
      if table_VxD is None:
        raise ValueError("a tied model's decoder needs the embedding table as its head")
      if self.head_ids is not None:
        table_VxD = jnp.take(table_VxD, jnp.asarray(self.head_ids, jnp.int32), axis=0)
      logits_BxTxV = jnp.einsum("btd,vd->btv", y_BxTxD, jnp.asarray(table_VxD, jnp.float32))
    else:
      logits_BxTxV = self.logits_dense(y_BxTxD)
    if self.head_ids is not None:  # a restricted head: -inf (probability 0) off its tokens
      logits_BxTxV = scatter_logits(logits_BxTxV, self.head_ids, cfg.vocab_size)
    return nn.with_logical_constraint(logits_BxTxV, ("batch", "length", "vocab"))


def block_biases(relpos_bias, cache: DecodeCache, t: int, offsets=None, visible=None,
                 mask_dtype=jnp.float32):
  """(self-attention bias [B, H or 1, T, S], cross bias [B, 1, 1, E] or None, write slots [B, T],
  positions [B, T]) of T new tokens at `cache.index_B`: a causal chain, or `masked_block`'s
  layout when `offsets` and `visible` are given. `relpos_bias` None (rotary positions): the bias
  is the mask alone (in `mask_dtype`), the positions go to the rotation. Shared by the decoder and the
  feature-level draft's block."""
  batch = cache.index_B.shape[0]
  slots_BxT = cache.index_B[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
  slots_BxS = jnp.broadcast_to(jnp.arange(cache.length, dtype=jnp.int32), (batch, cache.length))
  if offsets is None and visible is None:
    pos_BxT, key_pos_BxS = slots_BxT, slots_BxS
    attend_BxTxS = slots_BxS[:, None, :] <= pos_BxT[:, :, None]
  else:
    pos_BxT, key_pos_BxS, attend_BxTxS = masked_block(cache.index_B, cache.length, offsets,
                                                      visible)
  if relpos_bias is None:
    self_bias = mask_to_bias(attend_BxTxS[:, None], jnp.dtype(mask_dtype))
  else:
    self_bias = relpos_bias(pos_BxT, key_pos_BxS)
    self_bias = self_bias + mask_to_bias(attend_BxTxS[:, None], self_bias.dtype)
  cross_bias = None
  if cache.cross_kv is not None:
    cross_bias = mask_to_bias(cache.encoder_mask_BxE[:, None, None, :], self_bias.dtype)
  return self_bias, cross_bias, slots_BxT, pos_BxT


def masked_block(index_B: jax.Array, length: int, offsets, visible
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Positions and attention of a block of T new tokens that need not form a chain.

  Token t is written to slot index + t (as in every extend) but sits at position
  index + offsets[t]: the relative-position biases, T5's and the decoder-only LM's alike, see
  that position, and a key in the block is read at its token's position too. Among the new
  tokens, t attends to u exactly where visible[t, u]; every cached slot before the index stays
  visible, every slot past the block stays masked. offsets [T] or [B, T] int, visible [T, T] or
  [B, T, T] bool (per example: a block whose layout differs by row). With offsets = 0..T-1 and a
  lower-triangular `visible` this is the causal chain exactly.

  A window: visible [T, U] (or [B, T, U]) with U > T and offsets [U] (or [B, U]) make the block
  the last T of U window slots that start U - T slots before the index: the U - T already cached
  ones keep the positions `offsets` gives them and are seen only where `visible` says. Why: a
  draft tree is expanded one level per call, each level seeing its ancestors among the levels
  cached before, not their cousins; positions count from the window's first slot.

  Returns (query positions [B, T], key positions [B, S], attend [B, T, S] bool).
  """
  batch, t, u = index_B.shape[0], jnp.shape(visible)[-2], jnp.shape(visible)[-1]
  offsets_BxU = jnp.broadcast_to(jnp.asarray(offsets, jnp.int32), (batch, u))
  visible_BxTxU = jnp.broadcast_to(jnp.asarray(visible, jnp.bool_), (batch, t, u))
  start_B = index_B - (u - t)  # the window's first slot
  slots_BxS = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  in_block_BxS = slots_BxS - start_B[:, None]  # a slot's place in the window (valid in 0..U-1)
  inside_BxS = (in_block_BxS >= 0) & (in_block_BxS < u)
  w_BxS = jnp.clip(in_block_BxS, 0, u - 1)
  key_pos_BxS = jnp.where(inside_BxS, start_B[:, None] + jnp.take_along_axis(offsets_BxU, w_BxS,
                                                                             axis=1), slots_BxS)
  w_BxTxS = jnp.broadcast_to(w_BxS[:, None, :], (batch, t, length))
  sees_BxTxS = jnp.take_along_axis(visible_BxTxU, w_BxTxS, axis=2) & inside_BxS[:, None, :]
  attend_BxTxS = sees_BxTxS | (in_block_BxS < 0)[:, None, :]
  return start_B[:, None] + offsets_BxU[:, u - t:], key_pos_BxS, attend_BxTxS


_NEEDS_ENCODED = (
    "this model is a shared-encoder draft (ModelConfig.source_dim > 0): it has no encoder and "
    "decodes on top of its target's encoder output; pass the target's `encode` output "
    "(decoding.seam.Encoded) as `encoded`, or use it as the draft of that target")


class Transformer(nn.Module):
  """T5 v1.1 (kind 't5') or decoder-only LM (kind 'decoder'); methods are the model's entry points.

  `matmul` ("xla", "kernel" or "hybrid"; `layers.Dense`): the layout and product of the decoder's
  projections and the output head (what one decode step multiplies). "kernel"/"hybrid" trees hold
  the CPU kernel's panels (`kernel_panels`) and are built only by `specdec_jax.models.packed`. The
  encoder and the cross-attention keys/values (run once per request over many rows) keep XLA's dot.
  `head_ids` (a draft's restricted head, `specdec_jax.models.head_vocab`): the output head has
  columns for these token ids only, and every other token gets logit -inf.
  """

  config: ModelConfig
  matmul: str = "xla"
  head_ids: Optional[tuple[int, ...]] = None

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg)
    if cfg.is_encoder_decoder and not cfg.shares_encoder:
      self.encoder = Encoder(cfg)
    if cfg.shares_encoder and cfg.source_dim != cfg.emb_dim:
      # The target's states [B, E, source_dim] -> this decoder's width, once per request.
      self.source_projection = Dense(cfg.emb_dim, ("source_embed", "embed"), jnp.dtype(cfg.dtype))
    self.decoder = Decoder(cfg, self.matmul, self.head_ids)

  def encode(self, inputs_BxE: jax.Array) -> jax.Array:
    mask_BxE = inputs_BxE != self.config.pad_id
    return self.encoder(self.token_embedder(inputs_BxE), mask_BxE)

  def empty_cache(self, batch: int, length: int, encoded_BxExD: Optional[jax.Array] = None,
                  encoder_mask_BxE: Optional[jax.Array] = None) -> DecodeCache:
    """`encoded_BxExD`: this model's encoder output, or (shared-encoder draft) the target's."""
    cfg = self.config
    if encoded_BxExD is not None and cfg.shares_encoder and cfg.source_dim != cfg.emb_dim:
      encoded_BxExD = self.source_projection(encoded_BxExD)
    zeros = lambda: LayerKV.zeros(batch, length, cfg.kv_heads, cfg.head_dim,  # noqa: E731
                                  jnp.dtype(cfg.dtype))
    if cfg.scan_layers:  # one LayerKV with a leading layer axis [L, B, H, K, S] / [L, B, H, S, K]
      kv = jax.tree.map(lambda z: jnp.broadcast_to(z, (cfg.num_decoder_layers, *z.shape)), zeros())
    else:
      kv = tuple(zeros() for _ in range(cfg.num_decoder_layers))
    cross = None if encoded_BxExD is None else self.decoder.cross_kv(encoded_BxExD)
    return DecodeCache(self_kv=kv, index_B=jnp.zeros((batch,), jnp.int32), cross_kv=cross,
                       encoder_mask_BxE=encoder_mask_BxE)

  def extend(self, cache: DecodeCache, tokens_BxT: jax.Array, offsets: Optional[jax.Array] = None,
             visible: Optional[jax.Array] = None) -> tuple[jax.Array, DecodeCache]:
    table = self.token_embedder.table() if self.config.tie_embeddings else None
    return self.decoder(self.token_embedder(tokens_BxT), cache, offsets, visible, table)

  def extend_with_hidden(self, cache: DecodeCache, tokens_BxT: jax.Array,
                         hidden_layers: tuple[int, ...], offsets: Optional[jax.Array] = None,
                         visible: Optional[jax.Array] = None):
    """`extend` that also returns the decoder's residual stream at `hidden_layers`."""
    table = self.token_embedder.table() if self.config.tie_embeddings else None
    return self.decoder.with_hidden(self.token_embedder(tokens_BxT), cache, hidden_layers,
                                    offsets, visible, table_VxD=table)

  def forward_with_hidden(self, inputs_BxE: jax.Array, decoder_tokens_BxT: jax.Array,
                          hidden_layers: tuple[int, ...],
                          encoded_BxExD: Optional[jax.Array] = None):
    """Teacher-forced (logits, hidden [B, T, n, D]): a feature draft's training features."""
    cache = self._teacher_cache(inputs_BxE, decoder_tokens_BxT.shape, encoded_BxExD)
    logits_BxTxV, hidden, _ = self.extend_with_hidden(cache, decoder_tokens_BxT, hidden_layers)
    return logits_BxTxV, hidden

  def _teacher_cache(self, inputs_BxE, shape, encoded_BxExD) -> DecodeCache:
    batch, t = shape
    if self.config.is_encoder_decoder:
      if encoded_BxExD is None:
        if self.config.shares_encoder:
          raise ValueError(_NEEDS_ENCODED)
        encoded_BxExD = self.encode(inputs_BxE)
      return self.empty_cache(batch, t, encoded_BxExD, inputs_BxE != self.config.pad_id)
    return self.empty_cache(batch, t)

  def __call__(self, inputs_BxE: jax.Array, decoder_tokens_BxT: jax.Array,
               encoded_BxExD: Optional[jax.Array] = None) -> jax.Array:
    """Teacher-forced logits over the whole target (training, scoring, initialisation).

    `encoded_BxExD`: the encoder output of `inputs_BxE` (a shared-encoder draft: its target's,
    required; a T5 model with its own encoder: its own, computed once by the caller)."""
    cache = self._teacher_cache(inputs_BxE, decoder_tokens_BxT.shape, encoded_BxExD)
    return self.extend(cache, decoder_tokens_BxT)[0]
