"""The run pipeline: load, measure, calibrate, decode batch by batch (written as it goes), report.

Why this shape: for each temperature the autoregressive baseline and every speculative point of
that temperature decode the same batch in the same process, timed interleaved (specdec_jax/timing.py),
and the batch is appended to the result files before the next one starts (runner/store.py). The
published metrics are then computed from those files alone (runner/collect.py), so a killed and
resumed run reports exactly what an uninterrupted one would, up to timing noise.

Every decode is a `decoding.decoder.Decoder` (`decoder_for`). On a mesh (`RunConfig.mesh`,
gin/mesh/*.gin) the same Decoder carries the mesh and runs its donated-state programs: every
process feeds only the rows its devices hold, the results are gathered, and only process 0 writes
(runner/experiment.py). Anything chosen from local timings is agreed first.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import numpy as np
from absl import logging

from specdec_jax import distributed, sharding, timing
from specdec_jax.checkpoints import loader
from specdec_jax.data import ngram_tables, tasks
from specdec_jax.decoding.autoregressive import Autoregressive
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.metrics import acceptance
from specdec_jax.models import packed
from specdec_jax.metrics.records import AR, BatchRecord, ProgramRecord
from specdec_jax.runner import calibrate, costs as costs_lib, drafts as drafts_lib, inputs as inputs_lib
from specdec_jax.runner import keys
from specdec_jax.runner.config import AUTO, DraftSpec, RunConfig, draft_specs, points, temperatures
from specdec_jax.runner.store import ResultStore



@dataclasses.dataclass
class Loaded:
  """Everything decoded against: the target, the drafts and the prompts."""

  target: object
  target_params: object
  target_name: str
  drafts: dict
  prompts: inputs_lib.Prompts
  mesh: object = None  # jax.sharding.Mesh of a sharded run

  def data_parallel(self) -> int:
    """Rows a batch must be a multiple of: the size of the mesh axes `batch` maps to."""
    if self.mesh is None:
      return 1
    return sharding.data_parallel_size(self.mesh, self.target.axis_rules)


def load(cfg: RunConfig, mesh=None) -> Loaded:
  """The prompts, the target and every draft of the run, placed on `mesh` (a sharded run) with
  the target and draft rules of `cfg.mesh`."""
  data = tasks.load(cfg.task, cfg.split, cfg.num_examples, vocabulary=cfg.vocabulary,
                    max_input_length=cfg.max_input_length, tfds_data_dir=cfg.tfds_data_dir)
  preset_vocab = data.preset_vocab_size
  target, tparams = loader.load_model(cfg.target_checkpoint, vocab_size=preset_vocab,
                                      dtype=cfg.dtype, seed=cfg.seed)
  drafts = {}
  if cfg.runs_speculative:
    tables = {}

    def tables_fn():  # estimated once per run, shared by unigram and bigram
      if "t" not in tables:
        tables["t"] = ngram_tables.tables_for_run(
            cfg.ngram_tables, lambda: tasks.ngram_examples(
                cfg.task, data.examples, cfg.ngram_train_examples,
                tfds_data_dir=cfg.tfds_data_dir), data.vocab, target, log=logging.info)
      return tables["t"]
    settings = drafts_lib.DraftSettings.for_run(cfg, preset_vocab)
    for spec in draft_specs(cfg):
      drafts[spec] = drafts_lib.load_draft(spec, target, tparams, settings, tables_fn=tables_fn,
                                           target_name=cfg.target_checkpoint)
  prompts = inputs_lib.Prompts.tokenized(data, target, cfg.max_input_length)
  if mesh is not None:  # gin/mesh/*.gin: target model-parallel, model drafts on fewer chips
    target, tparams, drafts = sharding.place_models(mesh, cfg.mesh, target, tparams, drafts,
                                                   batch_size=cfg.batch_size)
  # The weights in the layout the decode's matmul reads (packed once for the CPU kernel; on a
  # mesh XLA's dot, unchanged); everything below decodes, calibrates and times these.
  target, tparams = packed.for_backend(target, tparams, matmul=cfg.matmul, mesh=mesh)
  drafts = {k: packed.for_backend(d, dp, matmul=cfg.matmul, mesh=mesh)
            for k, (d, dp) in drafts.items()}
  name = DraftSpec("model", cfg.target_checkpoint).name
  return Loaded(target, tparams, name, drafts, prompts, mesh)


def padded(positions, multiple: int) -> list:
  """`positions` with its last entry repeated up to a multiple of `multiple` (a short last batch
  on a data-parallel mesh); the extra rows are decoded and dropped."""
  positions = list(positions)
  return positions + positions[-1:] * (-len(positions) % multiple)


def global_batch(loaded: Loaded, positions) -> tuple[object, int]:
  """(inputs every program can take, real rows): numpy without a mesh, else a global array
  batch-sharded over the mesh (the same full batch on every process)."""
  rows = len(positions)
  if loaded.mesh is None:
    return loaded.prompts.batch(positions), rows
  batch = loaded.prompts.batch(padded(positions, loaded.data_parallel()))
  return sharding.shard_batch(batch, loaded.mesh, loaded.target.axis_rules), rows


def resolve_points(cfg: RunConfig, loaded: Loaded, store: ResultStore, log: Callable
                   ) -> tuple[list, dict]:
  """Measures c and v(T) per draft, the real loops' per-iteration costs (one device), then gives
  every point a concrete gamma (runner/calibrate.py says what is timed and why)."""
  if not cfg.runs_speculative:
    return [], {}
  first, _ = global_batch(loaded, range(min(cfg.batch_size, len(loaded.prompts.ids))))
  tokens = costs_lib.verify_tokens_needed(cfg.gamma, cfg.gamma_max)
  t0 = time.perf_counter()
  costs = costs_lib.measure(loaded.target, loaded.target_params, loaded.drafts, first, tokens,
                            max_decode_len=cfg.max_decode_length)
  costs = costs_lib.agree(costs)  # every process resolves 'auto' from process 0's timings
  log(f"measured costs in {time.perf_counter() - t0:.1f}s: " + "; ".join(
      f"{s.name}: c={c.c:.3f}, target {c.target_ms:.3f} ms/call, " +
      ", ".join(f"v({n})={c.v[n]:.2f}" for n in sorted(c.v) if n > 1) for s, c in costs.items()))
  for spec, c in costs.items():
    if c.c > 1.0:
      logging.warning(
          "draft %s costs more than its target: one draft step %.3f ms against %.3f ms for a "
          "target step (c = %.2f > 1); speculation cannot pay with such a draft (a draft larger "
          "than its target, or a target on a faster path?)", spec.name, c.draft_ms, c.target_ms,
          c.c)
  cal_rows = range(min(cfg.auto_calibration_examples, len(loaded.prompts.ids)))
  pts = points(cfg)
  plans = {}
  for p in pts:
    if p.gamma != AUTO:
      continue
    cal_gamma = calibrate.calibration_gamma(cfg.auto_calibration_gamma, cfg.gamma_max)
    acceptance_fn = lambda p=p, g=cal_gamma: calibrate.calibration_acceptance(  # noqa: E731
        *decoder_for(cfg, loaded, p.temperature, p.draft, Chain(g)),
        global_batch(loaded, cal_rows)[0], rows=len(cal_rows), seed=cfg.seed)
    plans[p] = calibrate.plan_auto(p, costs[p.draft], store, acceptance_fn,
                                   gamma_max=cfg.gamma_max, min_speedup=cfg.auto_min_speedup,
                                   rule=cfg.rule)
    if plans[p].memo is None:
      log(f"GAMMA='auto' for {p.draft.name} at temperature {p.temperature:g}: alpha "
          f"{plans[p].alpha:.3f}; lone-extend prediction " + ", ".join(
              f"{g}: {s:.2f}" for g, s in sorted(plans[p].lone_curve.items()) if g)
          + f"; loops to time: {list(plans[p].candidates) or 'none'}")
  loops = measure_loops(cfg, loaded, {p: calibrate.loop_gammas(p, plans.get(p)) for p in pts},
                        log)
  resolved = []
  for p in pts:
    loop = loops.get((p.draft, p.temperature))
    if p not in plans:
      resolved.append(calibrate.resolved(p, adaptive=cfg.adaptive_config(), loop=loop))
      continue
    memo = calibrate.choose(plans[p], costs[p.draft], loop, store,
                            min_speedup=cfg.auto_min_speedup, rule=cfg.rule)
    r = calibrate.resolved(p, memo=memo, loop=loop)
    log(f"GAMMA='auto' for {p.draft.name} at temperature {p.temperature:g}: alpha "
        f"{r.calibration_alpha:.3f}, c {costs[p.draft].c:.3f}, predicted "
        + ", ".join(f"{g}: {s:.2f}" for g, s in r.predicted_curve)
        + f" ({memo.get('curve_from', 'lone_extend')}) -> gamma {r.gamma}"
        + (" (plain autoregressive decoding)" if r.gamma == 0 else ""))
    resolved.append(r)
  return resolved, costs


def calibration_batches(cfg: RunConfig, loaded: Loaded) -> list:
  """The calibration prompts in the run's batch shape: the first max(batch_size,
  auto_calibration_examples) prompts in full batches of batch_size (or the one short batch the
  run itself starts with when there are fewer prompts than that)."""
  n = len(loaded.prompts.ids)
  rows = min(max(cfg.batch_size, cfg.auto_calibration_examples), n)
  chunks = [list(range(i, min(i + cfg.batch_size, rows))) for i in range(0, rows, cfg.batch_size)]
  full = [c for c in chunks if len(c) == cfg.batch_size] or chunks[:1]
  return [jax.device_put(loaded.prompts.batch(c)) for c in full]


def measure_loops(cfg: RunConfig, loaded: Loaded, gammas: dict, log: Callable) -> dict:
  """{(draft spec, temperature): costs.LoopCosts} for the gammas each point needs
  ({point: gammas}); one `costs.measure_loops` per temperature. Empty on a mesh: the sharded
  programs are predicted from lone `extend` costs."""
  need: dict = {}
  for p, gs in gammas.items():
    if gs:
      need.setdefault(p.temperature, {}).setdefault(p.draft, set()).update(gs)
  if loaded.mesh is not None or not need:
    return {}
  batches = calibration_batches(cfg, loaded)
  out = {}
  for t, by_draft in need.items():
    t0 = time.perf_counter()
    loops = costs_lib.measure_loops(
        decoder_for(cfg, loaded, t)[0], loaded.target_params,
        {d: (*loaded.drafts[d], sorted(gs)) for d, gs in by_draft.items()}, batches,
        seed=cfg.seed)
    for d, lc in loops.items():
      out[(d, t)] = lc
      log(f"loop costs at temperature {t:g}, {d.name} ({lc.batches} batches of {lc.rows}, "
          f"{time.perf_counter() - t0:.1f}s with compiles): autoregressive {lc.ar_ms:.2f} ms/"
          f"iteration (+{lc.ar_fixed_ms:.1f} ms per request); speculative " + ", ".join(
              f"gamma {g}: {ms:.2f} ms/iteration (+{lc.fixed_ms[g]:.1f})"
              for g, ms in sorted(lc.iteration_ms.items())))
  return out


def sampling_of(cfg: RunConfig, temperature: float) -> SamplingConfig:
  return SamplingConfig(temperature=float(temperature), top_k=int(cfg.top_k),
                        top_p=float(cfg.top_p))


def decoder_for(cfg: RunConfig, loaded: Loaded, temperature: float, spec: DraftSpec | None = None,
                scheme=Autoregressive()) -> tuple[Decoder, Params]:
  """The run's Decoder for a draft (None: the autoregressive baseline) and scheme, with its
  params; on the run's mesh when it has one."""
  draft, dparams = loaded.drafts[spec] if spec is not None else (None, None)
  decoder = Decoder(loaded.target, draft, scheme, sampling_of(cfg, temperature), rule=cfg.rule,
                    max_decode_len=cfg.max_decode_length, mesh=loaded.mesh)
  return decoder, Params(loaded.target_params, dparams)


