"""What the run's programs cost on this machine: lone `extend` calls and the real loops.

Why per run: costs depend on the machine, the batch shape and the models, so they are measured in
the process that decodes, right before the timed decode (runner/calibrate.py says how GAMMA='auto'
uses them, DESIGN.md "The cost model" why both kinds exist).
- lone `extend` calls (`measure`, timing.measure_costs_many): c (draft step / target step) and
  the verify curve v(T) on caches as long as the loop's. They are the record's `c` and `v` (public
  contract) and the lone-extend model theory.predicted_speedup; on a mesh they are all there is.
- the loops themselves (`measure_loops`, one device): for each gamma a run needs, the program the
  run decodes with (the run's `Decoder` with the draft's chain scheme, `draft_schemes.plan`,
  or `Autoregressive()`) is compiled
  once with a dynamic iteration cap (`Decoder.generate(..., max_iterations=cap)`) and timed through
  `timing.interleaved` on the calibration prompts, in the run's batch shape, all gammas and the
  autoregressive loop side by side: uncapped (the full decode of those prompts) and with cap 0
  (prefill, layout and finish only). T_iter(G) = (full - capped at 0) / iterations, the same for
  the autoregressive loop, and the cap-0 time is the per-request fixed cost. These are what an
  iteration really costs: the draft steps with their sampling over V, the two-token first draft
  call, verification, acceptance, commit and the loop glue, which lone `extend` calls leave out.
"""
from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from specdec_jax import distributed, timing
from specdec_jax.decoding.autoregressive import Autoregressive
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.feature_entries import timed_as_extend
from specdec_jax.decoding.tree.shape import Tree
from specdec_jax.metrics import acceptance_stats, theory
from specdec_jax.runner import schedule
from specdec_jax.runner.run_config import AUTO, GAMMA_WORDS, DraftSpec, as_list

# Rounds of the loops' interleaved timing (medians; each round decodes the calibration prompts
# once per program).
LOOP_REPEATS = 5


