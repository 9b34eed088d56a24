"""TensorBoard events are readable by TensorBoard's own EventAccumulator."""
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from specdec_jax.metrics.tensorboard import RunWriter, read_scalars, run_dir


def test_final_metrics_read_back(tmp_path):
  d = run_dir(str(tmp_path), "draft=small,gamma=3,temperature=0")
  w = RunWriter(d)
  w.progress(4, {"examples_done": 4, "running_alpha": 0.5, "tokens_per_s": None})
  w.final({"alpha": 0.7, "acceptance_rate": 0.6, "speedup": 1.5, "speedup_predicted": 1.6,
           "c": 0.1, "v": 1.2, "tokens_per_target_call": 2.5, "ar_ms_per_token": 3.0,
           "spec_ms_per_token": 2.0, "greedy_match_rate": 1.0,
           "accepts_per_position": [0.9, 0.6, 0.3], "accepted_length_hist": [1, 2, 0, 4],
           "quality": {"metric": "bleu", "autoregressive": {"bleu": 20.0},
                       "speculative": {"bleu": 20.0}}}, step=8)
  w.text("config", "    MODE = 'benchmark'")
  w.close()
  scalars = read_scalars(d)
  assert scalars["metrics/alpha"] == [(8, 0.699999988079071)]
  assert scalars["progress/running_alpha"][0][0] == 4
  assert "acceptance_per_position/3" in scalars and "quality/speculative/bleu" in scalars
  acc = EventAccumulator(d)
  acc.Reload()
  assert "accepted_length" in acc.Tags()["histograms"]
  hist = acc.Histograms("accepted_length")[0].histogram_value
  assert hist.num == 7


def test_two_writers_of_one_run_both_survive(tmp_path):
  """Progress and final metrics come from two writers opened within a second of each other."""
  d = run_dir(str(tmp_path), "run")
  first = RunWriter(d)
  first.progress(1, {"running_alpha": 0.5})
  first.close()
  second = RunWriter(d)
  second.final({"alpha": 0.6}, step=2)
  second.close()
  scalars = read_scalars(d)
  assert "progress/running_alpha" in scalars and "metrics/alpha" in scalars
