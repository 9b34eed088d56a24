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

import contextlib
import dataclasses
import time
from collections.abc import Callable

import jax
from absl import logging

from specdec_jax import logs, sharding
from specdec_jax.checkpoints import loader
from specdec_jax.data import hf_tokenizer, ngram_tables, tasks
from specdec_jax.decoding.autoregressive import Autoregressive
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.draft_schemes import plan
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.models import packed
from specdec_jax.runner import calibrate, costs as costs_lib, drafts as drafts_lib
from specdec_jax.runner import inputs as inputs_lib, keys, prompt_sets, tree_choice
from specdec_jax.runner.run_config import (ADAPTIVE, AUTO, FEATURE_DRAFT, GAMMA_WORDS, MODEL_DRAFT,
                                      TREE, DraftSpec, RunConfig, as_list, draft_specs, points)
from specdec_jax.runner.store import ResultStore



@dataclasses.dataclass
class Loaded:
  """Everything decoded against: the target, the drafts and the prompts."""

  target: object
  target_params: object
  target_name: str
  drafts: dict
  prompts: inputs_lib.Prompts       # the measured prompts
  calibration: inputs_lib.Prompts   # the prompts 'auto', the costs and the prediction use
  mesh: object = None  # jax.sharding.Mesh of a sharded run
  held_out: bool = True             # calibration prompts disjoint from the measured ones

  def data_parallel(self) -> int:
    """Rows a batch must be a multiple of: the size of the mesh axes `batch` maps to."""
    if self.mesh is None:
      return 1
    return sharding.data_parallel_size(self.mesh, self.target.axis_rules)


def run_vocabulary(cfg: RunConfig) -> str | None:
  """`RunConfig.vocabulary`, else the tokenizer.json of a Hugging Face checkpoint directory the
  target is read from (its text prompts tokenized as the model was trained), else None (the
  task's own or the shipped SentencePiece vocabulary)."""
  if cfg.vocabulary:
    return cfg.vocabulary
  if loader.is_preset(cfg.target_checkpoint):
    return None
  return hf_tokenizer.beside(loader.local_path(cfg.target_checkpoint))


def load(cfg: RunConfig, mesh=None) -> Loaded:
  """The prompts, the target and every draft of the run, placed on `mesh` (a sharded run) with
  the target and draft rules of `cfg.mesh`."""
  if cfg.runs_speculative:
    drafts_lib.check_feature_run(cfg, draft_specs(cfg))
  data = tasks.load(cfg.task, cfg.split, None, vocabulary=run_vocabulary(cfg),
                    max_input_length=cfg.max_input_length, tfds_data_dir=cfg.tfds_data_dir,
                    prompt_format=cfg.prompt_format)
  sets = prompt_sets.choose(len(data.examples), num_examples=cfg.num_examples,
                            calibration_examples=cfg.auto_calibration_examples,
                            calibration=cfg.calibration, sample=cfg.sample_examples, seed=cfg.seed)
  chosen = list(dict.fromkeys(sets.measured + sets.calibration))  # tokenized together: one width
  data = dataclasses.replace(data, examples=[data.examples[i] for i in chosen])
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
    settings = drafts_lib.DraftSettings.for_run(cfg, preset_vocab, data.examples)
    for spec in draft_specs(cfg):
      drafts[spec] = drafts_lib.load_draft(spec, target, tparams, settings, tables_fn=tables_fn,
                                           target_name=cfg.target_checkpoint)
  both = inputs_lib.Prompts.tokenized(data, target, cfg.max_input_length,
                                      truncate=cfg.truncate_inputs, buckets=cfg.prompt_buckets)
  where = {i: j for j, i in enumerate(chosen)}
  prompts = both.take([where[i] for i in sets.measured])
  calibration = both.take([where[i] for i in sets.calibration])
  if mesh is not None:  # gin/mesh/*.gin: target model-parallel, model drafts on fewer chips
    target, tparams, drafts = sharding.place_models(mesh, cfg.mesh, target, tparams, drafts,
                                                   batch_size=cfg.batch_size)
  # The weights in the layout the decode's matmul reads (packed once for the CPU kernel; on a
  # mesh XLA's dot, unchanged); everything below decodes, calibrates and times these.
  target, tparams = packed.for_backend(target, tparams, matmul=cfg.matmul, mesh=mesh)
  drafts = {k: packed.for_backend(d, dp, matmul=cfg.matmul, mesh=mesh,
                                  panels=cfg.draft_panels, role="draft")
            for k, (d, dp) in drafts.items()}
  name = DraftSpec("model", cfg.target_checkpoint).name
  return Loaded(target, tparams, name, drafts, prompts, calibration, mesh, sets.held_out)


