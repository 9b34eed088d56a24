"""The run's measurements on its calibration prompts: what the autotuner (runner/autotune.py)
is given to decide with.

Why a class of its own: the tuner must see the very programs the run will decode (the run's
`Decoder` for each draft and scheme, `pipeline.decoder_for`, on the run's mesh), and nothing of
how they are loaded; `Calibration` holds the loaded run and answers the tuner's three questions
(lone `extend` costs, an untimed decode's statistic, the real loops timed). Every process of a
multi-host run times; process 0's costs are everyone's (`costs.agree`), so 'auto' chooses the
same everywhere.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping

import jax
from absl import logging

from specdec_jax import logs
from specdec_jax.runner import costs as costs_lib, drafts as drafts_lib
from specdec_jax.runner.pipeline import Loaded, decoder_for, global_batch
from specdec_jax.runner.run_config import DraftSpec, Point, RunConfig


class Calibration:
  """`autotune.Measure` for a loaded run (`pipeline.load`)."""

  def __init__(self, cfg: RunConfig, loaded: Loaded, log: Callable):
    self.cfg, self.loaded, self.log = cfg, loaded, log
    self.sharded = loaded.mesh is not None
    self.prompts = len(loaded.calibration.ids)
    self.held_out = loaded.held_out
    self._batches = None

  def costs(self, tokens) -> dict:
    """{draft spec: timing.Costs}: c and v(T) from lone `extend` calls on the first calibration
    batch, process 0's on every process; warns of a draft that costs more than its target."""
    cfg, loaded = self.cfg, self.loaded
    cal = loaded.calibration
    first, _ = global_batch(cal, loaded, range(min(cfg.batch_size, len(cal.ids))))
    t0 = time.perf_counter()
    with contextlib.closing(logs.bar("calibrate: extend costs", unit="step")) as progress:
      costs = costs_lib.measure(loaded.target, loaded.target_params, loaded.drafts, first, tokens,
                                max_decode_len=cfg.max_decode_length, tick=logs.ticker(progress))
    costs = costs_lib.agree(costs)  # every process resolves 'auto' from process 0's timings
    self.log(f"measured costs in {time.perf_counter() - t0:.1f}s: " + "; ".join(
        f"{s.name}: c={c.c:.3f}, target {c.target_ms:.3f} ms/call, " +
        ", ".join(f"v({n})={c.v[n]:.2f}" for n in sorted(c.v) if n > 1)
        for s, c in costs.items()))
    for spec, c in costs.items():
      if c.c > 1.0:
        logging.warning(
            "draft %s costs more than its target: one draft step %.3f ms against %.3f ms for a "
            "target step (c = %.2f > 1); speculation cannot pay with such a draft (a draft "
            "larger than its target, or a target on a faster path?)", spec.name, c.draft_ms,
            c.target_ms, c.c)
    return costs

  def decode(self, point: Point, scheme, statistic: Callable) -> dict:
    """statistic(decoder, params, inputs_BxP, rows=prompts) of one untimed decode of all the
    calibration prompts with the point's draft, temperature and `scheme`; for a drafter that
    chooses once per batch (`chooses_per_batch`), statistic(decoder, params, [batches],
    rows=[rows of each]) of the prompts in the run's batch shape (only
    `calibrate.calibration_acceptance` meets one: lookup-first decodes no trees)."""
    rows = range(self.prompts)
    decoder, params = decoder_for(self.cfg, self.loaded, point.temperature, point.draft, scheme)
    size = self.cfg.batch_size
    if getattr(decoder.drafter, "chooses_per_batch", False) and size < self.prompts:
      # One choice per iteration for the whole batch (lookup-first: the lookup only where every
      # row matches): in one batch of all the prompts it would hardly ever look up, so the
      # calibration would describe another program than the run's. In the run's batch shape.
      chunks = [rows[i:i + size] for i in range(0, self.prompts, size)]
      return statistic(decoder, params,
                       [global_batch(self.loaded.calibration, self.loaded, c)[0] for c in chunks],
                       rows=[len(c) for c in chunks])
    return statistic(decoder, params, global_batch(self.loaded.calibration, self.loaded, rows)[0],
                     rows=self.prompts)

  def batches(self) -> list:
    """The first max(batch_size, auto.timing_examples) calibration prompts in the run's batch
    shape: in full batches of batch_size (or one short batch of them all when there are fewer
    than batch_size)."""
    if self._batches is None:  # on the device once, every temperature's loops time them
      cfg, cal = self.cfg, self.loaded.calibration
      n = min(len(cal.ids), max(cfg.batch_size, cfg.auto.timing_examples))
      chunks = [list(range(i, min(i + cfg.batch_size, n))) for i in range(0, n, cfg.batch_size)]
      full = [c for c in chunks if len(c) == cfg.batch_size] or chunks[:1]
      self._batches = [jax.device_put(cal.batch(c)) for c in full]
    return self._batches

  def widths(self) -> tuple[list, list[int]]:
    """(one batch per prompt width the calibration prompts have and `batches()` lack, the width
    of every calibration batch in the run's shape): the loops' fixed costs are measured at each
    width and averaged over the calibration batches (`costs.LoopCosts.calibrated_fixed`)."""
    cfg, cal = self.cfg, self.loaded.calibration
    chunks = [range(i, min(i + cfg.batch_size, self.prompts))
              for i in range(0, self.prompts, cfg.batch_size)]
    inputs = [cal.batch(c) for c in chunks]
    timed = {int(x.shape[1]) for x in self.batches()}
    first = {}
    for x in inputs:
      if int(x.shape[1]) not in timed and len(x) == len(inputs[0]):
        first.setdefault(int(x.shape[1]), x)
    return ([jax.device_put(first[w]) for w in sorted(first)],
            [int(x.shape[1]) for x in inputs])

  def loops(self, temperature: float, programs: Mapping[DraftSpec, list]) -> dict:
    """{draft spec: costs.LoopCosts}: each draft's programs (gammas, trees) timed beside the
    autoregressive loop at `temperature` (`costs.measure_loops`), on `batches()`."""
    cfg, loaded = self.cfg, self.loaded
    t0 = time.perf_counter()
    with contextlib.closing(logs.bar(f"calibrate: loops at T={temperature:g}", unit="step")
                            ) as progress:
      loops = costs_lib.measure_loops(
          decoder_for(cfg, loaded, temperature)[0], loaded.target_params,
          {d: (*loaded.drafts[d], gs) for d, gs in programs.items()}, self.batches(),
          seed=cfg.seed, tick=logs.ticker(progress), chain_options=drafts_lib.chain_options(cfg),
          widths=self.widths())
    for d, lc in loops.items():
      if lc.unresolved():
        continue  # autotune.timed_loops warns and leaves it out
      self.log(f"loop costs at temperature {temperature:g}, {d.name} ({lc.batches} batches of "
               f"{lc.rows}, {time.perf_counter() - t0:.1f}s with compiles): autoregressive "
               f"{lc.ar_ms:.2f} ms/iteration (+{lc.ar_fixed_ms:.1f} ms per request); "
               "speculative " + ", ".join(
                   f"{'gamma ' if isinstance(g, int) else ''}{g}: {ms:.2f} ms/iteration "
                   f"(+{lc.fixed_ms[g]:.1f})" for g, ms in sorted(
                       lc.iteration_ms.items(), key=lambda x: costs_lib.loop_order(x[0])))
               + (f"; fixed costs over the calibration prompts' widths "
                  f"{sorted(set(lc.calibration_widths))}: autoregressive "
                  f"+{lc.calibrated_fixed():.1f}, speculative " + ", ".join(
                      f"+{lc.calibrated_fixed(g):.1f}" for g in sorted(
                          lc.fixed_ms, key=costs_lib.loop_order))
                  if len(set(lc.calibration_widths)) > 1 else ""))
    return loops