@dataclasses.dataclass(frozen=True)
class LoopCosts:
  """The real loops' costs on the calibration prompts, ms (medians, `timing.interleaved`).

  ar_ms: one autoregressive iteration (one token per active row). ar_fixed_ms: the autoregressive
    program with no iteration (prefill, buffer layout, finish), per batch.
  iteration_ms: {gamma: one speculative iteration}. fixed_ms: {gamma: its program with no
    iteration (both prefills)}, per batch. A tree's program is keyed by its label
    (`loop_key`: 'tree(3,2,1)') beside the chains' gammas.
  tokens: autoregressive iterations per calibration batch (N of theory.loop_speedup: tokens per
    request at batch 1).
  tokens_per_iteration: {gamma: tokens written per target call per row on the calibration decode}
    (for comparison with the expected length the prediction uses).
  batches, rows: how many batches of the run's shape, and rows each, were decoded.
  ar_rounds_ms, iteration_rounds_ms: the same per-iteration costs round by round of the
    interleaved timing ((full - zero) / iterations in each round; the figures above take the
    medians of full and zero first, and the chains' running maximum); empty where not measured.
    What `speedup_rounds` pairs.
  lookup_share: {gamma: the fraction of the timed decode's target calls the prompt lookup
    drafted} for a lookup-first drafter's programs (empty for the others): its iteration above
    is a mixture of cheap lookup iterations and dearer draft ones in that proportion
    (`collect.lookup_prediction`).
  ar_fixed_by_width, fixed_by_width: the fixed costs by prompt width (the batch's padded width):
    {width: ms} and {gamma: {width: ms}}, the timed batches' own width(s) included;
    calibration_widths: the width of every calibration batch in the run's shape. What
    `calibrated_fixed` averages; empty where not measured (then the timed batches' own).
  """

  ar_ms: float
  ar_fixed_ms: float
  tokens: float
  iteration_ms: Mapping[int, float]
  fixed_ms: Mapping[int, float]
  tokens_per_iteration: Mapping[int, float]
  batches: int
  rows: int
  ar_rounds_ms: Sequence[float] = ()
  iteration_rounds_ms: Mapping[Any, Sequence[float]] = dataclasses.field(default_factory=dict)
  lookup_share: Mapping[Any, float] = dataclasses.field(default_factory=dict)
  ar_fixed_by_width: Mapping[int, float] = dataclasses.field(default_factory=dict)
  fixed_by_width: Mapping[Any, Mapping[int, float]] = dataclasses.field(default_factory=dict)
  calibration_widths: Sequence[int] = ()

  def calibrated_fixed(self, program=None) -> float:
    """The per-request fixed cost (ms per batch) of `program` (None: the autoregressive loop)
    averaged over the calibration batches' prompt widths. Why: the fixed cost is the prefill,
    which grows with the prompt (SmolLM2 summaries: ~190 ms at width 128, ~6 s at 1,654), and the
    few timed batches need not be typical: the 4 first calibration documents were all of width
    128, where a third of the 48 were wider, and the prediction came out 17 % high. A width not
    measured counts at the timed batches' own cost."""
    base = self.ar_fixed_ms if program is None else self.fixed_ms[program]
    by_width = self.ar_fixed_by_width if program is None else self.fixed_by_width.get(program, {})
    if not self.calibration_widths:
      return base
    return statistics.fmean(by_width.get(w, base) for w in self.calibration_widths)

  def to_json(self) -> dict[str, Any]:
    """The record's `loop_costs` (what report.build reads; gamma keys as strings)."""
    def keyed(d):
      return {str(g): d[g] for g in sorted(d, key=loop_order)}
    return {"ar_ms": self.ar_ms, "ar_fixed_ms": self.ar_fixed_ms, "tokens": self.tokens,
            "iteration_ms": keyed(self.iteration_ms), "fixed_ms": keyed(self.fixed_ms),
            "tokens_per_iteration": keyed(self.tokens_per_iteration),
            "batches": self.batches, "rows": self.rows,
            **({"lookup_share": keyed(self.lookup_share)} if self.lookup_share else {}),
            **(self._widths_json() if self.calibration_widths else {}),
            **({"ar_rounds_ms": list(self.ar_rounds_ms),
                "iteration_rounds_ms": {k: list(v) for k, v in
                                        keyed(self.iteration_rounds_ms).items()}}
               if self.ar_rounds_ms else {})}

  def _widths_json(self) -> dict[str, Any]:
    by_width = lambda d: {str(w): d[w] for w in sorted(d)}  # noqa: E731
    return {"calibration_widths": list(self.calibration_widths),
            "ar_fixed_by_width": by_width(self.ar_fixed_by_width),
            "fixed_by_width": {str(g): by_width(self.fixed_by_width[g])
                               for g in sorted(self.fixed_by_width, key=loop_order)},
            "ar_fixed_calibrated_ms": self.calibrated_fixed(),
            "fixed_calibrated_ms": {str(g): self.calibrated_fixed(g)
                                    for g in sorted(self.fixed_ms, key=loop_order)}}

  def unresolved(self) -> list[str]:
    """The per-iteration costs this measurement could not separate from the fixed ones (a
    program's full decode no slower than its zero-iteration one: tiny models on a busy machine);
    empty when every cost is positive. A prediction from such costs would divide by zero or claim
    a free iteration, so the caller drops them and predicts from lone `extend` costs."""
    bad = [] if self.ar_ms > 0 else ["autoregressive"]
    return bad + [f"gamma {g}" if isinstance(g, int) else str(g)
                  for g in sorted(self.iteration_ms, key=loop_order) if self.iteration_ms[g] <= 0]

  def speedup(self, gamma, tokens_per_iteration: float) -> float:
    """theory.loop_speedup at `gamma` (or a tree's label) with its fixed costs, N = the
    calibration's tokens."""
    return theory.loop_speedup(tokens_per_iteration, self.ar_ms, self.iteration_ms[gamma],
                               tokens=self.tokens, ar_fixed=self.calibrated_fixed(),
                               spec_fixed=self.calibrated_fixed(gamma))

  def speedup_rounds(self, gamma, tokens_per_iteration: float) -> list[float | None]:
    """`speedup` round by round (each round's autoregressive and speculative iteration, the
    median fixed costs; None for a round whose cost the noise ate); empty where the rounds were
    not kept."""
    its = self.iteration_rounds_ms.get(gamma, ())
    return [theory.loop_speedup(tokens_per_iteration, ar, it, tokens=self.tokens,
                                ar_fixed=self.calibrated_fixed(),
                                spec_fixed=self.calibrated_fixed(gamma))
            if ar > 0 and it > 0 else None for ar, it in zip(self.ar_rounds_ms, its)]

  def speedup_se(self, gamma, tokens_per_iteration: float) -> float:
    """The standard error of `gamma`'s predicted speedup over plain decoding: the spread of its
    round-by-round speedups (each round's own autoregressive loop) over sqrt(rounds); 0 with
    fewer than two rounds."""
    xs = [x for x in self.speedup_rounds(gamma, tokens_per_iteration) if x is not None]
    return statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) >= 2 else 0.0

  def lead_se(self, a, tokens_a: float, b, tokens_b: float) -> float:
    """The standard error of `a`'s predicted lead over `b` (programs of this measurement, each
    with its expected tokens per iteration): the spread of their round-by-round speedups'
    differences (paired: one round saw one moment of the machine) over sqrt(rounds); 0 with fewer
    than two rounds of both."""
    diffs = [x - y for x, y in zip(self.speedup_rounds(a, tokens_a),
                                   self.speedup_rounds(b, tokens_b))
             if x is not None and y is not None]  # pairs of one round only
    return statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) >= 2 else 0.0


