"""A feature-level draft (EAGLE-3 style): one decoder block over the target's own hidden states.

Why (issue 28; `shared/reference/DRAFTING_2026.md`): a separate small decoder must rebuild from
tokens what the target already knows; a draft that reads the target's low, middle and high
residual states (`Model.extend_with_hidden`) needs one block to predict the token after next.
This module is a model and knows nothing of speculation: it takes tokens and per-position
features and returns logits, its own output features and its cache.

Coordinates (the ones a loop must keep; an off-by-one here silently halves acceptance): entry j
of the draft's cache holds (g_j, y_{j+1}): g_j the fused features of the target's states at
decoder position j (the target fed y_j there), y_{j+1} the token after it; its output predicts
y_{j+2}, the target's next-token distribution at position j + 1. Where the target has not run
yet (drafting ahead), g_j is the draft's own output feature of entry j - 1 (training-time test
trains exactly that). The block's input is a learned linear fusion of the token embedding and
g (the residual stream carries the fused feature, not the embedding alone).

Pieces: the token embedding is the target's table (copied, frozen in training); `head='target'`
reads the target's final norm and output head (copied, frozen; a projection first when the
block is narrower), `head='own'` trains its own. For T5 the block cross-attends to the target's
encoder output (`shares_encoder`: the loops encode once, as for the shared-encoder draft). The
cache is a `kv_cache.DecodeCache` with one layer: rollback is the usual index move.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.seam import Encoded
from specdec_jax.models.feature_draft_config import FeatureDraftConfig
from specdec_jax.models.kv_cache import DecodeCache, LayerKV
from specdec_jax.models.layers import (Dense, Embed, LayerNorm, RelativePositionBiases,
                                       scatter_logits)
from specdec_jax.models.model import constrain_cache
from specdec_jax.models.transformer import DecoderLayer, block_biases

Params = Any
class FeatureDraftModule(nn.Module):
  """The block and its input fusion and head (see the module docstring). `head_ids`: a
  restricted head's token ids (`FeatureDraft.restrict_head`), None for the full vocabulary.
  `matmul`: the projections' layout and product (`layers.Dense`; `models.packed` packs them for
  the CPU kernel, as a token draft's)."""

  config: FeatureDraftConfig
  head_ids: Optional[tuple[int, ...]] = None
  matmul: str = "xla"

  def setup(self):
    cfg, mm = self.config, self.matmul
    blk, dt = cfg.block_config(), jnp.dtype(cfg.dtype)
    self.token_embedder = Embed(blk.replace(emb_dim=cfg.target_dim))
    self.fuse = Dense(cfg.emb_dim, ("features", "embed"), dt, matmul=mm)
    self.input_projection = Dense(cfg.emb_dim, ("features", "embed"), dt, matmul=mm)
    self.relpos_bias = RelativePositionBiases(blk, bidirectional=False)
    self.layer = DecoderLayer(blk, matmul=mm)
    head_dim = cfg.target_dim if cfg.head == "target" else cfg.emb_dim
    if head_dim != cfg.emb_dim:
      self.head_projection = Dense(head_dim, ("embed", "target_embed"), dt, matmul=mm)
    self.decoder_norm = LayerNorm(cfg.layer_norm_epsilon, dt)
    self.logits_dense = Dense(len(self.head_ids) if self.head_ids else cfg.vocab_size,
                              ("embed", "vocab"), jnp.float32, matmul=mm)

  def fuse_features(self, hidden_BxTxnxD: jax.Array) -> jax.Array:
    """The target's states at the feature layers -> the block's feature g [B, T, emb_dim]."""
    b, t = hidden_BxTxnxD.shape[:2]
    return self.fuse(hidden_BxTxnxD.reshape(b, t, -1).astype(jnp.dtype(self.config.dtype)))

  def empty_cache(self, batch: int, length: int, encoded_BxExD: Optional[jax.Array] = None,
                  encoder_mask_BxE: Optional[jax.Array] = None) -> DecodeCache:
    cfg = self.config
    kv = LayerKV.zeros(batch, length, cfg.num_heads, cfg.head_dim, jnp.dtype(cfg.dtype))
    cross = None if encoded_BxExD is None else (self.layer.cross_kv(encoded_BxExD),)
    return DecodeCache(self_kv=(kv,), index_B=jnp.zeros((batch,), jnp.int32), cross_kv=cross,
                       encoder_mask_BxE=encoder_mask_BxE)

  def extend(self, cache: DecodeCache, tokens_BxT: jax.Array, g_BxTxD: jax.Array,
             offsets: Optional[jax.Array] = None, visible: Optional[jax.Array] = None
             ) -> tuple[jax.Array, jax.Array, DecodeCache]:
    """T entries (g, token) at `cache.index_B` (or `masked_block`'s layout): (float32 logits
    [B, T, V], output features [B, T, emb_dim], cache)."""
    out_BxTxD, cache = self.feed(cache, tokens_BxT, g_BxTxD, offsets, visible)
    return self.logits(out_BxTxD), out_BxTxD, cache

  def feed(self, cache: DecodeCache, tokens_BxT: jax.Array, g_BxTxD: jax.Array,
           offsets: Optional[jax.Array] = None, visible: Optional[jax.Array] = None
           ) -> tuple[jax.Array, DecodeCache]:
    """`extend` without the head: (output features [B, T, emb_dim], cache)."""
    t = tokens_BxT.shape[1]
    emb_BxTxD = self.token_embedder(tokens_BxT)
    x_BxTxD = self.input_projection(jnp.concatenate(
        [emb_BxTxD, g_BxTxD.astype(emb_BxTxD.dtype)], axis=-1))
    self_bias, cross_bias, slots_BxT, _ = block_biases(self.relpos_bias, cache, t, offsets,
                                                       visible)
    cross = None if cache.cross_kv is None else cache.cross_kv[0]
    out_BxTxD, kv = self.layer(x_BxTxD, cache.self_kv[0], slots_BxT, self_bias, cross,
                               cross_bias)
    cache = cache.replace(self_kv=(kv,), index_B=cache.index_B + t)
    return out_BxTxD, cache

  def logits(self, out_BxTxD: jax.Array) -> jax.Array:
    logits = self.compact_logits(out_BxTxD)
    if self.head_ids:
      logits = scatter_logits(logits, self.head_ids, self.config.vocab_size)
    return logits

  def compact_logits(self, out_BxTxD: jax.Array) -> jax.Array:
    """The head's own columns: [B, T, K] for a restricted head (its ids' order), else [B, T, V]."""
    h = self.head_projection(out_BxTxD) if hasattr(self, "head_projection") else out_BxTxD
    return self.norm_and_head(h)

  def norm_and_head(self, h_BxTxD: jax.Array) -> jax.Array:
    """The final norm and head on a head-width state (the target's copies when head='target'),
    columns as `compact_logits`."""
    return self.logits_dense(self.decoder_norm(h_BxTxD).astype(jnp.float32))

  def features(self, inputs_BxE: jax.Array, tokens_BxT: jax.Array, g_BxTxD: jax.Array,
               encoded_BxExD: Optional[jax.Array] = None, offsets: Optional[jax.Array] = None,
               visible: Optional[jax.Array] = None) -> jax.Array:
    """`__call__`'s output features alone (no head)."""
    batch, t = tokens_BxT.shape
    mask = None if encoded_BxExD is None else inputs_BxE != self.config.pad_id
    cache = self.empty_cache(batch, t, encoded_BxExD, mask)
    return self.feed(cache, tokens_BxT, g_BxTxD, offsets, visible)[0]

  def __call__(self, inputs_BxE: jax.Array, tokens_BxT: jax.Array, g_BxTxD: jax.Array,
               encoded_BxExD: Optional[jax.Array] = None, offsets: Optional[jax.Array] = None,
               visible: Optional[jax.Array] = None) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced (logits, output features) over T entries from an empty cache; T5 reads
    `encoded_BxExD`, the target's encoder output of `inputs_BxE`."""
    out_BxTxD = self.features(inputs_BxE, tokens_BxT, g_BxTxD, encoded_BxExD, offsets, visible)
    return self.logits(out_BxTxD), out_BxTxD

  def init_all(self, inputs_BxE, tokens_BxT, hidden_BxTxnxD, encoded_BxExD):
    return self(inputs_BxE, tokens_BxT, self.fuse_features(hidden_BxTxnxD), encoded_BxExD)