def decode_batch(cfg: RunConfig, loaded: Loaded, group_points, temperature: float, positions
                 ) -> tuple[BatchRecord, list]:
  """Decodes and times one batch for the AR baseline and the group's points; record + lines."""
  rows = len(positions)
  examples = [loaded.prompts.examples[p] for p in positions]
  rng = jax.random.fold_in(jax.random.key(cfg.seed), examples[0].index)
  program = _programs(cfg, loaded, temperature, positions, rng)
  programs = {}
  if cfg.runs_autoregressive or any(p.gamma == 0 for p in group_points):
    programs[AR] = program(None, Autoregressive())
  for p in group_points:
    if p.gamma > 0:
      programs[p.key] = program(p.draft, p.adaptive or Chain(p.gamma))
  results, seconds = timing.interleaved(programs, cfg.repeats, agree=distributed.agree)
  results = {k: distributed.gather(r) for k, r in results.items()}  # global -> host, every row
  outputs = {k: _outputs(r, rows) for k, r in results.items()}
  counters = {k: acceptance.counters_to_dict(r.counters, rows) for k, r in results.items()}
  record = BatchRecord(
      group=keys.group(temperature), indices=tuple(ex.index for ex in examples),
      points={p.key: ProgramRecord(seconds[k], counters[k], gamma=p.gamma)
              for p in group_points for k in [p.key if p.gamma > 0 else AR]},
      autoregressive=ProgramRecord(seconds[AR], counters[AR]) if AR in programs else None)
  return record, _lines(loaded, examples, record.group, group_points, outputs, temperature)


