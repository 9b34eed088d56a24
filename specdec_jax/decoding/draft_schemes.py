"""A chain's decoding choices for a draft: `plan(draft, scheme, parallel=..., lookup_gamma=...)`.

Why one function: the run's decode, its calibration decode, the timed loops ('auto'), the API and
the AOT programs must all build the same (scheme, drafter) pair from the same options.
"""
from __future__ import annotations

from specdec_jax.decoding.drafter import FeatureDrafter, is_feature_draft
from specdec_jax.decoding.lookup_feature import LookupFeatureDrafter
from specdec_jax.decoding.speculative import Chain


def plan(draft, scheme, *, parallel: bool = False, lookup_gamma: int = 0,
         lookup_ngram: int = 2):
  """(scheme, drafter) for `draft` (drafter None: the draft's default). `scheme`: a scheme, or an
  int gamma (a `Chain`). Only a feature-level draft's chain has choices (every scheme takes any
  drafter; the rest use the default): `parallel` drafts the block in one call; `lookup_gamma` > 0
  lets prompt lookup draft `lookup_gamma` tokens where its last n-gram matches >= `lookup_ngram`
  tokens and the feature draft `gamma` elsewhere (`LookupFeatureDrafter(draft_gamma=gamma)`)."""
  if isinstance(scheme, int):
    scheme = Chain(scheme)
  if draft is None or not is_feature_draft(draft) or not isinstance(scheme, Chain):
    return scheme, None
  if lookup_gamma:
    if parallel:
      raise ValueError("lookup_gamma drafts with the feature chain where the lookup does not "
                       "match; the parallel chain is not combined with it")
    return Chain(lookup_gamma), LookupFeatureDrafter(draft_gamma=scheme.gamma,
                                                     lookup_ngram=lookup_ngram)
  return scheme, FeatureDrafter(parallel=parallel) if parallel else None
