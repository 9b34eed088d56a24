"""Exactness statistics: is a sample of continuations drawn from a given law, or from the same
law as another sample?

Shared by the tests (speculative sampling against the target's exact law, enumerated) and the
`check_exactness` entry point (speculative against autoregressive samples of a real model), so
both judge with the same tests. numpy only; the chi-square tail comes from jax's regularised
incomplete gamma, so no scipy is needed at run time.
"""
from __future__ import annotations

import numpy as np


def chi2_sf(stat: float, dof: int) -> float:
  if dof <= 0:
    return 1.0
  import jax.scipy.special as jsp  # pylint: disable=import-outside-toplevel
  return float(jsp.gammaincc(dof / 2.0, stat / 2.0))


def two_sample_chi2(counts_a: np.ndarray, counts_b: np.ndarray, min_expected: float = 5.0):
  """Chi-square homogeneity test of two count vectors over the same cells -> (stat, dof, p)."""
  cells_a, cells_b = pool_rare(counts_a, counts_b, min_expected)
  na, nb = cells_a.sum(), cells_b.sum()
  keep = (cells_a + cells_b) > 0
  cells_a, cells_b = cells_a[keep], cells_b[keep]
  tot = cells_a + cells_b
  ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
  stat = float(np.sum((cells_a - ea) ** 2 / ea) + np.sum((cells_b - eb) ** 2 / eb))
  dof = len(tot) - 1
  return stat, dof, chi2_sf(stat, dof)


def tv_distance(counts_a, counts_b) -> float:
  a = np.asarray(counts_a, np.float64)
  b = np.asarray(counts_b, np.float64)
  return float(0.5 * np.abs(a / a.sum() - b / b.sum()).sum())


def pool_rare(counts_a, counts_b, min_expected: float = 5.0):
  """The cells of `two_sample_chi2`: rare continuations (expected < min_expected) pooled."""
  a = np.asarray(counts_a, np.float64)
  b = np.asarray(counts_b, np.float64)
  small = (a + b) * min(a.sum(), b.sum()) / (a.sum() + b.sum()) < min_expected
  return np.append(a[~small], a[small].sum()), np.append(b[~small], b[small].sum())


def tv_bootstrap(counts_a, counts_b, resamples: int, seed: int = 0):
  """(basic-bootstrap 95% interval of the TV, 95th percentile of the TV under no difference).

  The plug-in TV over many cells is biased upwards (noise adds to it); the basic interval
  (2 TV - upper, 2 TV - lower quantile of the bootstrap TVs) corrects for that bias to first
  order, and the null percentile says how large a TV pure sampling noise produces.
  """
  rng = np.random.default_rng(seed)
  a = np.asarray(counts_a, np.float64)
  b = np.asarray(counts_b, np.float64)
  na, nb = int(a.sum()), int(b.sum())
  pa, pb, pooled = a / na, b / nb, (a + b) / (na + nb)
  tv = tv_distance(a, b)
  boot = [tv_distance(rng.multinomial(na, pa), rng.multinomial(nb, pb)) for _ in range(resamples)]
  null = [tv_distance(rng.multinomial(na, pooled), rng.multinomial(nb, pooled))
          for _ in range(resamples)]
  lo, hi = np.percentile(boot, [2.5, 97.5])
  return ((float(np.clip(2 * tv - hi, 0.0, 1.0)), float(np.clip(2 * tv - lo, 0.0, 1.0))),
          float(np.percentile(null, 95)))


def continuation_counts(seqs_a: np.ndarray, seqs_b: np.ndarray):
  """Rows (first k tokens, -1 after an early EOS) -> counts of each distinct row in a and b."""
  both = np.concatenate([seqs_a, seqs_b], axis=0)
  uniq, inv = np.unique(both, axis=0, return_inverse=True)
  inv = np.ravel(inv)
  ca = np.bincount(inv[:len(seqs_a)], minlength=len(uniq))
  cb = np.bincount(inv[len(seqs_a):], minlength=len(uniq))
  return uniq, ca, cb


def chi_square_gof(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0):
  """Chi-square goodness of fit of `counts` to the law `probs`, cells of expected count
  < min_expected pooled into one. Returns (statistic, degrees of freedom, p-value).

  A cell with observations but probability 0 (a token the law never emits) gives p = 0: the
  sampler is wrong, whatever the rest looks like.
  """
  counts = np.asarray(counts, np.float64).ravel()
  probs = np.asarray(probs, np.float64).ravel()
  n = counts.sum()
  expected = probs * n
  big = expected >= min_expected
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  if exp[-1] < min_expected:  # fold a too-small pooled cell into the smallest kept one
    i = np.argmin(exp[:-1])
    obs[i] += obs[-1]
    exp[i] += exp[-1]
    obs, exp = obs[:-1], exp[:-1]
  if np.any((exp == 0) & (obs > 0)):
    return np.inf, len(exp) - 1, 0.0
  stat = float(np.sum((obs - exp) ** 2 / np.where(exp > 0, exp, 1)))
  dof = len(exp) - 1
  return stat, dof, chi2_sf(stat, dof)
