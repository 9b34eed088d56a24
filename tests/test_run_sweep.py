"""A gamma sweep: metrics.json is a list, the plots exist, and GAMMA='auto' is printed beside the
swept optimum (with gamma 0, plain autoregressive decoding, allowed)."""
import json
import os

import pytest

from specdec_jax import run


pytestmark = pytest.mark.usefixtures("clean_gin")


@pytest.mark.slow
def test_sweep_smoke(tmp_path, capsys):
  out = str(tmp_path)
  metrics = run.run(["configs/ci/sweep_smoke.gin"], out, ["TEMPERATURE = [0.0]"])
  assert [(m["gamma_auto"], m["temperature"]) for m in metrics] == [
      (False, 0.0), (False, 0.0), (True, 0.0)]
  auto = metrics[-1]
  assert 0 <= auto["gamma"] <= 3 and auto["auto_calibration_alpha"] is not None
  # The lone-extend curve covers every gamma; the loop-timed curve the candidates it kept.
  assert set(auto["auto_lone_extend_speedup"]) == {"0", "1", "2", "3"}
  assert "0" in auto["auto_predicted_speedup"]
  assert set(auto["auto_predicted_speedup"]) <= set(auto["auto_lone_extend_speedup"])
  for fixed in metrics[:2]:  # one device: the fixed rows are predicted from their timed loops
    assert fixed["speedup_predicted_from"] == "loop"
    assert fixed["iteration_ms"] > 0 and fixed["ar_iteration_ms"] > 0
    assert fixed["c"] is not None and fixed["v_curve"] is not None  # contract keys stay
  if auto["gamma"] == 0:  # nothing predicted to help: the "speculative" run is the AR loop
    assert auto["speedup_predicted"] == 1.0
    assert auto["speedup"] is None and auto["speedup_not_measured"]  # not a 1.00 "measured"
  with open(os.path.join(out, "metrics.json")) as f:
    assert isinstance(json.load(f), list)
  for name in ("speedup_vs_gamma", "alpha_vs_gamma", "predicted_vs_measured"):
    assert os.path.getsize(os.path.join(out, "plots", name + ".png")) > 1000
  printed = capsys.readouterr().out
  assert "swept optimum gamma" in printed and "GAMMA='auto' chose" in printed
  assert "predicted" in printed.splitlines()[0] or "predicted" in printed
