"""T5 v1.1 building blocks, faithful to T5X (t5x/examples/t5/layers.py).

Parameter names, shapes and orientations equal T5X's, so a T5X checkpoint loads by name with no
transposes. Every parameter carries logical axis names (`embed`, `joined_kv`, `mlp`, `vocab`,
`heads`, `relpos_buckets`); gin-bound rules map them to mesh axes (see `specdec_jax.sharding`).

Shape legend used across the package: B batch, T new tokens in one call, S cache slots,
E encoder length, D model width (emb_dim), H heads, K head_dim, M mlp_dim, V vocabulary,
L layers, G gamma (draft tokens per iteration).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.kernels import matmul as kmatmul
from specdec_jax.models.model_config import ModelConfig

_NEG_INF = -1e10  # T5X's mask bias value.


def _dtype(config: ModelConfig):
  return jnp.dtype(config.dtype)


def _kernel_init(scale: float = 1.0):
  return nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal")


MATMULS = ("xla", "kernel", "hybrid")
# Above this many rows (a decoder-only prefill, a teacher-forced forward) a GEMM has arithmetic to
# amortise its packing, and XLA's is the better one; "hybrid" then uses XLA's dot.
HYBRID_MAX_KERNEL_ROWS = 64
# One row: XLA's matrix-vector product streams a large matrix faster than the kernel (the zoo
# target's 16 MB output head: 0.65 ms against 0.84 at load 2-4; the shared draft's 4 MB head:
# 0.40 against 0.46 at load 5), a small one slower (the target's 1-2 MB projections: 0.06-0.12
# ms against 0.055-0.076; per-call overhead dominates there). "hybrid" gives one row to the
# kernel up to this many weight bytes, to XLA's dot above. Float32 panels only: a matrix this
# large is cold in a decode step (the step's weights overflow the cache), and there bfloat16
# panels (`models.packed`) stream half the bytes and beat XLA's float32 product (the 16 MB head:
# 0.34 ms against 0.71), so one row of those always goes to the kernel. (With weights hot in
# cache one row is FMA-latency bound in the kernel; DESIGN.md "Machine facts".) 4 MB, not 3:
# SmolLM2-135M's MLP matrices (576 x 1536 float32, 3.5 MB, 90 of them: 318 MB of its 513 MB
# step) stream faster through the kernel (one row through all 90, cold: 5.1-6.6 ms against XLA's
# 7.0-7.7, interleaved in one process), and its whole autoregressive step was faster in each of
# 4 alternated process pairs: 10.6, 10.6, 13.5, 13.4 ms against 14.3, 14.3, 14.6, 14.6 at 3 MB
# (scripts/bench_loop.py --target=smollm2_135m, AMD EPYC 2 cores, load 0.8-2.3); no zoo
# matrix lies between 3 and 4 MB. 8 MB, not 4: the fused MLP input matrix (FUSED_PROJECTIONS) of
# SmolLM2 is 576 x 3072 float32, 7 MB, and one row of it (33 copies, cold) took 0.141 ms per call
# through the kernel against 0.156-0.161 through XLA's dot in two processes (the kernel was also
# faster for the 16 MB shape there, 0.30-0.33 against 0.38-0.44, unlike the figures above from
# an older kernel under load: left at XLA until measured on a quiet machine more than once).
# The threshold is global: unfused float32 matrices of 4-8 MB (T5 v1.1-base's 6.3 MB `wo`) move
# to the kernel for one row too, untimed; the paper configs run on TPUs, where nothing is packed.
HYBRID_GEMV_MAX_BYTES = 8 << 20
# The packed layouts fuse the projections that read one input into one matrix: a self-attention's
# query, key and value (`qkv`), a gated MLP's two input projections (`wi`: wi_0's columns, then
# wi_1's). Why: each cold matrix-vector product pays a start (its first cache misses, the pool's
# threads joining) and an end (the last thread waited for); SmolLM2-135M's 210 per-layer products
# streamed in 9.8 ms where the same 405 MB as 120 fused ones took 9.2 (AMD EPYC, 2 cores, one
# process, interleaved). The kernel computes each column alone, so a fused product's columns are
# bit for bit the separate products' (tests/kernels/test_packed_model.py); `models.packed`
# builds them from the checkpoint's separate matrices; checkpoints, training and sharding never
# see them.
FUSED_PROJECTIONS = ("kernel", "hybrid")


class Dense(nn.Module):
  """A bias-free projection with a 2-D (in, out) kernel, as T5X's DenseGeneral stores it.

  `matmul` chooses the weight layout and the product (see `specdec_jax.models.packed`, the only
  place that builds the non-default trees; checkpoints, training and sharding see only "xla"):
  - "xla": parameter `kernel` [in, out], XLA's dot;
  - "kernel": parameter `kernel_panels` [ceil(out / 16), in, 16], the CPU kernel
    (`specdec_jax.kernels.matmul.packed_matmul`: one pass over the weights for any row count);
  - "hybrid": both parameters; the kernel for 2..HYBRID_MAX_KERNEL_ROWS rows (verification
    blocks, where XLA's dot re-reads the weights) and for one row of a matrix up to
    HYBRID_GEMV_MAX_BYTES or in bfloat16 / int8 panels; XLA's dot for one row of a larger
    float32 one (its matrix-vector product streams those faster) and for more rows (a GEMM with
    arithmetic to amortise). Panels may be int8 with their scales (a draft's lossy layout,
    `models.packed.pack(panels='int8')`: then `kernel` holds the dequantized matrix).
  """

  features: int
  kernel_axes: tuple[str, str]
  dtype: jnp.dtype = jnp.float32
  init_scale: float = 1.0
  matmul: str = "xla"
  # A bias `bias` [out] (Qwen2's q/k/v), the same array in every matmul layout.
  use_bias: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    y = self._project(x)
    if not self.use_bias:
      return y
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                           self.kernel_axes[1:]),
                      (self.features,), jnp.float32)
    return y + jnp.asarray(bias, y.dtype).reshape((1,) * (y.ndim - 1) + (-1,))

  def _project(self, x: jax.Array) -> jax.Array:
    """x @ kernel in the layout `matmul` names (see the class docstring)."""
    if self.matmul not in MATMULS:
      raise ValueError(f"Dense.matmul must be one of {MATMULS}, got {self.matmul!r}")
    init = _kernel_init(self.init_scale)
    shape = (x.shape[-1], self.features)
    if self.matmul == "xla":
      kernel = self.param("kernel", nn.with_logical_partitioning(init, self.kernel_axes), shape,
                          jnp.float32)
      return _xla_dot(x, kernel, self.dtype)
    if self.has_variable("params", "kernel_panels"):
      # Read as given: int8 panels carry their scales in 4 extra rows (`kmatmul`), a shape the
      # float32 initializer below would refuse; `packed_matmul` checks it against x.
      panels = self.get_variable("params", "kernel_panels")
    else:
      panels = self.param("kernel_panels",
                          lambda key, shape: kmatmul.pack_panels(init(key, shape, jnp.float32)),
                          shape)
    if self.matmul == "hybrid":
      kernel = self.param("kernel", init, shape, jnp.float32)
      rows = math.prod(x.shape[:-1])
      big_gemv = (rows == 1 and panels.dtype == jnp.float32
                  and math.prod(shape) * 4 > HYBRID_GEMV_MAX_BYTES)
      if big_gemv or rows > HYBRID_MAX_KERNEL_ROWS:
        return _xla_dot(x, kernel, self.dtype)
    return kmatmul.packed_matmul(x, panels, self.features).astype(self.dtype)


def _xla_dot(x: jax.Array, kernel: jax.Array, dtype) -> jax.Array:
  return jnp.einsum("...i,io->...o", x.astype(dtype), jnp.asarray(kernel, dtype))


class LayerNorm(nn.Module):
  """T5 RMS norm: statistics in float32, no mean subtraction, no bias, eps 1e-6.

  `offset`: the multiplier is offset + scale; Gemma stores scale - 1 (offset 1), the rest 0."""

  epsilon: float = 1e-6
  dtype: jnp.dtype = jnp.float32
  offset: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                       (x.shape[-1],), jnp.float32)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.epsilon)
    if self.offset:  # Gemma multiplies in float32 before the cast (as HF's GemmaRMSNorm)
      y = y * (self.offset + scale.astype(jnp.float32)).reshape((1,) * (x.ndim - 1) + (-1,))
      return y.astype(self.dtype)
    scale = jnp.asarray(scale, self.dtype).reshape((1,) * (x.ndim - 1) + (-1,))
    return y.astype(self.dtype) * scale


_ACTIVATIONS = {"gelu": lambda x: nn.gelu(x, approximate=True), "silu": nn.silu}


class MlpBlock(nn.Module):
  """Gated MLP: act(x wi_0) * (x wi_1), then wo. act: `config.mlp_activation`, GELU with the tanh
  approximation (T5 v1.1, Gemma's GeGLU) or SiLU (Llama and Qwen2's SwiGLU); wi_0 is HF's
  gate_proj, wi_1 its up_proj, wo its down_proj.

  `matmul`: the three projections' layout and product (see `Dense`)."""

  config: ModelConfig
  matmul: str = "xla"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    cfg, dt, mm = self.config, _dtype(self.config), self.matmul
    if mm in FUSED_PROJECTIONS:  # packed: wi_0 and wi_1 as one matrix (see FUSED_PROJECTIONS)
      gate, lin = jnp.split(Dense(2 * cfg.mlp_dim, ("embed", "mlp"), dt, matmul=mm, name="wi")(x),
                            2, axis=-1)
    else:
      gate = Dense(cfg.mlp_dim, ("embed", "mlp"), dt, matmul=mm, name="wi_0")(x)
      lin = Dense(cfg.mlp_dim, ("embed", "mlp"), dt, matmul=mm, name="wi_1")(x)
    h = _ACTIVATIONS[cfg.mlp_activation](gate) * lin
    h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
    return Dense(cfg.emb_dim, ("mlp", "embed"), dt, matmul=mm, name="wo")(h)


def relative_position_bucket(relative_position: jax.Array, bidirectional: bool,
                             num_buckets: int = 32, max_distance: int = 128) -> jax.Array:
  """T5's bucketing of (key position - query position); identical to Mesh-TF, T5X and HF.

  Works on traced position arrays, so a multi-token extend at per-example offsets computes its
  buckets directly from the positions instead of slicing a precomputed L x L table.
  """
  n = -relative_position
  ret = jnp.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    ret = ret + (n < 0).astype(n.dtype) * num_buckets
    n = jnp.abs(n)
  else:
    n = jnp.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  n_float = jnp.maximum(n, 1).astype(jnp.float32)
  val_if_large = max_exact + (
      jnp.log(n_float / max_exact + np.finfo(np.float32).eps) / math.log(max_distance / max_exact)
      * (num_buckets - max_exact)).astype(n.dtype)
  val_if_large = jnp.minimum(val_if_large, num_buckets - 1)
  return ret + jnp.where(is_small, n, val_if_large)


class RelativePositionBiases(nn.Module):
  """One (H, buckets) table per stack, shared by its layers (T5X `relpos_bias/rel_embedding`)."""

  config: ModelConfig
  bidirectional: bool

  @nn.compact
  def __call__(self, q_pos_BxT: jax.Array, k_pos_BxS: jax.Array) -> jax.Array:
    cfg = self.config
    table_HxR = self.param(
        "rel_embedding",
        nn.with_logical_partitioning(nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
                                     ("heads", "relpos_buckets")),
        (cfg.num_heads, cfg.relative_attention_num_buckets), jnp.float32)
    rel_BxTxS = k_pos_BxS[:, None, :] - q_pos_BxT[:, :, None]
    buckets_BxTxS = relative_position_bucket(
        rel_BxTxS, self.bidirectional, cfg.relative_attention_num_buckets,
        cfg.relative_attention_max_distance)
    bias_BxTxSxH = jnp.take(table_HxR.T, buckets_BxTxS, axis=0)
    return jnp.transpose(bias_BxTxSxH, (0, 3, 1, 2)).astype(_dtype(cfg))


class Embed(nn.Module):
  """Token embedding table (vocab, emb); normal(1.0) init as T5X.

  `scale_embeddings` (Gemma): rows multiplied by sqrt(emb_dim), the factor rounded to the
  activation dtype first as HF does. `table()`: the array itself, for a head tied to it."""

  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.embedding = self.param(
        "embedding", nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed")),
        (cfg.vocab_size, cfg.emb_dim), jnp.float32)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    cfg = self.config
    x = jnp.take(jnp.asarray(self.embedding, _dtype(cfg)), tokens.astype(jnp.int32), axis=0)
    if cfg.scale_embeddings:
      x = x * jnp.asarray(math.sqrt(cfg.emb_dim), _dtype(cfg))
    return x

  def table(self) -> jax.Array:
    return self.embedding


def rope_frequencies(config: ModelConfig) -> np.ndarray:
  """Rotary inverse frequencies [K / 2] (HF's `inv_freq`), with Llama-3's scaling if configured:
  wavelengths past original_max / low_freq_factor are divided by factor, those under
  original_max / high_freq_factor kept, and the band between interpolated smoothly."""
  k = config.head_dim
  inv = 1.0 / (config.rope_theta ** (np.arange(0, k, 2, dtype=np.int64).astype(np.float32) / k))
  if not config.rope_scaling:
    return inv.astype(np.float32)
  factor, low, high, original = config.rope_scaling
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > original / low, inv / factor, inv)
  smooth = (original / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= original / high) & (wavelen <= original / low)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(config: ModelConfig, pos_BxT: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) [B, T, K] at each token's position, computed in float32 as HF does, then cast to
  the activation dtype. Why per call from positions: a token's position is data (its example's
  cache index, or a tree node's depth), so no table of max-length rows is kept."""
  inv_K2 = jnp.asarray(rope_frequencies(config))
  angles_BxTxK2 = pos_BxT.astype(jnp.float32)[:, :, None] * inv_K2[None, None, :]
  angles_BxTxK = jnp.concatenate([angles_BxTxK2, angles_BxTxK2], axis=-1)
  dt = _dtype(config)
  return jnp.cos(angles_BxTxK).astype(dt), jnp.sin(angles_BxTxK).astype(dt)