def padded(positions, multiple: int) -> list:
  """`positions` with its last entry repeated up to a multiple of `multiple` (a short last batch
  on a data-parallel mesh); the extra rows are decoded and dropped."""
  positions = list(positions)
  return positions + positions[-1:] * (-len(positions) % multiple)


def global_batch(prompts: inputs_lib.Prompts, loaded: Loaded, positions
                 ) -> tuple[object, int]:
  """(inputs every program can take, real rows) of `prompts` at `positions`: numpy without a
  mesh, else a global array batch-sharded over the mesh (the same full batch on every process)."""
  rows = len(positions)
  if loaded.mesh is None:
    return prompts.batch(positions), rows
  batch = prompts.batch(padded(positions, loaded.data_parallel()))
  return sharding.shard_batch(batch, loaded.mesh, loaded.target.axis_rules), rows


def resolve_points(cfg: RunConfig, loaded: Loaded, store: ResultStore, log: Callable
                   ) -> tuple[list, dict]:
  """Measures c and v(T) per draft, the calibration decode's acceptance per draft and
  temperature, the real loops' per-iteration costs (one device), all on the calibration prompts;
  then gives every point a concrete gamma (runner/calibrate.py says what is timed and why)."""
  if not cfg.runs_speculative:
    return [], {}
  costs = measure_costs(cfg, loaded, log)
  acceptance_of = _calibration_acceptances(cfg, loaded, store)
  trees = cfg.tree_candidate_schemes()
  # Trees are chosen from timed loops only (one device) and drafted by model drafts (token or
  # feature-level: the tree takes either drafter), not by the model-free drafters.
  tree_acceptance_of = (_tree_acceptances(cfg, loaded, store, trees)
                        if trees and loaded.mesh is None else None)
  pts = points(cfg)
  plans = {}
  for p in (p for p in pts if p.gamma == AUTO):
    tree_fn = (None if tree_acceptance_of is None
               or p.draft.kind not in (MODEL_DRAFT, FEATURE_DRAFT)
               else lambda p=p: tree_acceptance_of(p))
    plans[p] = calibrate.plan_auto(p, costs[p.draft], store, lambda p=p: acceptance_of(p),
                                   gamma_max=cfg.gamma_max, min_speedup=cfg.auto_min_speedup,
                                   rule=cfg.rule, trees=trees, tree_acceptance_fn=tree_fn)
    if plans[p].memo is None:
      log(f"GAMMA='auto' for {p.draft.name} at temperature {p.temperature:g}: alpha "
          f"{plans[p].alpha:.3f}; lone-extend prediction " + ", ".join(
              f"{g}: {s:.2f}" for g, s in sorted(plans[p].lone_curve.items()) if g)
          + f"; loops to time: {list(plans[p].candidates) or 'none'}"
          + "".join(f", {costs_lib.loop_key(t)}" for t in plans[p].trees))
  loops = measure_loops(cfg, loaded, {p: calibrate.loop_gammas(p, plans.get(p)) for p in pts},
                        log)
  resolved = []
  for p in pts:
    loop = loops.get((p.draft, p.temperature))
    cal = acceptance_of(p) if p.gamma not in (ADAPTIVE, TREE) else None
    if p not in plans:
      resolved.append(calibrate.resolved(p, adaptive=cfg.adaptive_config(),
                                         tree=cfg.tree_scheme(), loop=loop, calibration=cal))
      continue
    memo = calibrate.choose(plans[p], costs[p.draft], loop, store,
                            min_speedup=cfg.auto_min_speedup, rule=cfg.rule)
    r = calibrate.resolved(p, memo=memo, loop=loop, calibration=cal, tree=cfg.tree_scheme(),
                           trees=trees)
    log(f"GAMMA='auto' for {p.draft.name} at temperature {p.temperature:g}: alpha "
        f"{r.calibration_alpha:.3f}, c {costs[p.draft].c:.3f}, predicted "
        + ", ".join(f"{g}: {s:.2f}" for g, s in r.predicted_curve + r.tree_curve)
        + f" ({memo.get('curve_from', 'lone_extend')}) -> "
        + (costs_lib.loop_key(r.tree) if r.tree is not None else f"gamma {r.gamma}")
        + (" (plain autoregressive decoding)" if r.gamma == 0 else "")
        + calibrate.describe_confidence(memo.get("confidence", {})))
    resolved.append(r)
  return resolved, costs


