"""The run pipeline: load, measure, calibrate, decode batch by batch (written as it goes), report.

Why this shape: for each temperature the autoregressive baseline and every speculative point of
that temperature decode the same batch in the same process, timed interleaved (specdec_jax/timing.py),
and the batch is appended to the result files before the next one starts (runner/store.py). The
published metrics are then computed from those files alone (runner/collect.py), so a killed and
resumed run reports exactly what an uninterrupted one would, up to timing noise.

On a mesh (`RunConfig.mesh`, gin/mesh/*.gin) each batch runs through `decoding.sharded`'s donated
programs: every process feeds only the rows its devices hold, the results are gathered, and only
process 0 writes (runner/experiment.py). Anything chosen from local timings is agreed first.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import numpy as np
from absl import logging

from specdec_jax import distributed, timing
from specdec_jax.checkpoints import loader
from specdec_jax.decoding.adaptive import generate_adaptive
from specdec_jax.decoding.autoregressive import generate_autoregressive
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import generate_speculative
from specdec_jax.metrics import acceptance
from specdec_jax.models import packed
from specdec_jax.metrics.records import AR, BatchRecord, ProgramRecord
from specdec_jax.runner import calibrate, drafts as drafts_lib, inputs as inputs_lib, keys
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
    from specdec_jax import sharding  # pylint: disable=import-outside-toplevel
    return sharding.data_parallel_size(self.mesh, self.target.axis_rules)


def load(cfg: RunConfig, mesh=None) -> Loaded:
  """The prompts, the target and every draft of the run, placed on `mesh` (a sharded run) with
  the target and draft rules of `cfg.mesh`."""
  examples = inputs_lib.load_examples(cfg.task, cfg.split, cfg.num_examples,
                                      max_input_length=cfg.max_input_length,
                                      tfds_data_dir=cfg.tfds_data_dir)
  text = inputs_lib.needs_text(examples)
  seqio_ids = inputs_lib.is_seqio(cfg.task)  # ids tokenized by the task's own vocabulary
  if seqio_ids and not cfg.vocabulary:
    from specdec_jax.data import seqio_tasks
    vocab = seqio_tasks.vocabulary(cfg.task, cfg.tfds_data_dir)
  else:
    vocab = inputs_lib.load_vocabulary(cfg.vocabulary, required=text)
  preset_vocab = vocab.padded_vocab_size if ((text or seqio_ids) and vocab is not None) else None
  target, tparams = loader.load_model(cfg.target_checkpoint, vocab_size=preset_vocab,
                                      dtype=cfg.dtype, seed=cfg.seed)
  drafts = {}
  if cfg.runs_speculative:
    tables = {}

    def tables_fn():  # estimated once per run, shared by unigram and bigram
      if "t" not in tables:
        tables["t"] = drafts_lib.ngram_tables(
            cfg.ngram_tables, lambda: inputs_lib.ngram_examples(cfg, examples), vocab, target,
            log=logging.info)
      return tables["t"]
    settings = drafts_lib.DraftSettings.for_run(cfg, preset_vocab)
    for spec in draft_specs(cfg):
      drafts[spec] = drafts_lib.load_draft(spec, target, tparams, settings, tables_fn=tables_fn,
                                           target_name=cfg.target_checkpoint)
  ids = inputs_lib.tokenize(examples, vocab if text else None,
                            model_vocab_size=target.vocab_size,
                            encoder_decoder=target.config.is_encoder_decoder,
                            max_input_length=cfg.max_input_length)
  prompts = inputs_lib.Prompts(examples, ids, inputs_lib.vocab_for_decoding(vocab, target.vocab_size),
                               width=max(len(r) for r in ids))
  if mesh is not None:  # gin/mesh/*.gin: target model-parallel, model drafts on fewer chips
    from specdec_jax.decoding import sharded  # pylint: disable=import-outside-toplevel
    target, tparams, drafts = sharded.place_models(mesh, cfg.mesh, target, tparams, drafts,
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
  from specdec_jax import sharding  # pylint: disable=import-outside-toplevel
  batch = loaded.prompts.batch(padded(positions, loaded.data_parallel()))
  return sharding.shard_batch(batch, loaded.mesh, loaded.target.axis_rules), rows


def resolve_points(cfg: RunConfig, loaded: Loaded, store: ResultStore, log: Callable
                   ) -> tuple[list, dict]:
  """Measures c and v(T) per draft, the real loops' per-iteration costs (one device), then gives
  every point a concrete gamma (runner/calibrate.py says what is timed and why)."""
  if not cfg.runs_speculative:
    return [], {}
  first, _ = global_batch(loaded, range(min(cfg.batch_size, len(loaded.prompts.ids))))
  tokens = calibrate.verify_tokens_needed(cfg.gamma, cfg.gamma_max)
  t0 = time.perf_counter()
  costs = calibrate.measure(loaded.target, loaded.target_params, loaded.drafts, first, tokens,
                            max_decode_len=cfg.max_decode_length)
  costs = calibrate.agree(costs)  # every process resolves 'auto' from process 0's timings
  log(f"measured costs in {time.perf_counter() - t0:.1f}s: " + "; ".join(
      f"{s.name}: c={c.c:.3f}, target {c.target_ms:.3f} ms/call, " +
      ", ".join(f"v({n})={c.v[n]:.2f}" for n in sorted(c.v) if n > 1) for s, c in costs.items()))
  cal_rows = range(min(cfg.auto_calibration_examples, len(loaded.prompts.ids)))
  pts = points(cfg)
  plans = {}
  for p in pts:
    if p.gamma != AUTO:
      continue
    draft, dparams = loaded.drafts[p.draft]
    cal_gamma = calibrate.calibration_gamma(cfg.auto_calibration_gamma, cfg.gamma_max)
    acceptance_fn = lambda p=p, draft=draft, dparams=dparams, g=cal_gamma: (  # noqa: E731
        calibrate.calibration_acceptance(
            loaded.target, loaded.target_params, draft, dparams,
            global_batch(loaded, cal_rows)[0], rows=len(cal_rows), gamma=g,
            sampling=sampling_of(cfg, p.temperature), max_decode_len=cfg.max_decode_length,
            seed=cfg.seed, rule=cfg.rule))
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
  """{(draft spec, temperature): calibrate.LoopCosts} for the gammas each point needs
  ({point: gammas}); one `calibrate.measure_loops` per temperature. Empty on a mesh: the sharded
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
    loops = calibrate.measure_loops(
        loaded.target, loaded.target_params,
        {d: (*loaded.drafts[d], sorted(gs)) for d, gs in by_draft.items()}, batches,
        sampling=sampling_of(cfg, t), rule=cfg.rule, max_decode_len=cfg.max_decode_length,
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


def decode_batch(cfg: RunConfig, loaded: Loaded, group_points, temperature: float, positions
                 ) -> tuple[BatchRecord, list]:
  """Decodes and times one batch for the AR baseline and the group's points; record + lines."""
  rows = len(positions)
  examples = [loaded.prompts.examples[p] for p in positions]
  rng = jax.random.fold_in(jax.random.key(cfg.seed), examples[0].index)
  sampling = sampling_of(cfg, temperature)
  common = dict(sampling=sampling, max_decode_len=cfg.max_decode_length)
  decoders = (_sharded_decoders(loaded, positions, rng, common) if loaded.mesh is not None
              else _local_decoders(loaded, positions, rng, common))
  programs = {}
  if cfg.runs_autoregressive or any(p.gamma == 0 for p in group_points):
    programs[AR] = decoders(None, 0)
  for p in group_points:
    if p.gamma > 0:
      programs[p.key] = decoders(p.draft, p.gamma, cfg.rule, p.adaptive)
  results, seconds = timing.interleaved(programs, cfg.repeats, agree=distributed.agree)
  results = {k: r[0] if isinstance(r, tuple) else r for k, r in results.items()}  # adaptive: stats
  results = {k: distributed.gather(r) for k, r in results.items()}  # global -> host, every row
  outputs = {k: _outputs(r, rows) for k, r in results.items()}
  counters = {k: acceptance.counters_to_dict(r.counters, rows) for k, r in results.items()}
  record = BatchRecord(
      group=keys.group(temperature), indices=tuple(ex.index for ex in examples),
      points={p.key: ProgramRecord(seconds[k], counters[k], gamma=p.gamma)
              for p in group_points for k in [p.key if p.gamma > 0 else AR]},
      autoregressive=ProgramRecord(seconds[AR], counters[AR]) if AR in programs else None)
  lines = []
  ar_out = outputs.get(AR)
  runs = [(p.key, outputs[p.key if p.gamma > 0 else AR]) for p in group_points]
  if not group_points:
    runs = [(keys.autoregressive(temperature), ar_out)]
  for run, out in runs:
    for i, ex in enumerate(examples):
      line = {"run": run, "group": record.group, "index": ex.index,
              "output_ids": out[i], "text": loaded.prompts.decode(out[i]),
              "reference": ex.reference}
      if ar_out is not None and group_points:
        line["autoregressive_output_ids"] = ar_out[i]
        line["autoregressive_text"] = loaded.prompts.decode(ar_out[i])
        line["match"] = out[i] == ar_out[i]
      lines.append(line)
  return record, lines


def _local_decoders(loaded: Loaded, positions, rng, common: dict) -> Callable:
  """decoders(draft spec or None, gamma, rule, adaptive) -> a program decoding the batch on one
  device (adaptive: an AdaptiveConfig for GAMMA='adaptive', else None)."""
  inputs = jax.device_put(loaded.prompts.batch(positions))

  def decoder(spec, gamma, rule="tokenwise", adaptive=None):
    if spec is None:
      return lambda: generate_autoregressive(loaded.target, loaded.target_params, inputs, rng=rng,
                                             **common)
    draft, dparams = loaded.drafts[spec]
    if adaptive is not None:
      return lambda: generate_adaptive(loaded.target, loaded.target_params, draft, dparams,
                                       inputs, cfg=adaptive, rule=rule, rng=rng, **common)
    return lambda: generate_speculative(loaded.target, loaded.target_params, draft, dparams,
                                        inputs, gamma=gamma, rule=rule, rng=rng, **common)
  return decoder


def _sharded_decoders(loaded: Loaded, positions, rng, common: dict) -> Callable:
  """The same on the mesh: each process feeds only its rows (`distributed.local_rows`) to the
  donated-state programs of `decoding.sharded`; a short batch is padded to the data axis."""
  from specdec_jax import sharding  # pylint: disable=import-outside-toplevel
  from specdec_jax.decoding.sharded import ShardedModels  # pylint: disable=import-outside-toplevel
  batch = loaded.prompts.batch(padded(positions, loaded.data_parallel()))
  rows = distributed.local_rows(sharding.batch_sharding(loaded.mesh, loaded.target.axis_rules),
                                batch.shape[0])
  local = batch[rows]  # this process's rows only

  def decoder(spec, gamma, rule="tokenwise", adaptive=None):
    if spec is None:
      sm = ShardedModels(loaded.mesh, loaded.target, loaded.target_params)
      return lambda: sm.autoregressive(local, rng, process_local=True, **common)
    draft, dparams = loaded.drafts[spec]
    sm = ShardedModels(loaded.mesh, loaded.target, loaded.target_params, draft, dparams)
    if adaptive is not None:
      return lambda: sm.adaptive(local, rng, cfg=adaptive, rule=rule, process_local=True,
                                 **common)
    return lambda: sm.speculative(local, rng, gamma=gamma, rule=rule, process_local=True, **common)
  return decoder


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
