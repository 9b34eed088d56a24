"""Progress with rate and ETA where a run spends its minutes (issue 31).

Why: the default run spent ~75 s calibrating and compiling with nothing on the screen, and the
exactness check ran 7 minutes silent. Calibration (lone extend costs, the loops), decoding and
the exactness check's sampling each drive a tqdm bar (`logs.bar`); the bars are captured here
(stderr is no terminal under pytest, where they would be off) and must reach their totals.
"""
import io

import gin
import pytest
from absl import logging as absl_logging
from tqdm import tqdm

from specdec_jax import logs, run, timing

SMOKE = "configs/local/smoke.gin"
BINDINGS = ["NUM_EXAMPLES = 4", "BATCH_SIZE = 2", "MAX_DECODE_LENGTH = 8", "RunConfig.repeats = 1"]

pytestmark = pytest.mark.usefixtures("clean_gin")


@pytest.fixture
def bars(monkeypatch):
  """Every bar a run opens, enabled and writing to a buffer: [(desc, bar)]."""
  made = []

  def bar(desc, total=None, unit="it", initial=0):
    b = tqdm(total=total, desc=desc, unit=unit, initial=initial, file=io.StringIO(),
             disable=False, mininterval=0)
    made.append((desc, b))
    return b
  monkeypatch.setattr(logs, "bar", bar)
  return made


def test_interleaved_ticks_to_its_total():
  seen = []
  timing.interleaved({"a": lambda: 1, "b": lambda: 2}, 3, tick=lambda d, t: seen.append((d, t)))
  assert seen == [(i, 8) for i in range(1, 9)]  # 2 warm-ups + 3 rounds of 2 samples


def test_one_call_samples_reuse_the_probe_as_round_zero():
  """A program slower than a sample (a whole request's decode) runs warm-up + `repeats` times,
  not warm-up + probe + `repeats`; one fast program among them keeps the probe separate."""
  import time as time_lib
  ran = {"slow_a": 0, "slow_b": 0, "fast": 0}

  def program(name, seconds):
    def call():
      ran[name] += 1
      time_lib.sleep(seconds)
      return name
    return call
  seen = []
  results, rounds = timing.interleaved_rounds(
      {"slow_a": program("slow_a", 0.03), "slow_b": program("slow_b", 0.03)}, 3,
      min_sample_s=0.02, tick=lambda d, t: seen.append((d, t)))
  assert ran == {"slow_a": 4, "slow_b": 4, "fast": 0}
  assert {n: len(r) for n, r in rounds.items()} == {"slow_a": 3, "slow_b": 3}
  assert all(r >= 0.03 for rs in rounds.values() for r in rs)
  assert seen == [(i, 8) for i in range(1, 9)] and results == {"slow_a": "slow_a",
                                                                 "slow_b": "slow_b"}
  ran.update(slow_a=0, fast=0)
  _, rounds = timing.interleaved_rounds(
      {"slow_a": program("slow_a", 0.03), "fast": program("fast", 0.0)}, 2, min_sample_s=0.02)
  assert ran["slow_a"] == 1 + 1 + 2 and ran["fast"] > 1 + 1 + 2  # its samples take many calls
  assert {n: len(r) for n, r in rounds.items()} == {"slow_a": 2, "fast": 2}


def test_bar_is_off_below_the_default_verbosity():
  old = absl_logging.get_verbosity()
  try:
    absl_logging.set_verbosity(absl_logging.WARNING)
    assert logs.bar("x", total=3).disable
  finally:
    absl_logging.set_verbosity(old)


@pytest.mark.slow  # a whole run (~18 s); the bars themselves are tested above
def test_run_shows_calibration_and_decoding_progress(tmp_path, bars):
  run.run([SMOKE], str(tmp_path / "run"), BINDINGS)
  by_desc = {d: b for d, b in bars}
  assert {"calibrate: extend costs", "calibrate: loops at T=0", "decode temperature=0"} <= set(
      by_desc), list(by_desc)
  for desc, b in bars:
    assert b.total and b.n == b.total, (desc, b.n, b.total)  # every bar reached its end
  text = by_desc["decode temperature=0"].fp.getvalue()
  assert "ex/s" in text or "s/ex" in text  # a rate
  assert "alpha" in text and "AR" in text  # the running numbers beside it


def test_exactness_check_shows_sampling_progress(bars):
  from specdec_jax import check_exactness
  opts = check_exactness.CheckOptions(num_samples=300, num_tokens=1, chunk=100, bootstrap=10)
  gin.clear_config()
  check_exactness.run_check([SMOKE], ["TEMPERATURE = 1.0"], opts=opts)
  (b,) = [b for d, b in bars if d.startswith("exactness")]
  assert b.n == b.total == 600  # both methods' samples


def _counters(emitted, accepted, calls, gamma=3):
  return {"drafted": calls * gamma, "accepted": accepted, "emitted": emitted,
          "target_calls": calls, "beta_sum": 0.0, "beta_count": 0, "iterations": calls,
          "accepts_per_position": [accepted, 0, 0], "accepted_length_hist": [calls - accepted,
                                                                            accepted, 0, 0]}


def test_log_line_gives_running_rates_not_the_last_batch(tmp_path, bars):
  """The line beside 'running alpha' read as the run's rate while it was one example's: a long
  reply after short ones showed 'AR 39, spec 44 tok/s' where the totals gave 1.66x."""
  import types

  from specdec_jax.metrics.records import BatchRecord, ProgramRecord
  from specdec_jax.runner import experiment
  lines = []
  progress = experiment.Progress(str(tmp_path), None, types.SimpleNamespace(progress_every_s=0),
                                 lines.append)
  key = "draft=prompt_lookup,gamma=3,temperature=0"
  for i, (ar_s, spec_s) in enumerate([(1.0, 0.5), (3.0, 1.5)]):  # 100 tokens each batch
    record = BatchRecord("temperature=0", (i,),
                         {key: ProgramRecord(spec_s, _counters(100, 50, 50), gamma=3)},
                         ProgramRecord(ar_s, _counters(100, 0, 100, gamma=0)))
    progress(temperature=0.0, done=i + 1, total=2, record=record, resumed=False)
  progress.close()
  (line,) = lines  # the last batch's line (a bar shows the others)
  assert "AR 50" in line and f"{key}: 100," in line, line  # 200/4 s and 200/2 s, not 33 / 67
  (bar,) = [b for d, b in bars if d == "decode temperature=0"]
  assert "AR 50 tok/s" in bar.fp.getvalue() and "spec 100 tok/s" in bar.fp.getvalue()