def measure_costs(cfg: RunConfig, loaded: Loaded, log: Callable) -> dict:
  """{draft spec: timing.Costs}: c and v(T) from lone `extend` calls on the first calibration
  batch, process 0's on every process; warns of a draft that costs more than its target."""
  cal = loaded.calibration
  first, _ = global_batch(cal, loaded, range(min(cfg.batch_size, len(cal.ids))))
  tokens = costs_lib.verify_tokens_needed(cfg.gamma, cfg.gamma_max)
  t0 = time.perf_counter()
  with contextlib.closing(logs.bar("calibrate: extend costs", unit="step")) as progress:
    costs = costs_lib.measure(loaded.target, loaded.target_params, loaded.drafts, first, tokens,
                              max_decode_len=cfg.max_decode_length, tick=logs.ticker(progress))
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
  return costs


def _calibration_acceptances(cfg: RunConfig, loaded: Loaded, store: ResultStore) -> Callable:
  """acceptance_of(point) -> the calibration decode's {'alpha', 'accept_at_least', 'gamma',
  'prompts', 'held_out'} for the point's draft and temperature: one untimed decode of all the
  calibration prompts at the calibration gamma, made once and remembered in the store (a resumed
  run recalls it)."""
  fixed = [int(g) for g in as_list(cfg.gamma) if g not in GAMMA_WORDS]
  gamma = calibrate.calibration_gamma(cfg.auto_calibration_gamma, cfg.gamma_max, fixed)
  cal = loaded.calibration
  rows = range(len(cal.ids))

  def acceptance_of(p) -> dict:
    key = keys.calibration(p.draft.name, p.temperature)
    acc = store.recall("calibration", key)
    if acc is None:
      acc = calibrate.calibration_acceptance(
          *decoder_for(cfg, loaded, p.temperature, p.draft,
                       gamma),
          global_batch(cal, loaded, rows)[0], rows=len(rows), seed=cfg.seed)
      acc = dict(acc, gamma=gamma, prompts=len(rows), held_out=loaded.held_out)
      store.remember("calibration", key, acc)
    return acc
  return acceptance_of


