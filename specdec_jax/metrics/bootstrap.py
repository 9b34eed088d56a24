"""Bootstrap intervals over prompts: how far a measured ratio could move on other prompts.

Why: a speedup measured on one set of prompts is a ratio of two sums of wall times, and prompts
differ (long and short outputs, easy and hard spans for the draft). The spread of the ratio over
prompts, not over timing repeats, is what decides whether a figure would hold on new prompts of
the same task; the percentile bootstrap over the measured units (prompts, or batches of prompts
where a batch is timed as one) gives that spread without a distributional assumption. A unit is
resampled whole, so numerator and denominator stay paired.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SAMPLES = 2000


def ratio_interval(numerators: Sequence[float], denominators: Sequence[float], *,
                   samples: int = SAMPLES, level: float = 0.95, seed: int = 0
                   ) -> tuple[float, float] | None:
  """Percentile bootstrap interval of sum(numerators) / sum(denominators) over paired units.

  None with fewer than two units (no spread to estimate). Units whose resampled denominator sums
  to 0 cannot occur unless every denominator is 0, which is refused.
  """
  num = np.asarray(numerators, np.float64)
  den = np.asarray(denominators, np.float64)
  if num.shape != den.shape or num.ndim != 1:
    raise ValueError(f"paired 1-D sequences needed, got shapes {num.shape} and {den.shape}")
  if num.size < 2:
    return None
  if not np.all(den > 0):
    raise ValueError("every denominator must be > 0 (a unit timed at 0 s is not a measurement)")
  idx = np.random.default_rng(seed).integers(0, num.size, size=(samples, num.size))
  ratios = num[idx].sum(axis=1) / den[idx].sum(axis=1)
  tail = 100.0 * (1.0 - level) / 2.0
  lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
  return float(lo), float(hi)


def mean_interval(values: Sequence[float], *, samples: int = SAMPLES, level: float = 0.95,
                  seed: int = 0) -> tuple[float, float] | None:
  """Percentile bootstrap interval of the mean of `values` (e.g. alpha per prompt)."""
  values = np.asarray(values, np.float64)
  return ratio_interval(values, np.ones_like(values), samples=samples, level=level, seed=seed)


def ratio_of_ratios_interval(a_num: Sequence[float], a_den: Sequence[float],
                             b_num: Sequence[float], b_den: Sequence[float], *,
                             samples: int = SAMPLES, level: float = 0.95, seed: int = 0
                             ) -> tuple[float, float] | None:
  """Percentile bootstrap interval of (sum a_num / sum a_den) / (sum b_num / sum b_den), the four
  sequences paired by unit (two decodes of the same prompts: e.g. tokens per target call of a
  tree over a chain's). Resampling the prompts once for both keeps the comparison paired, which
  is what makes it tighter than two separate intervals."""
  arrays = [np.asarray(x, np.float64) for x in (a_num, a_den, b_num, b_den)]
  if len({x.shape for x in arrays}) != 1 or arrays[0].ndim != 1:
    raise ValueError(f"four paired 1-D sequences needed, got shapes {[x.shape for x in arrays]}")
  if arrays[0].size < 2:
    return None
  if not all(np.all(x > 0) for x in (arrays[1], arrays[3])) or not np.any(arrays[2] > 0):
    raise ValueError("denominators must be > 0 and b's numerators not all 0")
  idx = np.random.default_rng(seed).integers(0, arrays[0].size, size=(samples, arrays[0].size))
  a_num, a_den, b_num, b_den = (x[idx].sum(axis=1) for x in arrays)
  ratios = (a_num / a_den) / (b_num / b_den)
  tail = 100.0 * (1.0 - level) / 2.0
  lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
  return float(lo), float(hi)
