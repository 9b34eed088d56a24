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

import contextlib
import dataclasses
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.seam import Encoded
from specdec_jax.models.model_config import ModelConfig
from specdec_jax.models.kv_cache import DecodeCache, LayerKV
from specdec_jax.models.transformer import _NEEDS_ENCODED, Transformer

Params = Any


@dataclasses.dataclass(frozen=True)
class Model:
  """A T5 v1.1 or decoder-only model behind the decoding seam.

  `axis_rules` (optional, see `specdec_jax.sharding`): logical-axis rules this model's activation
  and cache constraints use. Per model, because the target and the draft map the same logical
  names to different mesh axes inside one program. None leaves the caller's rules (if any) in
  force; without a mesh in context the constraints are no-ops.
  """

  config: ModelConfig
  axis_rules: Optional[tuple] = None
  # A draft's restricted output head (`specdec_jax.models.head_vocab.restrict`): sorted token ids.
  head_ids: Optional[tuple[int, ...]] = None

  def _rules(self):
    if self.axis_rules is None:
      return contextlib.nullcontext()
    return nn.logical_axis_rules(self.axis_rules)

  @property
  def module(self) -> Transformer:
    return Transformer(self.config, head_ids=self.head_ids)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def kind(self) -> str:
    return self.config.kind

  @property
  def eos_id(self) -> int:
    return self.config.eos_id

  @property
  def pad_id(self) -> int:
    return self.config.pad_id

  @property
  def shares_encoder(self) -> bool:
    """Whether this is a shared-encoder draft: its prefill needs the target's `Encoded`."""
    return self.config.shares_encoder

  # ---- parameters -------------------------------------------------------------------------------
  def init(self, rng: jax.Array) -> Params:
    """Random parameters (float32), T5X initialisers (jitted: eager Flax init is slow)."""
    return jax.jit(lambda r: nn.unbox(self._init_boxed(r)))(rng)

  def _init_boxed(self, rng: jax.Array):
    e = 4 if self.config.is_encoder_decoder else 1
    encoded = (jnp.zeros((1, e, self.config.source_dim), jnp.float32)
               if self.config.shares_encoder else None)
    return self.module.init(rng, jnp.ones((1, e), jnp.int32), jnp.ones((1, 4), jnp.int32),
                            encoded)["params"]

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
    lengths_B = prompt_lengths(inputs_BxP, self.config.pad_id)
    return jnp.take_along_axis(inputs_BxP, jnp.maximum(lengths_B - 1, 0)[:, None], axis=1)[:, 0]

  def encode(self, params: Params, inputs_BxP: jax.Array) -> Encoded:
    """The encoder's reading of the source, to share with a shared-encoder draft (T5 only)."""
    if not self.config.is_encoder_decoder or self.config.shares_encoder:
      raise ValueError(f"encode needs a T5 model with its own encoder; this one is "
                       f"{'a shared-encoder draft' if self.config.shares_encoder else 'decoder-only'}")
    with self._rules():
      states = self.module.apply({"params": params}, inputs_BxP, method=Transformer.encode)
    return Encoded(states_BxExD=states, mask_BxE=inputs_BxP != self.config.pad_id)

  def prefill(self, params: Params, inputs_BxP: jax.Array, cache_len: int, *,
              encoded: Optional[Encoded] = None) -> DecodeCache:
    """Encodes (T5: once per request, cross K/V cached) or fills the cache with the prompt.

    Args:
      params: model parameters.
      inputs_BxP: int32, right-padded with the pad id (`ModelConfig.pad_id`). T5: encoder
        tokens. Decoder-only: the prompt.
      cache_len: number of decoder self-attention slots (static).
      encoded: the seam's shared-encoder hook (`decoding.seam.Encoded`). A shared-encoder draft
        requires it: its target's `encode(inputs_BxP)`. A T5 model with its own encoder uses it
        when given, as its OWN `encode` output (the loops pass the target its own, computed once
        for both models), and encodes `inputs_BxP` otherwise. Decoder-only models ignore it.
    Returns:
      A cache whose `index_B` is the slot of `start_tokens(inputs_BxP)`.
    """
    batch = inputs_BxP.shape[0]
    mod = self.module
    with self._rules():
      if self.config.is_encoder_decoder:
        if encoded is None and self.config.shares_encoder:
          raise ValueError(_NEEDS_ENCODED)

        def _prefill(m, inputs, states):
          states = m.encode(inputs) if states is None else states
          return m.empty_cache(batch, cache_len, states, inputs != self.config.pad_id)
        states = None if encoded is None else encoded.states_BxExD
        return constrain_cache(mod.apply({"params": params}, inputs_BxP, states,
                                          method=_prefill))
    return self._decoder_prefill(params, inputs_BxP, cache_len, None)[0]

  def prefill_with_hidden(self, params: Params, inputs_BxP: jax.Array, cache_len: int,
                          layers: tuple[int, ...]) -> tuple[DecodeCache, jax.Array]:
    """Decoder-only `prefill` that also returns the residual stream at `layers` of the prompt
    tokens it feeds: (the same cache, float32 hidden [B, P - 1, n, D]; row b's first
    len_b - 1 entries are real). Why: a feature-level draft reads the prompt's target states
    the way it reads verified tokens' (`decoding.feature_entries.prime_carry`), from the one
    prefill call. An optional seam member, as `extend_with_hidden` is."""
    if self.config.is_encoder_decoder:
      raise ValueError("prefill_with_hidden is the decoder-only prefill; a T5 decoder starts "
                       "from the start token alone (no prompt states to return)")
    return self._decoder_prefill(params, inputs_BxP, cache_len, tuple(layers))

  def _decoder_prefill(self, params: Params, inputs_BxP: jax.Array, cache_len: int,
                       layers: Optional[tuple[int, ...]]
                       ) -> tuple[DecodeCache, Optional[jax.Array]]:
    """The prompt but its last token fed into an empty cache, rolled back to the start token's
    slot; with `layers`, `extend_with_hidden`'s states of those tokens too (else None)."""
    batch, plen = inputs_BxP.shape
    with self._rules():
      cache = constrain_cache(self.module.apply({"params": params}, batch, cache_len,
                                                method=Transformer.empty_cache))
    hidden = (None if layers is None else
              jnp.zeros((batch, 0, len(layers), self.config.emb_dim), jnp.float32))
    if plen > 1 and layers is None:
      _, cache = self.extend(params, cache, inputs_BxP[:, :-1])
    elif plen > 1:
      _, hidden, cache = self.extend_with_hidden(params, cache, inputs_BxP[:, :-1], layers)
    lengths_B = prompt_lengths(inputs_BxP, self.config.pad_id)
    return cache.rollback(jnp.maximum(lengths_B - 1, 0)), hidden

  def extend(self, params: Params, cache: DecodeCache, tokens_BxT: jax.Array
             ) -> tuple[jax.Array, DecodeCache]:
    """Feeds T tokens per example at `cache.index_B`; returns float32 logits and the new cache.

    Under a mesh the logits come back with the vocabulary gathered (sampling, top-k/top-p and the
    acceptance ratios then see whole rows) and the cache keeps its batch/heads sharding.
    """
    with self._rules():
      logits_BxTxV, cache = self.module.apply({"params": params}, cache, tokens_BxT,
                                              method=Transformer.extend)
      logits_BxTxV = nn.with_logical_constraint(logits_BxTxV, ("batch", "length", None))
      return logits_BxTxV, constrain_cache(cache)

  def extend_with_hidden(self, params: Params, cache: DecodeCache, tokens_BxT: jax.Array,
                         layers: tuple[int, ...], offsets: Optional[jax.Array] = None,
                         visible: Optional[jax.Array] = None
                         ) -> tuple[jax.Array, jax.Array, DecodeCache]:
    """`extend` that also returns the decoder's residual stream at `layers` (a static tuple):
    (float32 logits [B, T, V], float32 hidden [B, T, n, D], cache). Index i is the input of
    decoder layer i: 0 the token embeddings, `num_decoder_layers` the last layer's output
    before the final norm. Why: a feature-level draft drafts from the target's own low, middle
    and high states of the verified tokens; they come out of the verify call itself (same
    logits as `extend`, no second target call, nothing sent to the host). An optional seam
    member: the loops that do not need it keep `extend`'s two-tuple. `offsets` / `visible`: a
    block that is not a chain, as `extend_with_mask`'s (a feature draft's tree)."""
    with self._rules():
      logits_BxTxV, hidden, cache = self.module.apply(
          {"params": params}, cache, tokens_BxT, tuple(layers), offsets, visible,
          method=Transformer.extend_with_hidden)
      logits_BxTxV = nn.with_logical_constraint(logits_BxTxV, ("batch", "length", None))
      return logits_BxTxV, hidden, constrain_cache(cache)

  def extend_with_mask(self, params: Params, cache: DecodeCache, tokens_BxT: jax.Array,
                       offsets: jax.Array, visible: jax.Array) -> tuple[jax.Array, DecodeCache]:
    """`extend` for a block that need not be a chain (`transformer.masked_block`): token t goes
    to slot index + t at position index + offsets[t] and sees the cached prefix and the new
    tokens u with visible[t, u]. offsets [T] or [B, T], visible [T, T] or [B, T, T]; or a window
    (offsets [U], visible [T, U], U > T: the block is the last T of U slots, the U - T cached
    before it seen by mask and placed by offset, `transformer.masked_block`). Why here:
    several continuations of one prefix (a draft tree: offsets its depths, visible its ancestor
    mask) are scored in one call; the model takes the layout as data and knows nothing of
    trees. The index still moves by T; `DecodeCache.copy_slots` then gathers the entries of one
    continuation into consecutive slots."""
    with self._rules():
      logits_BxTxV, cache = self.module.apply({"params": params}, cache, tokens_BxT, offsets,
                                              visible, method=Transformer.extend)
      logits_BxTxV = nn.with_logical_constraint(logits_BxTxV, ("batch", "length", None))
      return logits_BxTxV, constrain_cache(cache)

  def forward(self, params: Params, inputs_BxP: jax.Array, decoder_tokens_BxT: jax.Array, *,
              encoded: Optional[Encoded] = None) -> jax.Array:
    """Teacher-forced logits (training and the full-forward reference of the cache tests).

    `encoded`: as in `prefill`: a shared-encoder draft requires its target's `encode(inputs_BxP)`;
    a T5 model with its own encoder reads it as its own (a distillation step encodes the batch
    once, for the target and its shared-encoder student); decoder-only models ignore it."""
    if self.config.shares_encoder and encoded is None:
      raise ValueError(_NEEDS_ENCODED)
    states = (encoded.states_BxExD
              if encoded is not None and self.config.is_encoder_decoder else None)
    with self._rules():
      return self.module.apply({"params": params}, inputs_BxP, decoder_tokens_BxT, states)

  def forward_with_hidden(self, params: Params, inputs_BxP: jax.Array,
                          decoder_tokens_BxT: jax.Array, layers: tuple[int, ...], *,
                          encoded: Optional[Encoded] = None) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced (logits [B, T, V], hidden [B, T, n, D]) at `layers` (see
    `extend_with_hidden`): what a feature-level draft trains on, from one target pass."""
    states = (encoded.states_BxExD
              if encoded is not None and self.config.is_encoder_decoder else None)
    with self._rules():
      return self.module.apply({"params": params}, inputs_BxP, decoder_tokens_BxT, tuple(layers),
                               states, method=Transformer.forward_with_hidden)


# Logical axes of the cache's leaves (one layer; layers stacked under scan add a leading 'layers'):
# what `constrain_cache` pins, and what `aot.steps.abstract_cache` lays an abstract cache out by.
CACHE_AXES = {"k_BxHxKxS": ("batch", "heads", "kv", "length"),
              "v_BxHxSxK": ("batch", "heads", "length", "kv"),
              "index_B": ("batch",), "encoder_mask_BxE": ("batch", None)}


def constrain_cache(cache: DecodeCache) -> DecodeCache:
  """Batch/heads sharding of the cache (a no-op without rules and a mesh), so the decode loops'
  carries keep one layout across iterations instead of being resharded each time. The
  feature-level draft's one-layer cache (`models.feature_draft`) is pinned by the same axes."""
  def c(x, axes):  # one layer, or [L, ...] for layers stacked under scan
    return nn.with_logical_constraint(x, ("layers",) * (x.ndim - 4) + axes)

  def kv(layers):  # a tuple of per-layer LayerKV, or one stacked LayerKV (scan_layers)
    if layers is None:
      return None
    one = lambda l: LayerKV(c(l.k_BxHxKxS, CACHE_AXES["k_BxHxKxS"]),  # noqa: E731
                            c(l.v_BxHxSxK, CACHE_AXES["v_BxHxSxK"]))
    return one(layers) if isinstance(layers, LayerKV) else tuple(one(l) for l in layers)
  mask = cache.encoder_mask_BxE
  return cache.replace(
      self_kv=kv(cache.self_kv), cross_kv=kv(cache.cross_kv),
      index_B=nn.with_logical_constraint(cache.index_B, CACHE_AXES["index_B"]),
      encoder_mask_BxE=None if mask is None else nn.with_logical_constraint(
          mask, CACHE_AXES["encoder_mask_BxE"]))


def prompt_lengths(inputs_BxP: jax.Array, pad_id: int = 0) -> jax.Array:
  """Number of real tokens per row right-padded with `pad_id` (the model's: 0 for T5 and the
  zoo, an id no text encodes to for a Llama-3 checkpoint, whose id 0 is '!')."""
  return jnp.sum(inputs_BxP != pad_id, axis=1).astype(jnp.int32)


def build_model(config: ModelConfig) -> Model:
  return Model(config)