@dataclasses.dataclass(frozen=True)
class FeatureDraft:
  """A feature-level draft behind model-level calls (frozen, hashable: a static jit argument).

  It has the seam's members the loops check (kind, vocabulary, ids, `start_tokens`, `prefill`)
  and `shares_encoder` for T5, but its step is `extend_features` (tokens and features); its
  `extend` refuses, since a draft call without the target's features has nothing to draft from.
  Which scheme decodes it (chained, or parallel with mask entries of token `mask_id`) is the
  caller's choice (`decoding.drafter.FeatureDrafter`'s options), not the model's.

  `axis_rules` (optional, as `Model.axis_rules`; `specdec_jax.sharding` attaches the draft's):
  the logical-axis rules its parameters, activations and cache are laid out by on a mesh. Its
  own, because inside one program the target resolves the same names over more chips.

  `matmul` ('xla', or 'hybrid' / 'kernel' for params packed by `models.packed.pack`): the
  projections' layout and product, as `models.packed.PackedModel`'s. Checkpoints, training and
  sharding see 'xla' trees only.
  """

  config: FeatureDraftConfig
  head_ids: Optional[tuple[int, ...]] = None
  axis_rules: Optional[tuple] = None
  matmul: str = "xla"

  def _rules(self):
    if self.axis_rules is None:
      return contextlib.nullcontext()
    return nn.logical_axis_rules(self.axis_rules)

  @property
  def module(self) -> FeatureDraftModule:
    return FeatureDraftModule(self.config, self.head_ids, self.matmul)

  def restrict_head(self, params: Params, head_ids) -> tuple["FeatureDraft", Params]:
    """(draft, params) whose head computes the `head_ids` columns only (logit -inf elsewhere):
    `models.head_vocab`'s load-time restriction, for this draft's tree. Why: its head is the
    target's whole [D, V] head, most of what one draft step reads; exact for any ids (the
    rejection sampler is exact for any q), only alpha can change. Checkpoints never hold a
    restricted head; training may run one (`FeatureTrainConfig.head_vocab`: a frozen piece, so
    its checkpoints hold the same trainable params either way)."""
    ids = tuple(int(t) for t in head_ids)
    v = self.vocab_size
    if self.matmul != "xla":
      raise ValueError("restrict the head before packing (models.packed.for_backend)")
    if self.head_ids is not None:
      raise ValueError("this feature draft's head is already restricted")
    if not ids or list(ids) != sorted(set(ids)) or ids[0] < 0 or ids[-1] >= v:
      raise ValueError(f"head_ids must be sorted, distinct token ids in [0, {v})")
    kernel_DxK = jnp.take(jnp.asarray(params["logits_dense"]["kernel"]),
                          jnp.asarray(ids, jnp.int32), axis=-1)
    head = dict(params["logits_dense"], kernel=kernel_DxK)
    return dataclasses.replace(self, head_ids=ids), dict(params, logits_dense=head)

  kind = property(lambda self: self.config.kind)
  vocab_size = property(lambda self: self.config.vocab_size)
  eos_id = property(lambda self: self.config.eos_id)
  pad_id = property(lambda self: self.config.pad_id)
  feature_layers = property(lambda self: self.config.feature_layers)
  width = property(lambda self: self.config.emb_dim)

  @property
  def mask_id(self) -> int:
    """The mask entries' token: the one block training used (`config.mask_id`), else pad."""
    return self.config.pad_id if self.config.mask_id is None else self.config.mask_id

  @property
  def shares_encoder(self) -> bool:
    """T5: it cross-attends to the target's encoder output (the loops encode once, for both)."""
    return self.config.kind == "t5"

  def init(self, rng: jax.Array) -> Params:
    """Random float32 parameters (the shared pieces too: `with_target_pieces` copies them)."""
    return jax.jit(lambda r: nn.unbox(self._init_boxed(r)))(rng)

  def _init_boxed(self, rng: jax.Array):
    cfg, e = self.config, 4
    enc = jnp.zeros((1, e, cfg.source_dim), jnp.float32) if cfg.kind == "t5" else None
    hidden = jnp.zeros((1, 4, len(cfg.feature_layers), cfg.target_dim), jnp.float32)
    return self.module.init(rng, jnp.ones((1, e), jnp.int32), jnp.ones((1, 4), jnp.int32),
                            hidden, enc, method=FeatureDraftModule.init_all)["params"]

  def logical_axes(self) -> Params:
    """PartitionSpec tree of logical axis names, the structure of `init`'s output (what
    `sharding.param_shardings` lays its params out by: the block's kernels by heads / mlp, the
    copied embedding and head by vocab, the fusion and input projections replicated)."""
    if self.matmul != "xla":
      raise ValueError("packed params are a single-device CPU compute layout with no sharding; "
                       "shard the unpacked draft (specdec_jax.models.packed.unpack) instead")
    return nn.get_partition_spec(jax.eval_shape(self._init_boxed, jax.random.key(0)))

  def param_shapes(self) -> Params:
    return jax.eval_shape(self.init, jax.random.key(0))

  def frozen_names(self) -> tuple[str, ...]:
    """Top-level parameter names copied from the target and never trained."""
    return ("token_embedder",) + (("decoder_norm", "logits_dense")
                                  if self.config.head == "target" else ())

  def with_target_pieces(self, params: Params, target_params: Params) -> Params:
    """`params` with the target's embedding (and, head='target', its final norm and head)."""
    out = dict(params, token_embedder=target_params["token_embedder"])
    if self.config.head == "target":
      decoder = target_params["decoder"]
      head = decoder.get("logits_dense")
      if head is None:  # tied embeddings (SmolLM2, Llama-3.2): the head is the table, transposed
        head = {"kernel": jnp.asarray(target_params["token_embedder"]["embedding"]).T}
      out.update(decoder_norm=decoder["decoder_norm"], logits_dense=head)
    return out

  def start_tokens(self, inputs_BxP: jax.Array) -> jax.Array:
    if self.config.kind == "t5":
      return jnp.full(inputs_BxP.shape[:1], self.config.pad_id, jnp.int32)
    lengths_B = jnp.sum(inputs_BxP != self.config.pad_id, axis=1).astype(jnp.int32)
    return jnp.take_along_axis(inputs_BxP, jnp.maximum(lengths_B - 1, 0)[:, None], axis=1)[:, 0]

  def prefill(self, params: Params, inputs_BxP: jax.Array, cache_len: int, *,
              encoded: Optional[Encoded] = None) -> DecodeCache:
    """An empty cache in the target's coordinates (index = the start token's slot); T5 caches
    its cross K/V of the target's `encoded`. Decoder-only: the prompt's entries are not filled
    here (a cache knows no target states); the loops feed them from the target's
    `prefill_with_hidden` (`decoding.feature_entries.prime_carry`)."""
    batch = inputs_BxP.shape[0]
    if self.config.kind == "t5" and encoded is None:
      raise ValueError("a T5 feature draft cross-attends to its target's encoder output: pass "
                       "the target's `encode` output as `encoded`")
    with self._rules():
      if self.config.kind == "t5":
        return constrain_cache(self.module.apply(
            {"params": params}, batch, cache_len, encoded.states_BxExD, encoded.mask_BxE,
            method=FeatureDraftModule.empty_cache))
      cache = constrain_cache(self.module.apply({"params": params}, batch, cache_len,
                                                method=FeatureDraftModule.empty_cache))
    lengths_B = jnp.sum(inputs_BxP != self.config.pad_id, axis=1).astype(jnp.int32)
    return cache.rollback(jnp.maximum(lengths_B - 1, 0))

  def fuse(self, params: Params, hidden_BxTxnxD: jax.Array) -> jax.Array:
    """The target's states [B, T, n, target_dim] -> features g [B, T, emb_dim]."""
    with self._rules():
      return self.module.apply({"params": params}, hidden_BxTxnxD,
                               method=FeatureDraftModule.fuse_features)

  def extend_features(self, params: Params, cache: DecodeCache, tokens_BxT: jax.Array,
                      g_BxTxD: jax.Array, *, offsets: Optional[jax.Array] = None,
                      visible: Optional[jax.Array] = None
                      ) -> tuple[jax.Array, jax.Array, DecodeCache]:
    """Feeds T entries (g_t, token_t) per example at `cache.index_B`: (float32 logits [B, T, V]
    predicting the token after each entry's token, output features [B, T, emb_dim], cache).
    On a mesh the logits come back with the vocabulary gathered and the cache pinned to its
    batch / heads layout, as `Model.extend` leaves a token draft's. `offsets` / `visible`: a
    block that is not a chain (`transformer.masked_block`, a window included: a draft tree's
    level, drafted by `decoding.drafter.FeatureDrafter`)."""
    with self._rules():
      logits_BxTxV, out_BxTxD, cache = self.module.apply(
          {"params": params}, cache, tokens_BxT, g_BxTxD, offsets, visible,
          method=FeatureDraftModule.extend)
      logits_BxTxV = nn.with_logical_constraint(logits_BxTxV, ("batch", "length", None))
      return logits_BxTxV, out_BxTxD, constrain_cache(cache)

  def feed_features(self, params: Params, cache: DecodeCache, tokens_BxT: jax.Array,
                    g_BxTxD: jax.Array) -> tuple[jax.Array, DecodeCache]:
    """`extend_features` without the head: (output features [B, T, emb_dim], cache). Why: a
    call that only writes entries into the cache (a prompt's, or those a lookup-drafted
    iteration left pending) or needs q at one of them (`logits` on that one) does not pay the
    head on every entry, whatever the compiler's dead-code elimination keeps."""
    with self._rules():
      out_BxTxD, cache = self.module.apply({"params": params}, cache, tokens_BxT, g_BxTxD,
                                           method=FeatureDraftModule.feed)
      return out_BxTxD, constrain_cache(cache)

  def logits(self, params: Params, out_BxTxD: jax.Array) -> jax.Array:
    """The head on output features (float32 logits [B, T, V]): what `extend_features` returns
    beside them. Why apart: a call that feeds several entries but needs q at one of them (the
    feature chain's first call) applies the head to that one only; the head is most of a step
    on CPU (the zoo code draft: 0.47 of its 0.65 ms), and the unused rows' are never computed."""
    with self._rules():
      logits_BxTxV = self.module.apply({"params": params}, out_BxTxD,
                                       method=FeatureDraftModule.logits)
      return nn.with_logical_constraint(logits_BxTxV, ("batch", "length", None))

  def compact_logits(self, params: Params, out_BxTxD: jax.Array) -> jax.Array:
    """The head's own columns (float32 [B, T, K], the `head_ids` order; K = V when not
    restricted): what training with a restricted head compares to the target's p over the same
    ids, without writing -inf into the other V - K columns."""
    with self._rules():
      return self.module.apply({"params": params}, out_BxTxD,
                               method=FeatureDraftModule.compact_logits)

  def target_logits(self, params: Params, state_BxTxD: jax.Array) -> jax.Array:
    """The target's own next-token logits (compact columns) from its last layer's output state,
    through the copied final norm and head (head='target'): a teacher computed from a stored
    state (`training.target_states`) instead of a target pass."""
    if self.config.head != "target":
      raise ValueError("target_logits needs the target's head (FeatureDraftConfig.head='target')")
    with self._rules():
      return self.module.apply({"params": params}, state_BxTxD,
                               method=FeatureDraftModule.norm_and_head)

  def features(self, params: Params, inputs_BxP: jax.Array, tokens_BxT: jax.Array,
               g_BxTxD: jax.Array, *, encoded: Optional[Encoded] = None, offsets=None,
               visible=None) -> jax.Array:
    """`forward`'s output features alone: training applies its own (compact) head."""
    states = None if encoded is None else encoded.states_BxExD
    if self.config.kind == "t5" and states is None:
      raise ValueError("a T5 feature draft needs its target's `encoded` source")
    with self._rules():
      return self.module.apply({"params": params}, inputs_BxP, tokens_BxT, g_BxTxD, states,
                               offsets, visible, method=FeatureDraftModule.features)

  def extend(self, params, cache, tokens_BxT):
    raise TypeError("a feature-level draft drafts from the target's features: drive it with "
                    "`extend_features` (a FeatureDrafter), not `extend`")

  def forward(self, params: Params, inputs_BxP: jax.Array, tokens_BxT: jax.Array,
              g_BxTxD: jax.Array, *, encoded: Optional[Encoded] = None, offsets=None,
              visible=None) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced (logits, output features); `offsets` / `visible` lay out a block that is
    not a chain (`transformer.masked_block`: training-time test's rolled-out steps)."""
    states = None if encoded is None else encoded.states_BxExD
    if self.config.kind == "t5" and states is None:
      raise ValueError("a T5 feature draft needs its target's `encoded` source")
    with self._rules():
      return self.module.apply({"params": params}, inputs_BxP, tokens_BxT, g_BxTxD, states,
                               offsets, visible)