def _lines(loaded: Loaded, examples, group: str, group_points, outputs: dict,
           temperature: float) -> list[dict]:
  """predictions.jsonl's lines of one batch: every run's outputs beside the autoregressive ones."""
  lines = []
  ar_out = outputs.get(AR)
  runs = [(p.key, outputs[p.key if p.gamma > 0 else AR]) for p in group_points]
  if not group_points:
    runs = [(keys.autoregressive(temperature), ar_out)]
  for run, out in runs:
    for i, ex in enumerate(examples):
      line = {"run": run, "group": group, "index": ex.index,
              "output_ids": out[i], "text": loaded.prompts.decode(out[i]),
              "reference": ex.reference}
      if ar_out is not None and group_points:
        line["autoregressive_output_ids"] = ar_out[i]
        line["autoregressive_text"] = loaded.prompts.decode(ar_out[i])
        line["match"] = out[i] == ar_out[i]
      lines.append(line)
  return lines


def _programs(cfg: RunConfig, loaded: Loaded, temperature: float, positions, rng) -> Callable:
  """program(draft spec or None, scheme) -> a callable decoding the batch. On a mesh each
  process feeds only its rows (`distributed.local_rows`) and a short batch is padded to the data
  axis."""
  if loaded.mesh is None:
    inputs, local = jax.device_put(loaded.prompts.batch(positions)), False
  else:
    batch = loaded.prompts.batch(padded(positions, loaded.data_parallel()))
    rows = distributed.local_rows(
        sharding.batch_sharding(loaded.mesh, loaded.target.axis_rules), batch.shape[0])
    inputs, local = batch[rows], True  # this process's rows only

  def program(spec, scheme):
    decoder, params = decoder_for(cfg, loaded, temperature, spec, scheme)
    return lambda: decoder.generate(params, inputs, rng, process_local=local)
  return program


def _outputs(result, rows: int) -> list[list[int]]:
  tokens = np.asarray(result.tokens_BxN)
  lengths = np.asarray(result.lengths_B)
  return [tokens[i, :lengths[i]].astype(int).tolist() for i in range(rows)]


def decode_all(cfg: RunConfig, loaded: Loaded, resolved, store: ResultStore, progress: Callable
               ) -> None:
  """Every temperature group, batch by batch, skipping examples already on disk."""
  total = len(loaded.prompts.examples)
  for t in temperatures(cfg):
    group_points = [p for p in resolved if p.temperature == t]
    done = store.done_indices(keys.group(t))
    todo = [pos for pos, ex in enumerate(loaded.prompts.examples) if ex.index not in done]
    if done:
      progress(temperature=t, done=len(done), total=total, record=None, resumed=True)
    for start in range(0, len(todo), cfg.batch_size):
      positions = todo[start:start + cfg.batch_size]
      record, lines = decode_batch(cfg, loaded, group_points, t, positions)
      store.add_batch(record, lines)
      progress(temperature=t, done=len(store.done_indices(keys.group(t))), total=total,
               record=record, resumed=False)
