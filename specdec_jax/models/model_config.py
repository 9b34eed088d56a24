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
  # The modern decoder family (Llama, Qwen2, Gemma; kind 'decoder' only). The defaults are the
  # T5-style LM above, so existing configs and checkpoints read unchanged; an HF checkpoint sets
  # them from its config.json (`checkpoints.hf`).
  # 'relative': T5 buckets (one table per stack); 'rope': rotary positions, no table.
  position: str = "relative"
  rope_theta: float = 10000.0
  # Llama-3's frequency scaling: () none, or (factor, low_freq_factor, high_freq_factor,
  # original_max_position_embeddings) as HF's rope_scaling {"rope_type": "llama3", ...}.
  rope_scaling: tuple = ()
  # Key/value heads (grouped-query attention; the cache holds these): 0 = num_heads.
  num_kv_heads: int = 0
  # Gated MLP activation: 'gelu' (tanh approximation: T5 v1.1, Gemma's GeGLU) or 'silu' (SwiGLU).
  mlp_activation: str = "gelu"
  # RMSNorm multiplies by (norm_offset + scale): 0 (T5, Llama, Qwen2) or 1 (Gemma).
  norm_offset: float = 0.0
  # The output head is the embedding table transposed (no `logits_dense`).
  tie_embeddings: bool = False
  # Embeddings multiplied by sqrt(emb_dim) (Gemma).
  scale_embeddings: bool = False
  # Biases on the query/key/value projections (Qwen2).
  qkv_bias: bool = False
  # Attention logits q.k multiplied by this (in float32). 1.0: T5X, whose checkpoints fold
  # 1/sqrt(head_dim) into the query kernel; the HF families scale at run time (head_dim ** -0.5),
  # and folding it into a bfloat16 kernel would round the weights once more.
  attention_scale: float = 1.0

  def __post_init__(self):
    if isinstance(self.rope_scaling, list):  # from JSON
      object.__setattr__(self, "rope_scaling", tuple(self.rope_scaling))
    self._check_family()
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

  def _check_family(self):
    """The modern-family fields: valid values, and decoder-only where T5 has no counterpart."""
    if self.position not in ("relative", "rope"):
      raise ValueError(f"ModelConfig.position must be 'relative' or 'rope', got {self.position!r}")
    if self.mlp_activation not in ("gelu", "silu"):
      raise ValueError(f"ModelConfig.mlp_activation must be 'gelu' or 'silu', got "
                       f"{self.mlp_activation!r}")
    if self.rope_scaling and len(self.rope_scaling) != 4:
      raise ValueError("ModelConfig.rope_scaling must be () or (factor, low_freq_factor, "
                       f"high_freq_factor, original_max_position_embeddings), got "
                       f"{self.rope_scaling!r}")
    if self.num_kv_heads < 0 or (self.num_kv_heads and self.num_heads % self.num_kv_heads):
      raise ValueError(f"ModelConfig.num_kv_heads ({self.num_kv_heads}) must divide num_heads "
                       f"({self.num_heads}), or be 0 (= num_heads)")
    modern = (self.position != "relative" or self.num_kv_heads not in (0, self.num_heads)
              or self.tie_embeddings or self.scale_embeddings or self.qkv_bias)
    if modern and self.kind != "decoder":
      raise ValueError("rotary positions, grouped-query attention, tied heads, embedding scale "
                       "and q/k/v biases are decoder-only (kind 'decoder') options")

  @property
  def kv_heads(self) -> int:
    """Heads of the keys and values (and of the cache)."""
    return self.num_kv_heads or self.num_heads

  @property
  def uses_rope(self) -> bool:
    return self.position == "rope"

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
    rel = 0 if self.uses_rope else h * self.relative_attention_num_buckets
    kv = self.kv_heads * self.head_dim
    self_attn = 2 * e * i + 2 * e * kv + (i + 2 * kv if self.qkv_bias else 0)
    total = v * e + (0 if self.tie_embeddings else v * e) + e  # embedding, head, decoder_norm
    total += self.num_decoder_layers * (self_attn + mlp + 2 * e) + rel
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

_LLAMA = dict(position="rope", mlp_activation="silu", layer_norm_epsilon=1e-5)


def _scaled(**shape: Any) -> dict[str, Any]:
  """A shape with the HF families' run-time attention scale head_dim ** -0.5."""
  return dict(shape, attention_scale=shape["head_dim"] ** -0.5)
