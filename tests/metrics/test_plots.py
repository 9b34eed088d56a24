"""Sweep plots are written as PNG files (specdec_jax/metrics/plots.py)."""
from specdec_jax.metrics import plots


def _m(draft, gamma, speedup, predicted, alpha, auto=False):
  return dict(draft=draft, temperature=0.0, gamma=gamma, speedup=speedup,
              speedup_predicted=predicted, alpha=alpha, gamma_auto=auto)


def test_plot_sweep_writes_pngs(tmp_path):
  metrics = [_m("small", g, 1 + 0.2 * g, 1 + 0.25 * g, 0.7) for g in (1, 2, 3)]
  metrics += [_m("base", g, 1 + 0.1 * g, 1 + 0.1 * g, 0.8) for g in (1, 2, 3)]
  metrics.append(_m("small", 2, 1.4, 1.5, 0.7, auto=True))
  paths = plots.plot_sweep(metrics, str(tmp_path))
  assert len(paths) == 3
  for p in paths:
    with open(p, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_speedup_plot_has_a_legend(tmp_path):
  import matplotlib.pyplot as plt
  captured = {}
  real_save = plots._save

  def spy(fig, path):
    out = real_save(fig, path)
    captured["legend"] = fig.axes[0].get_legend()
    return out
  plots._save = spy
  try:
    plots.speedup_vs_gamma([_m("small", g, 1.0, 1.1, 0.7) for g in (1, 2)],
                           str(tmp_path / "s.png"))
  finally:
    plots._save = real_save
  assert captured["legend"] is not None
  plt.close("all")
