"""Runs compare side by side in TensorBoard's HParams view; plots say what they measure (issue 31).

Why: summary metrics were single points with no HParams view, so sweeps and drafts could not be
compared side by side; plots had no title (task, temperature, n) and no error bars.
"""
import pytest
from matplotlib.container import ErrorbarContainer
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata

from specdec_jax.metrics import plots
from specdec_jax.metrics.tensorboard import HPARAM_METRICS, RunWriter
from specdec_jax.runner import collect
from specdec_jax.runner.run_config import RunConfig


def _m(gamma, **kw):
  m = dict(task="translate_en_de", target="t5_target", draft="t5_draft_small", temperature=0.0,
           gamma=gamma, gamma_auto=False, num_examples=100, speedup=1.0 + 0.1 * gamma,
           speedup_interval95=[0.9 + 0.1 * gamma, 1.1 + 0.1 * gamma],
           speedup_predicted=1.05 + 0.1 * gamma, alpha=0.6, alpha_interval95=[0.55, 0.65],
           tokens_per_target_call=2.0, acceptance_rate=0.5, run=f"g{gamma}")
  m.update(kw)
  return m


def test_every_row_writes_its_config_as_hparams(tmp_path):
  cfg = RunConfig()
  rows = [_m(3), dict(_m(0, draft=None, speedup=None), gamma=None), _m(8, adaptive={"gamma_max": 8})]
  configs = [collect.hparams(cfg, m) for m in rows]
  assert [c["gamma_setting"] for c in configs] == ["3", "-", "adaptive"]
  assert all(set(c) == set(configs[0]) for c in configs)  # the same names on every row
  for c in configs:  # the same type per name, never None
    assert all(type(c[k]) is type(configs[0][k]) for k in c), c
  w = RunWriter(str(tmp_path / "g3"))
  w.final(rows[0], step=100)
  w.hparams(configs[0])
  w.close()
  acc = EventAccumulator(str(tmp_path / "g3"), size_guidance={"tensors": 0})
  acc.Reload()
  content = acc.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content
  start = metadata.parse_session_start_info_plugin_data(content)
  assert start.hparams["draft"].string_value == "t5_draft_small"
  assert start.hparams["temperature"].number_value == 0.0
  assert start.hparams["gamma"].number_value == 3
  experiment = metadata.parse_experiment_plugin_data(
      acc.SummaryMetadata(metadata.EXPERIMENT_TAG).plugin_data.content)
  tags = {i.name.tag for i in experiment.metric_infos}
  assert {"metrics/alpha", "metrics/speedup", "metrics/tokens_per_target_call"} <= tags
  assert tags == set(HPARAM_METRICS)
  scalars = acc.Tags()["scalars"]
  assert {"metrics/alpha", "metrics/speedup", "metrics/tokens_per_target_call"} <= set(scalars)


@pytest.mark.parametrize("plot", ["speedup_vs_gamma", "alpha_vs_gamma", "predicted_vs_measured"])
def test_plots_have_titles_and_error_bars(tmp_path, plot, monkeypatch):
  seen = {}
  real_save = plots._save

  def spy(fig, path):
    ax = fig.axes[0]
    seen["title"] = ax.get_title()
    seen["bars"] = [c for c in ax.containers if isinstance(c, ErrorbarContainer) and c.has_yerr]
    return real_save(fig, path)
  monkeypatch.setattr(plots, "_save", spy)
  metrics = [_m(g) for g in (1, 2, 4)] + [_m(g, draft="t5_draft_base") for g in (1, 2, 4)]
  getattr(plots, plot)(metrics, str(tmp_path / "p.png"))
  for text in ("translate_en_de", "t5_target", "T = 0", "n = 100"):
    assert text in seen["title"], seen["title"]
  assert seen["bars"], "no error bars"