# Llama 3.x (HF config.json of meta-llama/Llama-3.1-70B, -3.1-8B, -3.2-1B): shapes only, no
# weights, for ahead-of-time compilation on TPU slices and as Chen et al.'s 70B-class target with
# a 1B draft of its family. eos is <|end_of_text|>; pad is <|finetune_right_pad_id|>, as a
# converted Llama-3.1 checkpoint reads it (`checkpoints.hf_decoder.choose_pad_id`).
_LLAMA3 = dict(vocab_size=128256, rope_theta=500000.0, eos_id=128001, pad_id=128004)
_LLAMA3_SIZES = dict(
    llama3_1_70b=dict(emb_dim=8192, num_heads=64, num_kv_heads=8, head_dim=128, mlp_dim=28672,
                      num_decoder_layers=80, rope_scaling=(8.0, 1.0, 4.0, 8192)),
    llama3_1_8b=dict(emb_dim=4096, num_heads=32, num_kv_heads=8, head_dim=128, mlp_dim=14336,
                     num_decoder_layers=32, rope_scaling=(8.0, 1.0, 4.0, 8192)),
    llama3_2_1b=dict(emb_dim=2048, num_heads=32, num_kv_heads=8, head_dim=64, mlp_dim=8192,
                     num_decoder_layers=16, rope_scaling=(32.0, 1.0, 4.0, 8192),
                     tie_embeddings=True),
)

# Presets of a public checkpoint's shape keep its vocabulary (its tokenizer's ids), whatever
# vocabulary a run's text task has: a random-init T5 or test preset takes the run's instead.
OWN_VOCABULARY = frozenset(_LLAMA3_SIZES) | {"smollm2_135m", "smollm2_draft"}

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
    # The modern decoder family in small: rotary positions, SwiGLU, grouped-query attention
    # (4 query heads over 2 key/value heads; the draft 2 over 1, its head tied to its embedding).
    "llama_test_target": ModelConfig(kind="decoder", vocab_size=64, emb_dim=32, num_heads=4,
                                     mlp_dim=64, num_encoder_layers=0, num_decoder_layers=2,
                                     **_LLAMA, **_scaled(head_dim=8), num_kv_heads=2),
    "llama_test_draft": ModelConfig(kind="decoder", vocab_size=64, emb_dim=16, num_heads=2,
                                    mlp_dim=32, num_encoder_layers=0, num_decoder_layers=1,
                                    **_LLAMA, **_scaled(head_dim=8), num_kv_heads=1,
                                    tie_embeddings=True),
    **{name: ModelConfig(kind="decoder", num_encoder_layers=0, **_LLAMA, **_LLAMA3,
                         **_scaled(**shape))
       for name, shape in _LLAMA3_SIZES.items()},
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
    # The local zoo's code pair in the modern family (issue 30): the shapes of zoo_lm_target /
    # zoo_lm_draft with rotary positions, SwiGLU, RMSNorm at 1e-5, the run-time attention scale and
    # grouped-query attention (4 query heads over 2 key/value heads; the draft 2 over 1): a
    # Llama-3 70B / 1B pair in miniature. The draft's head is its own: tied to the embedding (as
    # Llama-3.2-1B's) under this project's unit-variance embedding init (T5X's), the same 230
    # steps reached valid CE 6.06 against 4.83 for lm_draft (logits start ~sqrt(128) wide).
    "zoo_llama_target": ModelConfig(kind="decoder", vocab_size=8192, emb_dim=256, num_heads=4,
                                    mlp_dim=768, num_encoder_layers=0, num_decoder_layers=4,
                                    **_LLAMA, **_scaled(head_dim=64), num_kv_heads=2),
    "zoo_llama_draft": ModelConfig(kind="decoder", vocab_size=8192, emb_dim=128, num_heads=2,
                                   mlp_dim=256, num_encoder_layers=0, num_decoder_layers=2,
                                   **_LLAMA, **_scaled(head_dim=64), num_kv_heads=1),
    # SmolLM2-135M-Instruct's shape (the fetched target, `checkpoints.fetch`), for benchmarks with
    # random weights (scripts/bench_loop.py) and ahead-of-time compilation.
    "smollm2_135m": ModelConfig(kind="decoder", vocab_size=49152, emb_dim=576, num_heads=9,
                                mlp_dim=1536, num_encoder_layers=0, num_decoder_layers=30,
                                **_LLAMA, **_scaled(head_dim=64), num_kv_heads=3,
                                tie_embeddings=True, rope_theta=100000.0, pad_id=0, eos_id=2),
    # A draft for SmolLM2-135M-Instruct (the fetched target, MODEL_CARD.md): its tokenizer, pad
    # and EOS, a tied head; 6.8M parameters, 6.3M of them the embedding, so a draft step reads
    # ~1/20 of the target's weights (configs/local/train/smollm2_draft.gin).
    "smollm2_draft": ModelConfig(kind="decoder", vocab_size=49152, emb_dim=128, num_heads=2,
                                 mlp_dim=384, num_encoder_layers=0, num_decoder_layers=2,
                                 **_LLAMA, **_scaled(head_dim=64), num_kv_heads=1,
                                 tie_embeddings=True, rope_theta=100000.0, pad_id=0, eos_id=2),
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
