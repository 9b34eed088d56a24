"""Model configuration and size presets.

One frozen dataclass describes both model kinds (T5 v1.1 encoder-decoder and the decoder-only LM),
so checkpoints can store it as JSON beside the weights and a run needs only the path. Field names
follow T5X's `network.T5Config` where they exist.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

ModelKind = Literal["t5", "decoder"]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of one model. Hashable, so it can be a static jit argument."""

  kind: ModelKind = "t5"
  vocab_size: int = 32128
  emb_dim: int = 512
  num_heads: int = 6
  num_encoder_layers: int = 8
  num_decoder_layers: int = 8
  head_dim: int = 64
  mlp_dim: int = 1024
  # Activation dtype. Parameters stay in their stored dtype and are cast per layer, as in T5X.
  # float32 on CPU (bfloat16 matvecs are ~20x slower in XLA:CPU), bfloat16 on TPU/GPU.
  dtype: str = "float32"
  # Python-unrolled layers ran 2-5x faster than lax.scan on CPU; scanned layers (nn.scan,
  # parameters stacked under `layers` as in T5X) compile faster for deep models on TPU.
  # Checkpoints convert between the two trees; both compute the same logits.
  scan_layers: bool = False
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  dropout_rate: float = 0.0
  # Special ids (T5 / seqio conventions): pad = BOS = 0, EOS = 1.
  pad_id: int = 0
  eos_id: int = 1
  # 0: the model reads its source with its own encoder. > 0 (T5 drafts only): a shared-encoder
  # draft, a decoder with no encoder of its own that cross-attends to its TARGET's encoder output
  # of this width (`decoding.seam.Encoded`), projected to emb_dim when the widths differ. The
  # request is encoded once, by the strong encoder (as a distilled Whisper assists Whisper).
  source_dim: int = 0

  def __post_init__(self):
    if self.kind not in ("t5", "decoder"):
      raise ValueError(f"ModelConfig.kind must be 't5' or 'decoder', got {self.kind!r}")
    for name in ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim",
                 "num_decoder_layers"):
      if getattr(self, name) < 1:
        raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.source_dim < 0:
      raise ValueError(f"ModelConfig.source_dim must be >= 0, got {self.source_dim}")
    if self.source_dim and self.kind != "t5":
      raise ValueError("ModelConfig.source_dim > 0 (a shared-encoder draft) needs kind 't5': "
                       "a decoder-only model has no encoder output to share")
    if self.source_dim and self.num_encoder_layers:
      raise ValueError(f"a shared-encoder draft (source_dim {self.source_dim}) has no encoder of "
                       f"its own: num_encoder_layers must be 0, got {self.num_encoder_layers}")
    if self.kind == "t5" and not self.source_dim and self.num_encoder_layers < 1:
      raise ValueError("a T5 model needs num_encoder_layers >= 1 (or source_dim > 0: a "
                       "shared-encoder draft)")
    if self.dtype not in ("float32", "bfloat16", "float16"):
      raise ValueError(f"ModelConfig.dtype must be float32, bfloat16 or float16, got {self.dtype!r}")

  @property
  def is_encoder_decoder(self) -> bool:
    return self.kind == "t5"

  @property
  def shares_encoder(self) -> bool:
    """A draft decoder over its target's encoder output (see `source_dim`)."""
    return self.source_dim > 0

  def replace(self, **changes: Any) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"unknown ModelConfig fields {unknown}; known: {sorted(known)}")
    return cls(**d)

  @classmethod
  def from_json(cls, text: str) -> "ModelConfig":
    return cls.from_dict(json.loads(text))

  def num_params(self) -> int:
    """Parameter count, computed from shapes (matches the initialised tree)."""
    e, i, m, v, h = self.emb_dim, self.num_heads * self.head_dim, self.mlp_dim, self.vocab_size, self.num_heads
    attn = 4 * e * i
    mlp = 3 * e * m
    rel = h * self.relative_attention_num_buckets
    total = v * e + v * e + e  # embedding, logits_dense, decoder_norm
    total += self.num_decoder_layers * (attn + mlp + 2 * e) + rel
    if self.is_encoder_decoder:
      if self.shares_encoder:  # no encoder; the projection of the target's states, if any
        total += 0 if self.source_dim == e else self.source_dim * e
      else:
        total += self.num_encoder_layers * (attn + mlp + 2 * e) + rel + e
      total += self.num_decoder_layers * (attn + e)  # cross-attention + its norm
    return total


# T5 v1.1 sizes (t5x/examples/t5/t5_1_1/*.gin). vocab 32128 = 32100 ids padded to 128.
_T5_1_1 = dict(
    small=dict(emb_dim=512, num_heads=6, num_encoder_layers=8, num_decoder_layers=8, mlp_dim=1024),
    base=dict(emb_dim=768, num_heads=12, num_encoder_layers=12, num_decoder_layers=12, mlp_dim=2048),
    large=dict(emb_dim=1024, num_heads=16, num_encoder_layers=24, num_decoder_layers=24, mlp_dim=2816),
    xl=dict(emb_dim=2048, num_heads=32, num_encoder_layers=24, num_decoder_layers=24, mlp_dim=5120),
    xxl=dict(emb_dim=4096, num_heads=64, num_encoder_layers=24, num_decoder_layers=24, mlp_dim=10240),
)

