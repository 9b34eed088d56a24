"""Logits processing, applied identically to the target and the draft.

Speculative sampling is exact only for the *processed* distributions: temperature, top-k and top-p
must turn both p and q into the distributions the acceptance rule compares (Leviathan et al.,
"standardised" sampling). Applying a processor to one side only is a classic silent bug of other
engines, so both loops call this one function. Temperature 0 means greedy: the distribution is the
one-hot of the argmax, and the same acceptance rule then accepts exactly when the argmaxes agree.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from specdec_jax.reductions import argmax  # noqa: F401  (re-exported: the loop's argmax)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """temperature 0 = greedy; top_k 0 = off; top_p 1.0 = off. Hashable (a static jit argument)."""

  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
      raise ValueError(f"temperature must be finite and >= 0 (0 means greedy), got "
                       f"{self.temperature}")
    if not isinstance(self.top_k, int) or self.top_k < 0:
      raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0


def process_logits(logits_NxV: jax.Array, cfg: SamplingConfig) -> jax.Array:
  """Returns the float32 distribution the sampler draws from: [..., V] logits -> [..., V] probs."""
  logits = logits_NxV.astype(jnp.float32)
  if cfg.greedy:
    return jax.nn.one_hot(argmax(logits), logits.shape[-1], dtype=jnp.float32)
  logits = logits / cfg.temperature
  if cfg.top_k and cfg.top_k < logits.shape[-1]:
    kth = jax.lax.top_k(logits, cfg.top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if cfg.top_p < 1.0:
    logits = _top_p_mask(logits, cfg.top_p)
  return jax.nn.softmax(logits, axis=-1)


def _top_p_mask(logits: jax.Array, top_p: float) -> jax.Array:
  """Keeps the smallest set of most likely tokens whose mass reaches top_p (nucleus sampling),
  ties at the edge kept: every token with p >= tau, tau the largest value with mass(p >= tau) >=
  top_p. Found by bisection over the float32 bit patterns of p (non-negative floats order as
  their int32 bits), 31 masked sums, not a sort. Why: XLA:CPU sorts a large-vocabulary row so
  slowly that top-p at every drafted and verified position cost more than a target step; the
  kept set is the sort's (tests/decoding/test_sampling.py holds them equal)."""
  probs = jax.nn.softmax(logits, axis=-1)
  bits = jax.lax.bitcast_convert_type(probs, jnp.int32)
  lo = jnp.zeros(probs.shape[:-1] + (1,), jnp.int32)              # mass(p >= 0) = 1 >= top_p
  hi = jnp.full(probs.shape[:-1] + (1,), 0x7F800000, jnp.int32)  # +inf: mass 0 < top_p

  def halve(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    ok = jnp.sum(jnp.where(bits >= mid, probs, 0.0), axis=-1, keepdims=True) >= top_p
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

  lo, _ = jax.lax.fori_loop(0, 31, halve, (lo, hi))  # 2^31 > 0x7F800000: hi - lo ends at 1
  return jnp.where(bits < lo, -jnp.inf, logits)


def sample(key: jax.Array, probs_NxV: jax.Array) -> jax.Array:
  """One token per row from a (possibly one-hot, possibly unnormalised) distribution; int32.

  When every row has a single nonzero entry (every distribution drawn from at temperature 0) the
  argmax is taken and no random bits are drawn. Otherwise `inverse_cdf`: two uniforms per row
  against running sums of the row. Why not Gumbel-max (`jax.random.categorical`): drawing V
  uniforms and taking a log and a log-log over V costs many times more inside the loop on CPU,
  and every step at temperature > 0 draws at least once. Both are exact up to float32 spacing.
  """
  single_B = jnp.sum(probs_NxV > 0, axis=-1) == 1
  return jax.lax.cond(jnp.all(single_B), lambda: argmax(probs_NxV),
                      lambda: inverse_cdf(key, probs_NxV))


# `inverse_cdf` inverts in two levels above this many entries (blocks, then one block): XLA:CPU's
# cumulative sum and running maximum over a whole large row are slow, over short rows cheap.
INVERSION_BLOCK = 128


def inverse_cdf(key: jax.Array, probs_NxV: jax.Array) -> jax.Array:
  """One token per row by inversion, int32 [N]: a block of INVERSION_BLOCK tokens drawn by its
  mass, then a token of that block by its probability, each by `_invert` with its own uniform
  (two per row from `key`). P(token i of block b) = (mass_b / total) (p_i / mass_b) = p_i / total.

  Exactness: each `_invert` draws an entry with probability its weight over the total up to
  float32 rounding of the running sum (a few spacings of the total: ~2^-23 relative), and u's own
  grid is 2^-23. A token of probability 0 is never drawn (nor a block without mass). A row of all
  zeros gives some token (callers never draw from one)."""
  probs_NxV = probs_NxV.astype(jnp.float32)
  *lead, v = probs_NxV.shape
  u_Nx2 = jax.random.uniform(key, (*lead, 2), jnp.float32)
  if v <= 2 * INVERSION_BLOCK:
    return _invert(probs_NxV, u_Nx2[..., 0])
  w = INVERSION_BLOCK
  nb = -(-v // w)
  padded_NxV = jnp.pad(probs_NxV, [(0, 0)] * len(lead) + [(0, nb * w - v)])
  blocks_NxBxW = padded_NxV.reshape(*lead, nb, w)
  block_N = _invert(jnp.sum(blocks_NxBxW, axis=-1), u_Nx2[..., 0])
  inner_NxW = jnp.take_along_axis(blocks_NxBxW, block_N[..., None, None], axis=-2)[..., 0, :]
  return jnp.minimum(block_N * w + _invert(inner_NxW, u_Nx2[..., 1]), v - 1).astype(jnp.int32)


def _invert(weights_NxK: jax.Array, u_N: jax.Array) -> jax.Array:
  """The entry k of each row with m_{k-1} <= u * total < m_k, int32 [N]: m the running maximum of
  the cumulative sums at the entries with weight (-inf before the first), total the last m. An
  entry of weight 0 repeats its predecessor's m, an empty interval, whatever order XLA sums in;
  u * total is kept strictly below the total, so a row whose last entries weigh 0 never falls off
  its end."""
  k = weights_NxK.shape[-1]
  cdf_NxK = jnp.cumsum(weights_NxK, axis=-1)
  m_NxK = jax.lax.cummax(jnp.where(weights_NxK > 0, cdf_NxK, -jnp.inf), axis=weights_NxK.ndim - 1)
  total_Nx1 = jnp.maximum(m_NxK[..., -1:], 0.0)
  point_Nx1 = jnp.minimum(u_N[..., None] * total_Nx1, jnp.nextafter(total_Nx1, jnp.float32(0)))
  return jnp.minimum(jnp.sum(m_NxK <= point_Nx1, axis=-1), k - 1).astype(jnp.int32)
