"""One run end to end, without gin: `execute(RunConfig, output_dir)` -> the metrics objects.

Why separate from run.py: tests and notebooks drive runs from a `RunConfig` directly; run.py only
turns flags and gin files into one. Progress goes to absl logging (examples done, tokens/s,
running alpha) and to TensorBoard; the final table goes to stdout.
"""
from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable

import jax
from absl import logging

from specdec_jax import distributed, lock, logs, paths
from specdec_jax.metrics import acceptance_stats, machine
from specdec_jax.metrics.tensorboard import RunWriter, run_dir
from specdec_jax.metrics.records import BatchRecord
from specdec_jax.runner import autotune, collect, decode, keys, measure, pipeline
from specdec_jax.runner.run_config import RunConfig
from specdec_jax.runner.store import ResultStore


class Progress:
  """Shows and records per-batch progress of each run (point) of the output directory: a tqdm bar
  per temperature (examples, rate, ETA, tokens/s, running alpha) where stderr is a terminal, else
  a log line every `progress_every_s`; the last batch's line is always logged; TensorBoard gets
  every batch."""

  def __init__(self, output_dir: str, resolved, cfg: RunConfig, log: Callable[[str], None]):
    self.output_dir, self.resolved, self.cfg, self.log = output_dir, resolved, cfg, log
    self.writers: dict[str, RunWriter] = {}
    self.totals: dict[str, list] = {}
    self.rates: dict[str, list[float]] = {}  # key -> [tokens, seconds] so far (this process)
    self.bars: dict[str, object] = {}
    self.t0 = time.perf_counter()
    self.last_log = -float("inf")

  def _bar(self, group: str, total: int, done: int):
    if group not in self.bars:
      self.bars[group] = logs.bar(f"decode {group}", total=total, unit="ex", initial=done)
    return self.bars[group]

  def _writer(self, run: str) -> RunWriter:
    if run not in self.writers:
      self.writers[run] = RunWriter(run_dir(self.output_dir, run))
    return self.writers[run]

  def _running(self, key: str, rec) -> float:
    """Tokens per second over this process's batches so far: the log line's figure. (The
    per-batch rate goes to TensorBoard, where the series shows it; one batch's rate in a log
    line read as the run's.)"""
    tokens_seconds = self.rates.setdefault(key, [0, 0.0])
    tokens_seconds[0] += rec.emitted
    tokens_seconds[1] += rec.seconds
    return tokens_seconds[0] / max(tokens_seconds[1], 1e-9)

  def __call__(self, *, temperature: float, done: int, total: int,
               record: BatchRecord | None, resumed: bool) -> None:
    group = keys.group(temperature)
    bar = self._bar(group, total, done if resumed else 0)
    if resumed:
      self.log(f"[{group}] resuming: {done}/{total} examples already on disk")
      return
    elapsed = time.perf_counter() - self.t0
    parts = [f"[{group}] {done}/{total} examples ({elapsed:.1f}s); running tok/s"]
    short = []  # the bar's postfix
    ar = record.autoregressive
    if ar is not None:
      ar_rate = self._running(keys.autoregressive(temperature), ar)
      parts.append(f"AR {ar_rate:.0f}")
      short.append(f"AR {ar_rate:.0f} tok/s")
    for key, rec in record.points.items():
      hist = self.totals.setdefault(key, [])
      hist.append(rec.counters)
      running = acceptance_stats.summarize(acceptance_stats.merge(hist))
      tok_s = rec.emitted / max(rec.seconds, 1e-9)
      alpha = f"{running['alpha']:.3f}" if running["alpha"] is not None else "-"
      rate = self._running(key, rec)
      parts.append(f"{key}: {rate:.0f}, running alpha {alpha}")
      short.append(f"spec {rate:.0f} tok/s, alpha {alpha}")
      self._writer(key).progress(done, {"examples_done": done, "tokens_per_s": tok_s,
                                        "running_alpha": running["alpha"],
                                        "running_acceptance_rate": running["acceptance_rate"]})
    if not record.points and ar is not None:
      self._writer(keys.autoregressive(temperature)).progress(
          done, {"examples_done": done, "tokens_per_s": ar.emitted / max(ar.seconds, 1e-9)})
    bar.set_postfix_str("; ".join(short), refresh=False)
    bar.update(done - bar.n)
    if done >= total:
      bar.close()
    # A log line every `progress_every_s` where no bar shows (and the last batch's, always).
    if done >= total or (bar.disable and elapsed - self.last_log >= self.cfg.progress_every_s):
      self.last_log = elapsed
      self.log("; ".join(parts))

  def close(self) -> None:
    for b in self.bars.values():
      b.close()
    for w in self.writers.values():
      w.close()


