"""Decoding a run's prompts batch by batch: the autoregressive baseline and every speculative
point of a temperature on the same batch, timed side by side, written as it goes.

Why batch by batch: each batch is appended to the result files before the next one starts
(runner/store.py), so a killed run resumes where it stopped; the timings of one batch are taken
interleaved (timing.py), so a ratio of two programs compares the same minutes of the machine.
Every decode is the run's `decoding.decoder.Decoder` (`decoder_for`); on a mesh the same Decoder
carries the mesh, every process feeds only the rows its devices hold and the results are gathered.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from specdec_jax import distributed, sharding, timing
from specdec_jax.decoding.autoregressive import Autoregressive
from specdec_jax.metrics import acceptance_stats
from specdec_jax.metrics.records import AR, BatchRecord, ProgramRecord
from specdec_jax.runner import keys
from specdec_jax.runner.run_config import RunConfig, temperatures
from specdec_jax.runner.pipeline import Loaded, decoder_for, padded
from specdec_jax.runner.store import ResultStore


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
      programs[p.key] = program(p.draft, p.tree or p.adaptive or p.gamma)
  results, seconds = timing.interleaved(programs, cfg.repeats, agree=distributed.agree)
  results = {k: distributed.gather(r) for k, r in results.items()}  # global -> host, every row
  outputs = {k: _outputs(r, rows) for k, r in results.items()}
  counters = {k: acceptance_stats.counters_to_dict(r.counters, rows, r.stats, r.draft_stats)
              for k, r in results.items()}
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
