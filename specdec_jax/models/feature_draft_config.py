"""A feature-level draft's shape (`FeatureDraftConfig`): what a checkpoint stores beside the
weights as JSON, and what the model (`models.feature_draft`), the trainer and the TPU compile
jobs read. Apart from the model because those last two need the shape without the module: the
AOT programs build abstract drafts from it, and the trainer writes it before any weights exist.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

from specdec_jax.models.model_config import ModelConfig

HEADS = ("target", "own")


@dataclasses.dataclass(frozen=True)
class FeatureDraftConfig:
  """A feature-level draft's shape. Hashable (a static jit argument), JSON beside the weights.

  target_dim: the target's width (its embedding and its head's input). feature_layers: which of
  the target's residual states it reads (`Model.extend_with_hidden`'s indices). emb_dim,
  num_heads, head_dim, mlp_dim: the one block. source_dim: T5, the target's encoder width it
  cross-attends to (0 for decoder-only). head: 'target' (frozen copy) or 'own'. block_size: the
  block G its mask entries were trained for (`training/feature_blocks.py`; 0: not trained for
  the parallel chain); mask_id: the mask entries' token in that training (None: the pad id), so
  `FeatureDrafter(parallel=True)` feeds the token the draft learned, whatever the run's defaults.
  """

  kind: str = "t5"
  vocab_size: int = 64
  target_dim: int = 32
  feature_layers: tuple[int, ...] = (0, 1, 2)
  emb_dim: int = 32
  num_heads: int = 4
  head_dim: int = 8
  mlp_dim: int = 64
  source_dim: int = 32
  head: str = "target"
  dtype: str = "float32"
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  pad_id: int = 0
  eos_id: int = 1
  block_size: int = 0
  mask_id: Optional[int] = None

  def __post_init__(self):
    object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
    if self.block_size < 0 or self.block_size == 1:
      raise ValueError(f"FeatureDraftConfig.block_size must be 0 (off) or >= 2, got "
                       f"{self.block_size}")
    if self.mask_id is not None and not 0 <= self.mask_id < self.vocab_size:
      raise ValueError(f"FeatureDraftConfig.mask_id {self.mask_id} is not a token id of the "
                       f"{self.vocab_size}-token vocabulary")
    if self.head not in HEADS:
      raise ValueError(f"FeatureDraftConfig.head must be one of {HEADS}, got {self.head!r}")
    if not self.feature_layers:
      raise ValueError("FeatureDraftConfig.feature_layers is empty: name the target's layers")
    if (self.kind == "t5") != (self.source_dim > 0):
      raise ValueError(f"a {self.kind} feature draft needs source_dim "
                       f"{'> 0 (the target encoder width)' if self.kind == 't5' else '0'}, "
                       f"got {self.source_dim}")
    self.block_config()  # validates the rest

  @classmethod
  def for_target(cls, target: ModelConfig, **overrides) -> "FeatureDraftConfig":
    """A draft shaped for `target`: its vocabulary, width, encoder width, and its low / middle /
    high states (embeddings, the middle layer's output, the last layer's output)."""
    if target.norm_offset and overrides.get("head", "target") == "target":
      raise ValueError(
          f"this target's final norm multiplies by (norm_offset {target.norm_offset:g} + scale) "
          "(Gemma); the feature draft's copy of it has no offset, so head='target' would read "
          "another head than the target's: use head='own'")
    n = target.num_decoder_layers
    base = dict(kind=target.kind, vocab_size=target.vocab_size, target_dim=target.emb_dim,
                feature_layers=tuple(sorted({0, n // 2, n})), emb_dim=target.emb_dim,
                num_heads=target.num_heads, head_dim=target.head_dim, mlp_dim=target.mlp_dim,
                source_dim=target.emb_dim if target.is_encoder_decoder else 0,
                relative_attention_num_buckets=target.relative_attention_num_buckets,
                relative_attention_max_distance=target.relative_attention_max_distance,
                layer_norm_epsilon=target.layer_norm_epsilon, pad_id=target.pad_id,
                eos_id=target.eos_id)
    return cls(**{**base, **overrides})

  def block_config(self) -> ModelConfig:
    """The block as a one-layer decoder (`transformer.DecoderLayer` reads this)."""
    return ModelConfig(kind=self.kind, vocab_size=self.vocab_size, emb_dim=self.emb_dim,
                       num_heads=self.num_heads, head_dim=self.head_dim, mlp_dim=self.mlp_dim,
                       num_encoder_layers=0, num_decoder_layers=1, dtype=self.dtype,
                       source_dim=self.source_dim,
                       relative_attention_num_buckets=self.relative_attention_num_buckets,
                       relative_attention_max_distance=self.relative_attention_max_distance,
                       layer_norm_epsilon=self.layer_norm_epsilon, pad_id=self.pad_id,
                       eos_id=self.eos_id)

  def replace(self, **changes: Any) -> "FeatureDraftConfig":
    return dataclasses.replace(self, **changes)

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "FeatureDraftConfig":
    return cls(**json.loads(text))