PRESETS: dict[str, ModelConfig] = {
    **{f"t5_1_1_{k}": ModelConfig(kind="t5", vocab_size=32128, head_dim=64, **v) for k, v in _T5_1_1.items()},
    # The model T5X's own tests use (t5x/examples/t5/t5_1_1/tiny.gin).
    "t5_1_1_tiny": ModelConfig(kind="t5", vocab_size=32128, emb_dim=8, num_heads=4, head_dim=3,
                               mlp_dim=16, num_encoder_layers=2, num_decoder_layers=2),
    # Small random models for tests and the smoke job (vocabulary small to keep tests fast).
    "t5_test_target": ModelConfig(kind="t5", vocab_size=64, emb_dim=32, num_heads=4, head_dim=8,
                                  mlp_dim=64, num_encoder_layers=2, num_decoder_layers=2),
    "t5_test_draft": ModelConfig(kind="t5", vocab_size=64, emb_dim=16, num_heads=2, head_dim=8,
                                 mlp_dim=32, num_encoder_layers=1, num_decoder_layers=1),
    # Decodes on top of t5_test_target's encoder output (width 32), projected to 16.
    "t5_test_shared_draft": ModelConfig(kind="t5", vocab_size=64, emb_dim=16, num_heads=2,
                                        head_dim=8, mlp_dim=32, num_encoder_layers=0,
                                        num_decoder_layers=1, source_dim=32),
    "decoder_test_target": ModelConfig(kind="decoder", vocab_size=64, emb_dim=32, num_heads=4,
                                       head_dim=8, mlp_dim=64, num_encoder_layers=0,
                                       num_decoder_layers=2),
    "decoder_test_draft": ModelConfig(kind="decoder", vocab_size=64, emb_dim=16, num_heads=2,
                                      head_dim=8, mlp_dim=32, num_encoder_layers=0,
                                      num_decoder_layers=1),
    # The local zoo (vocabulary: the shipped 8k SentencePiece model, 8100 ids padded to 8192).
    # Target: 21M parameters, 84 MB in float32, over the CPU's 32 MB L3 (memory-bound decode).
    # Drafts grow roughly 1 : 2.6 : 6.6 like T5-small : base : large (embeddings dominate the
    # smallest; a model draft cannot shrink below its 8k-row tables).
    "zoo_t5_target": ModelConfig(kind="t5", vocab_size=8192, emb_dim=512, num_heads=8, head_dim=64,
                                 mlp_dim=1024, num_encoder_layers=2, num_decoder_layers=2),
    "zoo_t5_draft_small": ModelConfig(kind="t5", vocab_size=8192, emb_dim=64, num_heads=2,
                                      head_dim=32, mlp_dim=128, num_encoder_layers=1,
                                      num_decoder_layers=1),
    "zoo_t5_draft_base": ModelConfig(kind="t5", vocab_size=8192, emb_dim=128, num_heads=4,
                                     head_dim=32, mlp_dim=256, num_encoder_layers=2,
                                     num_decoder_layers=2),
    "zoo_t5_draft_large": ModelConfig(kind="t5", vocab_size=8192, emb_dim=256, num_heads=4,
                                      head_dim=64, mlp_dim=512, num_encoder_layers=2,
                                      num_decoder_layers=2),
    # A shared-encoder draft for zoo_t5_target: t5_draft_base's decoder (width 128, two layers)
    # cross-attending to the target's 512-wide encoder output through a learned projection.
    "zoo_t5_shared_draft": ModelConfig(kind="t5", vocab_size=8192, emb_dim=128, num_heads=4,
                                       head_dim=32, mlp_dim=256, num_encoder_layers=0,
                                       num_decoder_layers=2, source_dim=512),
    "zoo_lm_target": ModelConfig(kind="decoder", vocab_size=8192, emb_dim=256, num_heads=4,
                                 head_dim=64, mlp_dim=768, num_encoder_layers=0,
                                 num_decoder_layers=4),
    "zoo_lm_draft": ModelConfig(kind="decoder", vocab_size=8192, emb_dim=128, num_heads=2,
                                head_dim=64, mlp_dim=256, num_encoder_layers=0,
                                num_decoder_layers=2),
    # GPT-like 97M of Leviathan Table 3 and its 6M draft (vocabulary of the local SentencePiece model).
    "decoder_97m": ModelConfig(kind="decoder", vocab_size=32128, emb_dim=768, num_heads=12,
                               head_dim=64, mlp_dim=3072, num_encoder_layers=0, num_decoder_layers=12),
    "decoder_6m": ModelConfig(kind="decoder", vocab_size=32128, emb_dim=256, num_heads=4,
                              head_dim=64, mlp_dim=1024, num_encoder_layers=0, num_decoder_layers=2),
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
  """Returns a preset by name, with field overrides (e.g. dtype='bfloat16')."""
  if name not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
  return PRESETS[name].replace(**overrides)