def loop_key(program) -> Any:
  """What a timed program is filed under: a chain's gamma (an int), or a tree's label: its
  branching per depth when every node of a depth has as many children ('tree(3,2,1)'), else its
  node count and depth ('tree(16 nodes, depth 7)'); a dynamic tree's label
  ('dynamic(depth=4,width=4,branch=4,nodes=32)')."""
  if isinstance(program, int):
    return program
  tree = program.tree
  if not isinstance(tree, Tree):  # a dynamic tree (`decoding.tree.DynamicTree`): its budget
    return tree.label
  widths = [int((tree.depths_N == d).sum()) for d in range(tree.max_depth + 1)]
  branching = [b // a for a, b in zip(widths, widths[1:])]
  if tree.num_nodes == 1 + sum(itertools.accumulate(branching, lambda a, b: a * b)):
    try:
      if Tree.from_branching(branching) == tree:
        return "tree(" + ",".join(map(str, branching)) + ")"
    except ValueError:
      pass
  return f"tree({tree.num_nodes} nodes, depth {tree.max_depth})"


def loop_order(key) -> tuple:
  """Sort key for loop keys: the chains' gammas in order, then the trees' labels."""
  return (0, key, "") if isinstance(key, int) else (1, 0, str(key))


def scheme_of(program, draft=None, **chain_options) -> tuple[Any, Any]:
  """(scheme, drafter) a timed program decodes with: the chain at a gamma, or the tree scheme,
  with the draft's drafter (`schedule.decoding_scheme`: by `chain_options` a feature draft's
  chain is its parallel block or the lookup-or-feature drafter; None: the draft's default)."""
  return schedule.decoding_scheme(program, draft, **chain_options)


def verify_tokens_needed(gammas, gamma_max: int) -> list[int]:
  """Block sizes T whose verify cost v(T) a run needs: G + 1 per fixed G, 1..gamma_max+1 for auto."""
  needed = {1} | {g + 1 for g in as_list(gammas) if g not in GAMMA_WORDS}
  if any(g == AUTO for g in as_list(gammas)):
    needed |= set(range(1, gamma_max + 2))
  return sorted(needed)


def measure(target, target_params, drafts: dict, inputs_BxP, tokens, repeats: int = 10, *,
            max_decode_len: int | None = None, tick=None) -> dict[DraftSpec, timing.Costs]:
  """Costs per draft spec, on caches as long as the decode loop's; the target curve is measured
  once and shared (a feature-level draft's step: one entry, `feature_entries.LoneStep`).
  `tick(done, total)`: progress (`timing.interleaved`)."""
  drafts = {k: (timed_as_extend(d), p) for k, (d, p) in drafts.items()}
  return timing.measure_costs_many(target, target_params, drafts, inputs_BxP, tokens, repeats,
                                   max_decode_len=max_decode_len, tick=tick)


def agree(costs: dict[DraftSpec, timing.Costs]) -> dict[DraftSpec, timing.Costs]:
  """Process 0's costs on every process (one process: unchanged): GAMMA='auto' must choose the
  same gamma everywhere, and each process's own timings differ."""
  keys_ = list(costs)
  rows = distributed.agree([[c.target_ms, c.draft_ms, c.c, sorted(c.v.items())]
                            for c in costs.values()])
  return {k: timing.Costs(t, d, c, {int(n): float(x) for n, x in v})
          for k, (t, d, c, v) in zip(keys_, rows)}


def measure_loops(template: Decoder, target_params,
                  drafts: Mapping[Any, tuple[Any, Any, Sequence[int]]],
                  batches: Sequence[jax.Array], *, seed: int, repeats: int = LOOP_REPEATS,
                  tick=None, chain_options: Mapping[str, Any] | None = None,
                  widths: tuple[Sequence[jax.Array], Sequence[int]] = ((), ())
                  ) -> dict[Any, LoopCosts]:
  """{key: LoopCosts} for drafts {key: (draft, params, programs)}, all on `batches` (inputs of
  the run's batch shape; each program decodes all of them per call), timed side by side with the
  autoregressive loop in one `timing.interleaved` call (see the module docstring). `template`:
  the run's autoregressive Decoder (target, sampling, rule, lengths); each draft's programs are
  the same Decoder with the draft and its scheme per gamma >= 1 or tree (`scheme_of`; filed
  under `loop_key`; `chain_options`: how a feature draft's chains are built, as the run
  decodes them, `runner.drafts.chain_options`). `tick(done, total)`: progress (every compile
  and sample of `timing.interleaved`). `widths`: (one batch per prompt width the calibration
  prompts have and `batches` lack, on which every program is timed at cap 0 only; the width of
  every calibration batch): the fixed costs by width and what they are averaged over
  (`LoopCosts.calibrated_fixed`; `runner.measure.Calibration.widths`)."""
  width_batches, calibration_widths = widths
  full_cap = jnp.int32(template.max_decode_len + 1)  # every iteration writes >= 1 token per row
  zero_cap = jnp.int32(0)
  rng = jax.random.key(seed + 7919)

  def program(decoder, params, cap, inputs=batches):
    return lambda: [jax.block_until_ready(decoder.generate(params, x, rng, max_iterations=cap))
                    for x in inputs]

  def add(key, g, decoder, params):
    programs[(key, g, "full")] = program(decoder, params, full_cap)
    programs[(key, g, "zero")] = program(decoder, params, zero_cap)
    for x in width_batches:
      programs[(key, g, ("zero", int(x.shape[1])))] = program(decoder, params, zero_cap, [x])

  programs = {}
  add("ar", 0, dataclasses.replace(template, draft=None, scheme=Autoregressive()),
      Params(target_params))
  for key, (draft, params, gammas) in drafts.items():
    for g in gammas:
      scheme, drafter = scheme_of(g, draft, **(chain_options or {}))
      add(key, loop_key(g), dataclasses.replace(template, draft=draft, scheme=scheme,
                                                drafter=drafter), Params(target_params, params))
  results, rounds = timing.interleaved_rounds(programs, repeats, tick=tick)
  timed = ({int(x.shape[1]) for x in batches}, [int(x.shape[1]) for x in width_batches],
           tuple(calibration_widths))
  return {key: _loop_costs(results, rounds, key, [loop_key(g) for g in gammas], len(batches),
                           timed)
          for key, (_, _, gammas) in drafts.items()}


def _loop_costs(results, rounds, key, gammas, n_batches: int, widths=((), (), ())
                ) -> LoopCosts:
  """One draft's LoopCosts from `measure_loops`'s timings (the autoregressive ones shared):
  medians of the rounds, and the rounds' own per-iteration costs (paired by round). `widths`:
  (the timed batches' widths, the width batches', the calibration batches'); a width the timed
  batches share gets their fixed cost (their mean where they differ)."""
  timed_widths, extra_widths, calibration_widths = widths

  def by_width(key, g, timed_fixed):
    out = {w: timed_fixed for w in timed_widths}
    out.update({w: 1e3 * statistics.median(rounds[(key, g, ("zero", w))])
                for w in extra_widths})
    return out

  def per_iteration(key, g):
    counts = [acceptance_stats.counters_to_dict(r.counters, draft_stats=r.draft_stats)
              for r in results[(key, g, "full")]]
    iterations = sum(c["iterations"] for c in counts)
    full, zero = rounds[(key, g, "full")], rounds[(key, g, "zero")]
    ms = 1e3 * max(statistics.median(full) - statistics.median(zero), 0.0) / max(iterations, 1)
    by_round = [1e3 * max(f - z, 0.0) / max(iterations, 1) for f, z in zip(full, zero)]
    return ms, 1e3 * statistics.median(zero) / n_batches, iterations, counts, by_round

  ar_ms, ar_fixed, ar_iterations, _, ar_rounds = per_iteration("ar", 0)
  it, fixed, tpi, it_rounds, share = {}, {}, {}, {}, {}
  for g in sorted(gammas, key=loop_order):
    it[g], fixed[g], _, counts, it_rounds[g] = per_iteration(key, g)
    merged = acceptance_stats.merge(counts)
    tpi[g] = merged["emitted"] / max(merged["target_calls"], 1)
    if all("lookup_iterations" in c for c in counts):
      share[g] = sum(c["lookup_iterations"] for c in counts) / max(merged["target_calls"], 1)
  # A longer block never makes an iteration cheaper: a dip is the noise of a shared machine
  # (taken at face value, 'auto' would favour that gamma). Running maximum over the chains'
  # gammas, as for v(T) (trees are no chain of one another, nor lookup-first programs, each a
  # mix at its own lookup share: left as timed).
  chains = sorted(g for g in it if isinstance(g, int) and g not in share)
  for prev, g in zip(chains, chains[1:]):
    it[g] = max(it[g], it[prev])
  first = results[("ar", 0, "full")]
  return LoopCosts(ar_ms=ar_ms, ar_fixed_ms=ar_fixed, tokens=ar_iterations / n_batches,
                   iteration_ms=it, fixed_ms=fixed, tokens_per_iteration=tpi,
                   batches=n_batches, rows=int(first[0].tokens_BxN.shape[0]),
                   ar_rounds_ms=tuple(ar_rounds), iteration_rounds_ms=it_rounds,
                   lookup_share=share, calibration_widths=calibration_widths,
                   ar_fixed_by_width=by_width("ar", 0, ar_fixed) if calibration_widths else {},
                   fixed_by_width=({g: by_width(key, g, fixed[g]) for g in fixed}
                                   if calibration_widths else {}))
