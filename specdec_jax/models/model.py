"""The decoding seam: every model is driven through `prefill`, `extend` and `rollback`.

`Model` is a frozen (hashable) dataclass of pure functions over an explicit params pytree and an
explicit `DecodeCache`, so the decoding loops can close over it inside `jit` and `lax.while_loop`,
and tests can drive the loops with any object that has the same methods.

Coordinates: the loops keep a buffer whose slot 0 holds the model's *start token*, the last context
token that has not been fed yet (T5: BOS = 0 with an empty decoder cache; decoder-only LM: the last
prompt token, the rest of the prompt already in the cache). After `prefill`, `cache.index_B` is the
cache slot of that start token, so buffer slot j lives at cache slot `index_B + j` for both models.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.models.config import ModelConfig
from specdec_jax.models.kv_cache import DecodeCache, rollback
from specdec_jax.models.transformer import Transformer

Params = Any


@dataclasses.dataclass(frozen=True)
class Model:
  """A T5 v1.1 or decoder-only model behind the decoding seam."""

  config: ModelConfig

  @property
  def module(self) -> Transformer:
    return Transformer(self.config)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  # ---- parameters -------------------------------------------------------------------------------
  def init(self, rng: jax.Array) -> Params:
    """Random parameters (float32), T5X initialisers."""
    return nn.unbox(self._init_boxed(rng))

  def _init_boxed(self, rng: jax.Array):
    e = 4 if self.config.is_encoder_decoder else 1
    return self.module.init(rng, jnp.ones((1, e), jnp.int32), jnp.ones((1, 4), jnp.int32))["params"]

  def logical_axes(self) -> Params:
    """PartitionSpec tree of logical axis names, same structure as `init`'s output."""
    boxed = jax.eval_shape(self._init_boxed, jax.random.key(0))
    return nn.get_partition_spec(boxed)

  def param_shapes(self) -> Params:
    return jax.eval_shape(self.init, jax.random.key(0))

  # ---- the seam ---------------------------------------------------------------------------------
  def start_tokens(self, inputs_BxP: jax.Array) -> jax.Array:
    """The first token the loops feed: BOS (T5) or the last real prompt token (decoder-only)."""
    if self.config.is_encoder_decoder:
      return jnp.full(inputs_BxP.shape[:1], self.config.pad_id, jnp.int32)
    lengths_B = prompt_lengths(inputs_BxP)
    return jnp.take_along_axis(inputs_BxP, jnp.maximum(lengths_B - 1, 0)[:, None], axis=1)[:, 0]

  def prefill(self, params: Params, inputs_BxP: jax.Array, cache_len: int) -> DecodeCache:
    """Encodes (T5: once per request, cross K/V cached) or fills the cache with the prompt.

    Args:
      params: model parameters.
      inputs_BxP: int32, right-padded with 0. T5: encoder tokens. Decoder-only: the prompt.
      cache_len: number of decoder self-attention slots (static).
    Returns:
      A cache whose `index_B` is the slot of `start_tokens(inputs_BxP)`.
    """
    batch, plen = inputs_BxP.shape
    mod = self.module
    if self.config.is_encoder_decoder:
      def _prefill(m, inputs):
        return m.empty_cache(batch, cache_len, m.encode(inputs), inputs > 0)
      return mod.apply({"params": params}, inputs_BxP, method=_prefill)
    cache = mod.apply({"params": params}, batch, cache_len, method=Transformer.empty_cache)
    if plen > 1:
      _, cache = self.extend(params, cache, inputs_BxP[:, :-1])
    return rollback(cache, jnp.maximum(prompt_lengths(inputs_BxP) - 1, 0))

  def extend(self, params: Params, cache: DecodeCache, tokens_BxT: jax.Array
             ) -> tuple[jax.Array, DecodeCache]:
    """Feeds T tokens per example at `cache.index_B`; returns float32 logits and the new cache."""
    return self.module.apply({"params": params}, cache, tokens_BxT, method=Transformer.extend)

  def forward(self, params: Params, inputs_BxP: jax.Array, decoder_tokens_BxT: jax.Array
              ) -> jax.Array:
    """Teacher-forced logits (training and the full-forward reference of the cache tests)."""
    return self.module.apply({"params": params}, inputs_BxP, decoder_tokens_BxT)


def prompt_lengths(inputs_BxP: jax.Array) -> jax.Array:
  """Number of real tokens per right-padded row."""
  return jnp.sum(inputs_BxP != 0, axis=1).astype(jnp.int32)


def build_model(config: ModelConfig) -> Model:
  return Model(config)
