"""The one timer: whole decoding programs, single `extend` calls and the costs GAMMA='auto' needs.

Everything that reports a time (the run's interleaved AR / speculative timing, the cost
calibration behind 'auto', the benchmark scripts) goes through `interleaved`, so they share one
definition of a sample:
- the first call of each program is its warm-up (jit compilation, first-touch allocation) and
  provides the result; it is not timed;
- a sample shorter than `min_sample_s` is dominated by scheduler noise (a tiny model decodes a
  batch in a few milliseconds), so such a program is called several times per sample and the mean
  taken, as `timeit` does; every call is blocked on, one at a time, as a user's request would run;
- programs are timed in alternation, rotating the order every round, and the median over rounds is
  reported: on a shared 2-core machine the speed drifts by tens of percent over seconds, and
  alternation exposes every program (a ratio's numerator and denominator alike) to the same drift.

A lone `extend` is timed as the loops run it (`extend_program`): the updated cache is an output
(so XLA cannot drop the cache writes), its buffers are donated back in (fresh-page writes are ~10x
slower), and each call rolls back to the starting index (the slots are re-written, as after a
rejection).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable, Hashable, Iterable, Mapping

import jax
import jax.numpy as jnp


def _once(fn: Callable[[], object]) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def interleaved(programs: Mapping[Hashable, Callable[[], object]], repeats: int, *,
                min_sample_s: float = 0.02, max_calls: int = 50,
                agree: Callable[[dict], dict] = lambda calls: calls,
                tick: Callable[[int, int], None] | None = None) -> tuple[dict, dict]:
  """Runs each program once untimed (result kept), then `repeats` rounds, rotating the order.
  A round's sample is as many calls as make `min_sample_s` (one probe call each decides); where
  every program needs one call, the probe calls are round 0.

  Returns (results of the warm-up calls, median seconds per call). `agree` makes the calls per
  sample, chosen from this process's timings, the same on every process of a multi-host run
  (`distributed.agree`), where each call is a collective. `tick(done, total)` is called after
  every warm-up (a compile) and every sample: a progress bar's feed (the loops' timing is a
  minute or more of a run's calibration).
  """
  results, rounds = interleaved_rounds(programs, repeats, min_sample_s=min_sample_s,
                                       max_calls=max_calls, agree=agree, tick=tick)
  return results, {n: statistics.median(t) for n, t in rounds.items()}


def interleaved_rounds(programs: Mapping[Hashable, Callable[[], object]], repeats: int, *,
                       min_sample_s: float = 0.02, max_calls: int = 50,
                       agree: Callable[[dict], dict] = lambda calls: calls,
                       tick: Callable[[int, int], None] | None = None
                       ) -> tuple[dict, dict[Hashable, list[float]]]:
  """`interleaved` with every round kept: (results, {program: seconds per call, round by
  round}). Round r of every program ran within one rotation, so two programs' samples of the
  same round saw the same moment of the machine: their paired differences measure how well a
  comparison of the medians is resolved (the spread GAMMA='auto' weighs, runner/calibrate.py)."""
  names = list(programs)
  steps = iter(range(1, len(names) * (repeats + 1) + 1))
  tick = tick or (lambda done, total: None)
  results = {}
  for n in names:
    results[n] = jax.block_until_ready(programs[n]())
    tick(next(steps), len(names) * (repeats + 1))
  probe = {n: _once(programs[n]) for n in names}  # in round 0's order (shift 0)
  calls = agree({n: min(max_calls, max(1, math.ceil(min_sample_s / max(probe[n], 1e-6))))
                 for n in names})
  times: dict = {n: [] for n in names}
  first = 0
  if repeats and all(c == 1 for c in calls.values()):
    # Each probe was then one call, timed, in round 0's rotation: round 0 itself. Why: a decode
    # of a whole request (seconds) is always one call per sample, and a third run of it (warm-up,
    # probe, round) was a third of a benchmark's measured phase (HumanEval on SmolLM2: one pass of
    # its 116 problems, both decodes, is 29 minutes; the run took 125).
    for n in names:
      times[n].append(probe[n])
      tick(next(steps), len(names) * (repeats + 1))
    first = 1
  for r in range(first, repeats):
    shift = r % len(names) if names else 0
    for n in names[shift:] + names[:shift]:
      t0 = time.perf_counter()
      for _ in range(calls[n]):
        jax.block_until_ready(programs[n]())
      times[n].append((time.perf_counter() - t0) / calls[n])
      tick(next(steps), len(names) * (repeats + 1))
  return results, times


def time_call(fn: Callable[[], object], repeats: int = 10) -> float:
  """Median seconds of one call of `fn` (`interleaved` with one program)."""
  return interleaved({0: fn}, repeats)[1][0]


def extend_program(model, params, cache, tokens: int) -> Callable[[], object]:
  """A jitted `extend` over `tokens` tokens per example from `cache`, as the loops run it (see the
  module docstring); the caller's cache stays valid. Compiles on the first call."""
  block_BxT = jnp.full((cache.index_B.shape[0], tokens), 3, jnp.int32)

  def one(p, c, t):
    logits, new = model.extend(p, c, t)
    return logits, new.replace(index_B=c.index_B)
  step = jax.jit(one, donate_argnums=1)
  state = {"cache": jax.tree.map(jnp.copy, cache)}

  def call():
    logits, state["cache"] = step(params, state["cache"], block_BxT)
    return logits, state["cache"]
  return call


