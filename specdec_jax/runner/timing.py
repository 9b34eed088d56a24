"""Timing of whole decoding programs on one batch, interleaved, compile excluded.

Why interleaved medians: on a shared 2-core machine the speed drifts by tens of percent over
seconds (other processes, thermal). Timing the autoregressive program and every speculative
program of a batch in alternation (rotating the order each repeat) exposes all of them to the
same drift, and the median of the repeats drops outliers. The first call of each program is its
warm-up (jit compilation and first-touch allocation) and provides the outputs; it is not timed.
A sample shorter than `min_sample_s` is dominated by scheduler noise (a tiny model decodes a batch
in a few milliseconds), so such a program is called several times per sample and the mean taken,
as `timeit` does.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping

import jax


def _once(fn: Callable[[], object]) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def run_interleaved(programs: Mapping[str, Callable[[], object]], repeats: int,
                    min_sample_s: float = 0.02, max_calls: int = 50,
                    agree: Callable[[dict], dict] = lambda calls: calls
                    ) -> tuple[dict[str, object], dict[str, float]]:
  """Runs each program once untimed (result kept), then `repeats` rounds, rotating the order.

  Returns (results of the warm-up calls, median seconds per program call). `agree` makes the
  calls per sample, chosen from this process's timings, the same on every process of a multi-host
  run (`distributed.agree`), where each call is a collective.
  """
  names = list(programs)
  results = {n: jax.block_until_ready(programs[n]()) for n in names}
  calls = {n: min(max_calls, max(1, math.ceil(min_sample_s / max(_once(programs[n]), 1e-6))))
           for n in names}
  calls = agree(calls)
  times: dict[str, list[float]] = {n: [] for n in names}
  for r in range(repeats):
    shift = r % len(names) if names else 0
    for n in names[shift:] + names[:shift]:
      t0 = time.perf_counter()
      for _ in range(calls[n]):
        jax.block_until_ready(programs[n]())  # one at a time, as a user's request would run
      times[n].append((time.perf_counter() - t0) / calls[n])
  return results, {n: statistics.median(t) for n, t in times.items()}
