"""TensorBoard event files for a run (tensorboardX: clu and flax's writers import TensorFlow).

Layout: OUTPUT_DIR/tensorboard/ holds the operative gin config as text; each speculative point
(or the autoregressive run) writes to its own subdirectory, so TensorBoard overlays the points of
a sweep as separate runs. Per batch: running progress (examples done, tokens/s, running alpha);
at the end: every published metric, acceptance per draft position, the accepted-length
histogram and the run's configuration as HParams (config -> alpha, speedup, tokens per call). `read_scalars` reads them back with TensorBoard's own `EventAccumulator` (tests, tools).
"""
from __future__ import annotations

import itertools
import os
import re
from collections.abc import Mapping
from typing import Any

SCALARS = ("alpha", "acceptance_rate", "tokens_per_target_call", "c", "v", "speedup",
           "speedup_predicted", "ar_ms_per_token", "spec_ms_per_token", "greedy_match_rate",
           "gamma", "mean_gamma")
# What TensorBoard's HParams view lists beside each run's configuration (tags `final` writes).
HPARAM_METRICS = ("metrics/alpha", "metrics/speedup", "metrics/tokens_per_target_call",
                  "metrics/speedup_predicted", "metrics/acceptance_rate",
                  "metrics/spec_ms_per_token", "metrics/ar_ms_per_token")


_WRITER_IDS = itertools.count()


def run_dir(output_dir: str, run: str) -> str:
  return os.path.join(output_dir, "tensorboard", re.sub(r"[^A-Za-z0-9_.=,-]+", "_", run))


class RunWriter:
  """A tensorboardX writer for one run (point) of the output directory."""

  def __init__(self, log_dir: str):
    from tensorboardX import SummaryWriter
    self.log_dir = log_dir
    # tensorboardX names event files by the second they were opened; two writers of one
    # directory within a second (progress, then final metrics) would share, and clobber, a file.
    suffix = f".{os.getpid()}.{next(_WRITER_IDS):06d}"
    self._w = SummaryWriter(log_dir, filename_suffix=suffix)

  @property
  def writer(self):
    return self._w

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    """Scalars under their own tags (the trainer's loss, learning rate, valid/...)."""
    for k, v in values.items():
      self._w.add_scalar(k, float(v), step)
    self._w.flush()

  def progress(self, step: int, values: Mapping[str, float | None]) -> None:
    for k, v in values.items():
      if v is not None:
        self._w.add_scalar(f"progress/{k}", float(v), step)
    self._w.flush()

  def final(self, metrics: Mapping[str, Any], step: int) -> None:
    """Writes the published metrics of one point at `step` (the number of examples)."""
    for k in SCALARS:
      if metrics.get(k) is not None:
        self._w.add_scalar(f"metrics/{k}", float(metrics[k]), step)
    for i, a in enumerate(metrics.get("accepts_per_position") or []):
      if a is not None:
        self._w.add_scalar(f"acceptance_per_position/{i + 1}", float(a), step)
    quality = metrics.get("quality") or {}
    for side in ("autoregressive", "speculative"):
      for name, value in (quality.get(side) or {}).items():
        self._w.add_scalar(f"quality/{side}/{name}", float(value), step)
    hist = metrics.get("accepted_length_hist") or []
    if sum(hist) > 0:
      self.histogram("accepted_length", hist, step)
    self._w.flush()

  def hparams(self, config: Mapping[str, bool | int | float | str]) -> None:
    """The run's configuration for TensorBoard's HParams view, against `HPARAM_METRICS` (the
    scalars `final` writes in this same directory), so the points of a sweep, or runs of several
    output directories under one --logdir, compare side by side in one table. Every run writes
    the same hparam names and metric tags, so whichever run's experiment summary the view reads
    describes them all. Values must be bool, int, float or str (no None)."""
    from tensorboardX.summary import hparams  # pylint: disable=import-outside-toplevel
    exp, start, end = hparams(dict(config), {tag: 0.0 for tag in HPARAM_METRICS})
    for summary in (exp, start, end):
      self._w.file_writer.add_summary(summary)
    self._w.flush()

  def histogram(self, tag: str, counts, step: int) -> None:
    """A histogram of integer values 0..len(counts)-1 given their counts."""
    total = sum(counts)
    values_sum = sum(i * c for i, c in enumerate(counts))
    squares = sum(i * i * c for i, c in enumerate(counts))
    nonzero = [i for i, c in enumerate(counts) if c]
    self._w.add_histogram_raw(tag, min=float(min(nonzero)), max=float(max(nonzero)),
                              num=int(total), sum=float(values_sum), sum_squares=float(squares),
                              bucket_limits=[i + 0.5 for i in range(len(counts))],
                              bucket_counts=[int(c) for c in counts], global_step=step)

  def text(self, tag: str, text: str, step: int = 0) -> None:
    self._w.add_text(tag, text, step)
    self._w.flush()

  def close(self) -> None:
    self._w.close()


def read_scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value), ...]} of one event directory, via tensorboard's EventAccumulator."""
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  acc = EventAccumulator(log_dir, size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
  acc.Reload()
  return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
