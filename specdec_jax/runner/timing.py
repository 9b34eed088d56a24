"""Timing of whole decoding programs on one batch, interleaved, compile excluded.

Why interleaved medians: on a shared 2-core machine the speed drifts by tens of percent over
seconds (other processes, thermal). Timing the autoregressive program and every speculative
program of a batch in alternation (rotating the order each repeat) exposes all of them to the
same drift, and the median of the repeats drops outliers. The first call of each program is its
warm-up (jit compilation and first-touch allocation) and provides the outputs; it is not timed.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import jax


def run_interleaved(programs: Mapping[str, Callable[[], object]], repeats: int
                    ) -> tuple[dict[str, object], dict[str, float]]:
  """Runs each program once untimed (result kept), then `repeats` rounds, rotating the order.

  Returns (results of the warm-up calls, median seconds per program).
  """
  names = list(programs)
  results = {n: jax.block_until_ready(programs[n]()) for n in names}
  times: dict[str, list[float]] = {n: [] for n in names}
  for r in range(repeats):
    order = names[r % len(names):] + names[:r % len(names)] if names else []
    for n in order:
      t0 = time.perf_counter()
      jax.block_until_ready(programs[n]())
      times[n].append(time.perf_counter() - t0)
  return results, {n: statistics.median(t) for n, t in times.items()}
