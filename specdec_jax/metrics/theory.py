"""Speedup theory (Leviathan et al. section 3) with a measured verify cost, and choosing gamma.

Why the verify cost: the papers assume one target call over gamma + 1 tokens costs as much as one
over a single token (v = 1, true for a memory-bound TPU/GPU at batch 1). On a CPU it is not:
an 80 MB float32 decoder measured v(4) = 3.1, v(8) = 4.2. The expected walltime improvement is then

    (1 - alpha^(G+1)) / ((1 - alpha) (G c + v(G+1)))

and the best gamma may be 0 (plain autoregressive decoding). `choose_gamma` returns 0 whenever no
gamma is predicted to beat `min_speedup`, which is what keeps GAMMA='auto' from ever being slower
than the autoregressive loop. Pure Python: the measurement of c and v is `specdec_jax.timing`'s.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence


def expected_tokens(alpha: float, gamma: int) -> float:
  """Expected tokens per target call: (1 - alpha^(G+1)) / (1 - alpha); G + 1 at alpha = 1."""
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must be in [0, 1], got {alpha}")
  if gamma < 0:
    raise ValueError(f"gamma must be >= 0, got {gamma}")
  if alpha >= 1.0:
    return float(gamma + 1)
  return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float, v: float = 1.0) -> float:
  """Walltime improvement over autoregressive decoding; gamma = 0 is autoregressive (1.0)."""
  if gamma == 0:
    return 1.0
  if c < 0 or v <= 0:
    raise ValueError(f"need c >= 0 and v > 0, got c={c}, v={v}")
  return expected_tokens(alpha, gamma) / (gamma * c + v)


def operations_factor(alpha: float, gamma: int, c_hat: float = 0.0) -> float:
  """Arithmetic operations relative to autoregressive decoding (Leviathan Table 1, 'operations')."""
  return (1.0 - alpha) * (gamma * c_hat + gamma + 1) / (1.0 - alpha ** (gamma + 1))


def v_of(v_curve: Mapping[int, float] | Sequence[float] | float | None, tokens: int) -> float:
  """v(T) from a curve given as {T: v}, a sequence indexed T - 1, a constant, or None (= 1)."""
  if v_curve is None:
    return 1.0
  if isinstance(v_curve, (int, float)):
    return float(v_curve)
  if isinstance(v_curve, Mapping):
    if tokens not in v_curve:
      raise KeyError(f"verify cost for {tokens} tokens was not measured (have {sorted(v_curve)})")
    return float(v_curve[tokens])
  if tokens > len(v_curve):
    raise KeyError(f"verify cost for {tokens} tokens was not measured (have 1..{len(v_curve)})")
  return float(v_curve[tokens - 1])


def max_gamma_of(v_curve, limit: int) -> int:
  """The largest gamma whose verify cost v(gamma + 1) the curve holds (at most `limit`)."""
  if v_curve is None or isinstance(v_curve, (int, float)):
    return limit
  longest = max(v_curve) if isinstance(v_curve, Mapping) else len(v_curve)
  return max(0, min(limit, longest - 1))


def speedup_curve(alpha: float, c: float, v_curve, max_gamma: int) -> dict[int, float]:
  """Predicted speedup for gamma = 0..max_gamma where v(gamma + 1) is known."""
  top = max_gamma_of(v_curve, max_gamma)
  known = (lambda g: g + 1 in v_curve) if isinstance(v_curve, Mapping) else (lambda g: True)
  return {g: predicted_speedup(alpha, g, c, v_of(v_curve, g + 1))
          for g in range(top + 1) if g == 0 or known(g)}


def choose_gamma(alpha: float, c: float, v_curve=None, max_gamma: int = 16,
                 min_speedup: float = 1.0) -> int:
  """The gamma maximising the predicted speedup, or 0 if none is predicted to beat min_speedup."""
  curve = speedup_curve(alpha, c, v_curve, max_gamma)
  best = max((g for g in curve if g > 0), key=lambda g: curve[g], default=0)
  return best if best and curve[best] > min_speedup else 0
