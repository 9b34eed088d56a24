"""Speedup theory (Leviathan et al. section 3) with a measured verify cost, and choosing gamma.

Why the verify cost: the papers assume one target call over gamma + 1 tokens costs as much as one
over a single token (v = 1, true for a memory-bound TPU/GPU at batch 1). On a CPU it is not:
an 80 MB float32 decoder measured v(4) = 3.1, v(8) = 4.2. The expected walltime improvement is then

    (1 - alpha^(G+1)) / ((1 - alpha) (G c + v(G+1)))

and the best gamma may be 0 (plain autoregressive decoding). `choose_gamma` returns 0 whenever no
gamma is predicted to beat `min_speedup`, which is what keeps GAMMA='auto' from ever being slower
than the autoregressive loop. Everything except `measure_costs` is pure Python.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp


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


# ---- measurement (device timing) -----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Costs:
  """Measured per-call times (ms, median) and the ratios the formula needs.

  c = draft extend(T=1) / target extend(T=1); v[T] = target extend(T) / target extend(T=1).
  """

  target_ms: float
  draft_ms: float
  c: float
  v: dict[int, float]


def time_call(fn: Callable[[], object], repeats: int = 10, warmup: int = 1) -> float:
  """Median seconds of `fn()` (its result blocked on); warm-up calls (compilation) excluded."""
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def _prefilled(model, params, inputs_BxP, cache_len: int):
  return jax.jit(model.prefill, static_argnums=2)(params, inputs_BxP, cache_len)


def extend_sampler(model, params, cache, tokens: int, min_sample_s: float = 0.02):
  """(sample() -> seconds per call) for one jitted `extend` over `tokens` tokens from `cache`.

  Timed as the loops run it: the updated cache is an output (so XLA cannot drop the cache writes),
  its buffers are donated back in, and each call rolls back to the starting index (the slots are
  re-written, as after a rejection). A sample shorter than `min_sample_s` averages several calls.
  Compiles on creation.
  """
  block = jnp.full((cache.index_B.shape[0], tokens), 3, jnp.int32)

  def one(p, c, t):
    logits, new = model.extend(p, c, t)
    return logits, new.replace(index_B=c.index_B)
  step = jax.jit(one, donate_argnums=1)
  state = {"cache": jax.tree.map(jnp.copy, cache)}  # the caller's cache stays valid

  def call():
    logits, state["cache"] = step(params, state["cache"], block)
    return logits, state["cache"]
  jax.block_until_ready(call())  # compile
  t0 = time.perf_counter()
  jax.block_until_ready(call())
  calls = max(1, min(50, int(min_sample_s / max(time.perf_counter() - t0, 1e-6)) + 1))

  def sample() -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
      out = call()
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / calls
  return sample


def extend_time(model, params, cache, tokens: int, repeats: int = 10) -> float:
  """Median seconds of one `extend` over `tokens` tokens per example (see `extend_sampler`)."""
  sample = extend_sampler(model, params, cache, tokens)
  return statistics.median(sample() for _ in range(repeats))


def measure_costs_many(target, target_params, drafts: Mapping, inputs_BxP,
                       tokens: Iterable[int], repeats: int = 10) -> dict:
  """{key: Costs} for drafts {key: (model, params)}; v(T) for T in `tokens` (1 always added).

  Each model is prefilled once; one `extend` per distinct T (target) and T = 1 (each draft) is
  compiled, then all are timed interleaved, rotating the order every round, so the drift of a
  shared machine hits every ratio's numerator and denominator alike (medians over rounds).
  """
  inputs_BxP = jnp.asarray(inputs_BxP, jnp.int32)
  tokens = sorted(set(tokens) | {1})
  plen = inputs_BxP.shape[1]

  def cache_len(model):
    return (0 if model.config.is_encoder_decoder else plen) + max(tokens) + 2

  cache = _prefilled(target, target_params, inputs_BxP, cache_len(target))
  samplers = {("target", n): extend_sampler(target, target_params, cache, n) for n in tokens}
  for key, (draft, draft_params) in drafts.items():
    dcache = _prefilled(draft, draft_params, inputs_BxP, cache_len(draft))
    samplers[("draft", key)] = extend_sampler(draft, draft_params, dcache, 1)
  names = list(samplers)
  times = {n: [] for n in names}
  for r in range(repeats):
    shift = r % len(names)
    for n in names[shift:] + names[:shift]:
      times[n].append(samplers[n]())
  med = {n: statistics.median(v) for n, v in times.items()}
  t = {n: med[("target", n)] for n in tokens}
  # Verifying more tokens never costs less: a dip (v(3) < v(2)) is timing noise on a shared
  # machine, and taking it at face value would make 'auto' favour that gamma. Running maximum.
  for prev, n in zip(tokens, tokens[1:]):
    t[n] = max(t[n], t[prev])
  out = {}
  for key in drafts:
    d = med[("draft", key)]
    out[key] = Costs(target_ms=1e3 * t[1], draft_ms=1e3 * d, c=d / t[1],
                     v={n: t[n] / t[1] for n in t})
  return out


def measure_costs(target, target_params, draft, draft_params, inputs_BxP, max_tokens: int,
                  repeats: int = 10) -> Costs:
  """Times target extend for T = 1..max_tokens and draft extend for T = 1 on `inputs_BxP`."""
  return measure_costs_many(target, target_params, {0: (draft, draft_params)}, inputs_BxP,
                            range(1, max_tokens + 1), repeats)[0]