# ---- the costs behind GAMMA='auto' ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Costs:
  """Measured per-call times (ms, median) and the ratios the speedup formula needs.

  c = draft extend(T=1) / target extend(T=1); v[T] = target extend(T) / target extend(T=1).
  """

  target_ms: float
  draft_ms: float
  c: float
  v: dict[int, float]


def measure_costs_many(target, target_params, drafts: Mapping, inputs_BxP,
                       tokens: Iterable[int], repeats: int = 10, *,
                       max_decode_len: int | None = None, tick=None) -> dict:
  """{key: Costs} for drafts {key: (model, params)}; v(T) for T in `tokens` (1 always added).

  Each model is prefilled once; one `extend` per distinct T (target) and T = 1 (each draft) is
  compiled, then all are timed together by `interleaved`. The caches have the slots the decode
  loop gives them for `max_decode_len` tokens at the largest gamma (attention reads every slot,
  so a shorter cache would time a cheaper step); None sizes them for the largest T only.
  `tick`: `interleaved`'s progress feed.
  """
  from specdec_jax import seam
  from specdec_jax.decoding import start  # pylint: disable=import-outside-toplevel
  inputs_BxP = jnp.asarray(inputs_BxP, jnp.int32)
  tokens = sorted(set(tokens) | {1})
  plen = inputs_BxP.shape[1]

  encoded = None
  if any(seam.shares_encoder(d) for d, _ in drafts.values()):
    encoded = jax.jit(target.encode)(target_params, inputs_BxP)

  def prefilled(model, params):
    n = (start.cache_len_needed(model, plen, max(tokens), 0) if max_decode_len is None else
         start.cache_len_needed(model, plen, max_decode_len, max(tokens) - 1))
    shared = encoded if seam.shares_encoder(model) else None
    return jax.jit(functools.partial(model.prefill, encoded=shared), static_argnums=2)(
        params, inputs_BxP, n)

  cache = prefilled(target, target_params)
  programs = {("target", n): extend_program(target, target_params, cache, n) for n in tokens}
  for key, (draft, draft_params) in drafts.items():
    programs[("draft", key)] = extend_program(draft, draft_params,
                                              prefilled(draft, draft_params), 1)
  _, med = interleaved(programs, repeats, tick=tick)
  t = {n: med[("target", n)] for n in tokens}
  # Verifying more tokens never costs less: a dip (v(3) < v(2)) is timing noise on a shared
  # machine, and taking it at face value would make 'auto' favour that gamma. Running maximum.
  for prev, n in zip(tokens, tokens[1:]):
    t[n] = max(t[n], t[prev])
  return {key: Costs(target_ms=1e3 * t[1], draft_ms=1e3 * med[("draft", key)],
                     c=med[("draft", key)] / t[1], v={n: t[n] / t[1] for n in t})
          for key in drafts}


def measure_costs(target, target_params, draft, draft_params, inputs_BxP, max_tokens: int,
                  repeats: int = 10) -> Costs:
  """Times target extend for T = 1..max_tokens and draft extend for T = 1 on `inputs_BxP`."""
  return measure_costs_many(target, target_params, {0: (draft, draft_params)}, inputs_BxP,
                            range(1, max_tokens + 1), repeats)[0]
