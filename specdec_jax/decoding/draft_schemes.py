"""Which chain scheme a draft decodes with: `chain_for(draft, gamma)`.

Why one function in a module of its own: the run's decode, its calibration decode, the timed
loops ('auto') and the API must all build the program the draft needs (a `Chain` over a feature
draft fails only when traced: its `extend` refuses), and the choice names three schemes in two
modules (`feature_parallel` imports `feature_chain`, so neither can hold it without a circle).
"""
from __future__ import annotations

from specdec_jax.decoding.feature_chain import FeatureChain, is_feature_draft
from specdec_jax.decoding.feature_parallel import ParallelFeatureChain
from specdec_jax.decoding.speculative import Chain


def chain_for(draft, gamma: int):
  """`speculative.Chain` for a token draft; for a feature-level draft `FeatureChain`, or
  `ParallelFeatureChain` (one draft call per block, the draft's own mask token) when the draft
  is marked `parallel` (`RunConfig.feature_parallel` marks it at load)."""
  if not is_feature_draft(draft):
    return Chain(gamma)
  if getattr(draft, "parallel", False):
    return ParallelFeatureChain.for_draft(draft, gamma)
  return FeatureChain.for_draft(draft, gamma)