def apply_rope(x_BxTxHxK: jax.Array, cos_BxTxK: jax.Array, sin_BxTxK: jax.Array) -> jax.Array:
  """Rotates halves (HF's `rotate_half` convention, the layout HF checkpoints are stored in)."""
  half = x_BxTxHxK.shape[-1] // 2
  rotated = jnp.concatenate([-x_BxTxHxK[..., half:], x_BxTxHxK[..., :half]], axis=-1)
  return x_BxTxHxK * cos_BxTxK[:, :, None, :] + rotated * sin_BxTxK[:, :, None, :]


def mask_to_bias(mask: jax.Array, dtype) -> jax.Array:
  """1 = attend; T5X's `select(mask > 0, 0, -1e10)`."""
  return jnp.where(mask, 0.0, _NEG_INF).astype(dtype)


def scatter_logits(logits_BxTxK: jax.Array, head_ids: Sequence[int], vocab_size: int) -> jax.Array:
  """[..., K] head logits -> [..., V] with -inf off the head's tokens (a draft's restricted head,
  `models.head_vocab`: here, below the transformer and the head restriction both, so neither
  imports the other to reach it)."""
  ids_K = jnp.asarray(head_ids, jnp.int32)
  full = jnp.full(logits_BxTxK.shape[:-1] + (vocab_size,), -jnp.inf, logits_BxTxK.dtype)
  return full.at[..., ids_K].set(logits_BxTxK, indices_are_sorted=True, unique_indices=True)
