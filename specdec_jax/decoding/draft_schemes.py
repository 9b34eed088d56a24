"""A chain's decoding choices for a draft: `plan(draft, scheme, parallel=..., lookup_gamma=...)`.

Why one function: the run's decode, its calibration decode, the timed loops ('auto'), the API and
the AOT programs must all build the same (scheme, drafter) pair from the same options. The
options are a feature-level draft's (`decoding.drafter`: its parallel block, prompt lookup
before it); every scheme takes any drafter, so nothing else needs choosing: a token draft, or
any scheme other than a chain, decodes with the draft's default drafter.
"""
from __future__ import annotations

from specdec_jax.decoding.drafter import FeatureDrafter, is_feature_draft
from specdec_jax.decoding.lookup_feature import LookupFeatureDrafter
from specdec_jax.decoding.speculative import Chain


def plan(draft, scheme, *, parallel: bool = False, lookup_gamma: int = 0,
         lookup_ngram: int = 2):
  """(scheme, drafter) for `draft` (None: the default drafter). `scheme`: a scheme, or an int
  gamma (a `Chain`). For a feature-level draft's chain: `parallel` drafts the block in one call
  (`FeatureDrafter(parallel=True)`); `lookup_gamma` > 0 lets prompt lookup draft `lookup_gamma`
  tokens where its last n-gram matches >= `lookup_ngram` tokens and the feature draft `gamma`
  elsewhere (`Chain(lookup_gamma)` with `LookupFeatureDrafter(draft_gamma=gamma)`). Ignored for
  a token draft and for schemes other than a chain (these are the run's choices for feature
  chains: `runner.drafts.chain_options`, the API's `parallel=` / `lookup_gamma=`)."""
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
