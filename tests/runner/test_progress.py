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