def execute(cfg: RunConfig, output_dir: str, *, config_text: str | None = None,
            log: Callable[[str], None] = logging.info, echo: Callable[[str], None] = print
            ) -> list[dict]:
  """Runs `cfg`, writing results under `output_dir`; returns the metrics objects.

  With `cfg.mesh` (gin/mesh/*.gin) the whole run happens on that one mesh, set as the context
  mesh (`jax.set_mesh`): models that carry rules then constrain activations and caches to it in
  every jitted program of the run, the cost calibration's included.
  """
  paths.check_writable(output_dir, "run results")  # the shipped assets are read-only
  if cfg.mesh is None:
    return _execute(cfg, output_dir, config_text=config_text, log=log, echo=echo, mesh=None)
  from specdec_jax import sharding  # pylint: disable=import-outside-toplevel
  mesh = sharding.make_mesh(cfg.mesh)
  with jax.set_mesh(mesh):
    return _execute(cfg, output_dir, config_text=config_text, log=log, echo=echo, mesh=mesh)


def _execute(cfg: RunConfig, output_dir: str, *, config_text: str | None,
             log: Callable[[str], None], echo: Callable[[str], None], mesh) -> list[dict]:
  if not distributed.is_main_process():
    return _follow(cfg, output_dir, log, mesh)
  with lock.hold(output_dir, "run"):
    return _lead(cfg, output_dir, config_text=config_text, log=log, echo=echo, mesh=mesh)


def _lead(cfg: RunConfig, output_dir: str, *, config_text: str | None,
          log: Callable[[str], None], echo: Callable[[str], None], mesh) -> list[dict]:
  """Process 0 (the only one of a single-host run): decodes, writes, reports."""
  t_start = time.perf_counter()
  store = ResultStore(output_dir, cfg.fingerprint(), resume=cfg.resume)
  distributed.agree(store.snapshot())  # what a resumed run has done, for the other processes
  stored = collect.finished_metrics(store, output_dir)
  if stored is not None:  # a finished run: its results as they are, nothing re-measured
    _report(stored, output_dir, echo, note="stored results of a finished run (same "
            "configuration); --gin.RunConfig.resume=False runs it again")
    return stored
  if config_text is not None:
    with open(os.path.join(output_dir, "config.gin"), "w") as f:
      f.write(config_text)
    w = RunWriter(run_dir(output_dir, ""))
    w.text("config", "\n".join("    " + line for line in config_text.splitlines()))
    w.close()
  # the machine as this run finds it (records read it); a fresh start forgets earlier segments
  machine.note_run_start(output_dir, fresh=store.fresh)
  loaded = pipeline.load(cfg, mesh)
  log(f"target {loaded.target_name} ({loaded.target.kind}, vocab "
      f"{loaded.target.vocab_size}); {len(loaded.prompts.examples)} examples, prompt width "
      f"{loaded.prompts.width}; mode {cfg.mode}")
  resolved, costs = autotune.resolve_points(cfg, measure.Calibration(cfg, loaded, log), store,
                                            log)
  progress = Progress(output_dir, resolved, cfg, log)
  try:
    decode.decode_all(cfg, loaded, resolved, store, progress)
  finally:
    progress.close()
  metrics = collect.collect(cfg, loaded, store, resolved, costs)
  collect.write_outputs(cfg, output_dir, metrics)
  machine.note_run_end(output_dir)
  store.remember("finished", "metrics", collect.METRICS_FILE)  # a re-run prints, measures nothing
  _report(metrics, output_dir, echo, note=f"wrote metrics.json, predictions.jsonl, config.gin, "
          f"machine.json "
          f"({time.perf_counter() - t_start:.0f} s)")
  return metrics


def _report(metrics: list[dict], output_dir: str, echo: Callable[[str], None], note: str
            ) -> None:
  """The printed summary (metrics.report.summary, within 100 columns), the sweep's notes, where
  the results are and how to see them in TensorBoard."""
  from specdec_jax.metrics.report import summary, wrap  # pylint: disable=import-outside-toplevel
  for line in summary(metrics):
    echo(line)
  for text in collect.sweep_notes(metrics):
    for line in wrap(text):
      echo(line)
  for line in wrap(f"{output_dir}: {note}"):
    echo(line)
  echo(f"  TensorBoard: tensorboard --logdir {output_dir}/tensorboard")


def _follow(cfg: RunConfig, output_dir: str, log: Callable[[str], None], mesh) -> list[dict]:
  """A process other than 0 of a multi-host run: the same programs on its own rows, nothing
  written. Its store lives in a scratch directory and starts from process 0's (resume)."""
  with tempfile.TemporaryDirectory(prefix="specdec_follower_") as scratch:
    store = ResultStore(scratch, cfg.fingerprint(), resume=False)
    store.restore(distributed.agree(None))
    if store.recall("finished", "metrics"):  # process 0 prints the stored results
      return []
    loaded = pipeline.load(cfg, mesh)
    resolved, _ = autotune.resolve_points(cfg, measure.Calibration(cfg, loaded, log), store, log)
    decode.decode_all(cfg, loaded, resolved, store, lambda **_: None)
  log(f"process {distributed.process_index()}: done; process 0 writes {output_dir}")
  return []
