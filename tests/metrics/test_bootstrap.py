"""The bootstrap interval of a ratio of sums: covers the truth at its level, narrows with n."""
import numpy as np
import pytest

from specdec_jax.metrics import bootstrap


def test_interval_covers_the_population_ratio_about_95_percent_of_the_time():
  """Prompts drawn from a population (per-prompt seconds and per-prompt speedups that vary):
  the interval from 60 of them holds the population's ratio of sums at about its level."""
  rng = np.random.default_rng(0)
  ar_pop = rng.gamma(4.0, 10.0, size=100_000)
  spec_pop = ar_pop / rng.normal(1.5, 0.3, size=ar_pop.size).clip(0.5)
  truth = ar_pop.sum() / spec_pop.sum()
  hits, trials = 0, 200
  for t in range(trials):
    take = rng.integers(0, ar_pop.size, size=60)
    lo, hi = bootstrap.ratio_interval(ar_pop[take], spec_pop[take], samples=500, seed=t)
    hits += lo <= truth <= hi
  assert 0.88 <= hits / trials <= 0.99


def test_interval_contains_the_point_estimate_and_narrows_with_more_units():
  rng = np.random.default_rng(1)
  widths = []
  for n in (20, 320):
    ar = rng.gamma(4.0, 10.0, size=n)
    spec = ar / rng.normal(1.3, 0.3, size=n).clip(0.5)
    lo, hi = bootstrap.ratio_interval(ar, spec)
    assert lo <= ar.sum() / spec.sum() <= hi
    widths.append(hi - lo)
  assert widths[1] < widths[0] / 2


def test_degenerate_inputs():
  assert bootstrap.ratio_interval([1.0], [2.0]) is None
  with pytest.raises(ValueError, match="> 0"):
    bootstrap.ratio_interval([1.0, 2.0], [0.0, 1.0])
  with pytest.raises(ValueError, match="paired"):
    bootstrap.ratio_interval([1.0, 2.0], [1.0])
  lo, hi = bootstrap.mean_interval([0.5, 0.7, 0.9, 0.6])
  assert 0.5 <= lo <= 0.675 <= hi <= 0.9


def test_paired_ratio_of_ratios_is_tighter_than_its_parts_and_covers_the_point():
  """Two decodes of the same prompts whose per-prompt tokens per call move together (hard prompts
  are hard for both): the paired interval of their ratio holds the point estimate and is narrower
  than the quotient of the two separate intervals' extremes."""
  rng = np.random.default_rng(2)
  tokens = rng.integers(10, 60, size=100).astype(float)
  ease = rng.uniform(1.2, 3.5, size=100)                   # tokens per call of the chain
  chain_calls = np.ceil(tokens / ease)
  tree_calls = np.ceil(tokens / (1.35 * ease))             # the tree: ~1.35x per prompt
  lo, hi = bootstrap.ratio_of_ratios_interval(tokens, tree_calls, tokens, chain_calls)
  point = (tokens.sum() / tree_calls.sum()) / (tokens.sum() / chain_calls.sum())
  assert lo <= point <= hi
  tree_lo, tree_hi = bootstrap.ratio_interval(tokens, tree_calls)
  chain_lo, chain_hi = bootstrap.ratio_interval(tokens, chain_calls)
  assert hi - lo < tree_hi / chain_lo - tree_lo / chain_hi
  assert bootstrap.ratio_of_ratios_interval([1.0], [1.0], [1.0], [1.0]) is None
  with pytest.raises(ValueError, match="paired"):
    bootstrap.ratio_of_ratios_interval([1.0, 2.0], [1.0, 1.0], [1.0], [1.0])