def _tree_acceptances(cfg: RunConfig, loaded: Loaded, store: ResultStore, trees) -> Callable:
  """tree_acceptance_of(point) -> `tree_choice.calibration_decodes` on all the calibration
  prompts for the point's draft and temperature (a probe tree decode's a[d][r], a dynamic
  candidate's own decode's tokens per call), each decode made once and remembered in the
  store."""
  cal = loaded.calibration
  rows = range(len(cal.ids))

  def tree_acceptance_of(p) -> dict:
    def decode(suffix, scheme, fn):
      key = keys.calibration(p.draft.name, p.temperature) + "/" + suffix
      acc = store.recall("calibration", key)
      if acc is None:
        acc = fn(*decoder_for(cfg, loaded, p.temperature, p.draft, scheme),
                 global_batch(cal, loaded, rows)[0], seed=cfg.seed)
        store.remember("calibration", key, acc)
      return acc
    return tree_choice.calibration_decodes(trees, decode)
  return tree_acceptance_of


def calibration_batches(cfg: RunConfig, loaded: Loaded) -> list:
  """The first max(batch_size, auto_timing_examples) calibration prompts in the run's batch
  shape: in full batches of batch_size (or one short batch of them all when there are fewer than
  batch_size)."""
  n = min(len(loaded.calibration.ids), max(cfg.batch_size, cfg.auto_timing_examples))
  chunks = [list(range(i, min(i + cfg.batch_size, n))) for i in range(0, n, cfg.batch_size)]
  full = [c for c in chunks if len(c) == cfg.batch_size] or chunks[:1]
  return [jax.device_put(loaded.calibration.batch(c)) for c in full]


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
    with contextlib.closing(logs.bar(f"calibrate: loops at T={t:g}", unit="step")) as progress:
      loops = costs_lib.measure_loops(
          decoder_for(cfg, loaded, t)[0], loaded.target_params,
          {d: (*loaded.drafts[d], sorted(gs, key=costs_lib.loop_order))
           for d, gs in by_draft.items()}, batches,
          seed=cfg.seed, tick=logs.ticker(progress), chain_options=drafts_lib.chain_options(cfg))
    for d, lc in loops.items():
      if lc.unresolved():
        logging.warning("loop costs at temperature %g, %s: the iteration cost of %s is within "
                        "the timing noise (a full decode no slower than one with no iteration); "
                        "predicting from lone extend costs instead", t, d.name,
                        ", ".join(lc.unresolved()))
        continue
      out[(d, t)] = lc
      log(f"loop costs at temperature {t:g}, {d.name} ({lc.batches} batches of {lc.rows}, "
          f"{time.perf_counter() - t0:.1f}s with compiles): autoregressive {lc.ar_ms:.2f} ms/"
          f"iteration (+{lc.ar_fixed_ms:.1f} ms per request); speculative " + ", ".join(
              f"{'gamma ' if isinstance(g, int) else ''}{g}: {ms:.2f} ms/iteration "
              f"(+{lc.fixed_ms[g]:.1f})" for g, ms in sorted(
                  lc.iteration_ms.items(), key=lambda x: costs_lib.loop_order(x[0]))))
  return out


def sampling_of(cfg: RunConfig, temperature: float) -> SamplingConfig:
  return SamplingConfig(temperature=float(temperature), top_k=int(cfg.top_k),
                        top_p=float(cfg.top_p))


def decoder_for(cfg: RunConfig, loaded: Loaded, temperature: float, spec: DraftSpec | None = None,
                scheme=Autoregressive()) -> tuple[Decoder, Params]:
  """The run's Decoder for a draft (None: the autoregressive baseline) and scheme (an int: the
  chain at that gamma), with its params; on the run's mesh when it has one. A feature-level
  draft's chain is built with the run's options (`draft_schemes.plan`,
  `drafts.chain_options`: its parallel block, prompt lookup first)."""
  draft, dparams = loaded.drafts[spec] if spec is not None else (None, None)
  scheme, drafter = plan(draft, scheme, **drafts_lib.chain_options(cfg))
  decoder = Decoder(loaded.target, draft, scheme, sampling_of(cfg, temperature), rule=cfg.rule,
                    max_decode_len=cfg.max_decode_length, mesh=loaded.mesh, drafter=drafter)
  return decoder, Params(loaded.target_params, dparams)
