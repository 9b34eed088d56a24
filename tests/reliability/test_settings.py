"""Faults the framework survives: numeric settings that are not finite or out of range, refused at
the front doors before anything is loaded or written.

Before: `--gin.TEMPERATURE=1e999` passed both checks (`t < 0`, `not t >= 0`), top-k / top-p were
then ignored or probabilities became NaN and the run exited 0 with alpha NaN in metrics.json;
check_exactness accepted num_samples=0, chunk=0 and an example index past the task.
(Training settings: test_training_faults.py.)
"""
import gin
import pytest

from specdec_jax import check_exactness as ce
from specdec_jax import run
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.runner.run_config import RunConfig

SMOKE = "configs/local/smoke.gin"

pytestmark = pytest.mark.usefixtures("clean_gin")


@pytest.mark.parametrize("binding,match", [
    ("TEMPERATURE = 1e999", "TEMPERATURE must be a finite number"),
    ("TEMPERATURE = -0.5", "TEMPERATURE must be a finite number"),
    ("TOP_P = 0.0", "TOP_P must be in"),
    ("TOP_K = -1", "TOP_K must be an integer"),
    ("RunConfig.auto_min_speedup = 1e999", "auto_min_speedup must be a finite number"),
    ("MAX_DECODE_LENGTH = 0", "MAX_DECODE_LENGTH must be an integer >= 1"),
    ("GAMMA = -2", "GAMMA must be an int >= 0")])
def test_a_bad_run_setting_is_refused_and_nothing_is_written(tmp_path, binding, match):
  out = tmp_path / "run"
  with pytest.raises(ValueError, match=match):
    run.run([SMOKE], str(out), [binding])
  assert not out.exists()


def test_sampling_refuses_non_finite_numbers():
  for bad in (dict(temperature=float("nan")), dict(temperature=float("inf")),
              dict(top_p=float("nan")), dict(top_p=1.5), dict(top_k=-1)):
    with pytest.raises(ValueError):
      SamplingConfig(**bad)
  with pytest.raises(ValueError, match="TEMPERATURE"):
    RunConfig(temperature=[0.0, float("nan")])


@pytest.mark.parametrize("field,value", [("num_samples", 0), ("chunk", 0), ("num_tokens", 0),
                                         ("example", -1), ("significance", 1.0)])
def test_check_exactness_validates_its_flags(field, value):
  with pytest.raises(ValueError, match=field):
    ce.CheckOptions(**{field: value})


def test_check_exactness_refuses_an_example_past_the_task():
  with pytest.raises(ValueError, match="past the task's last example"):
    ce.run_check([SMOKE], ["NUM_EXAMPLES = 2"], opts=ce.CheckOptions(
        num_samples=10, num_tokens=1, example=10 ** 6, chunk=10))
  gin.clear_config()
