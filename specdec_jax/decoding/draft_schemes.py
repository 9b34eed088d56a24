"""Which scheme a draft decodes with: `chain_for(draft, gamma, parallel=...)` for a chain,
`scheme_for(draft, scheme)` for a tree.

Why one function in a module of its own: the run's decode, its calibration decode, the timed
loops ('auto') and the API must all build the program the draft needs (a `Chain` over a feature
draft fails only when traced: its `extend` refuses), and the choice names three schemes in two
modules (`feature_parallel` imports `feature_chain`, so neither can hold it without a circle).
"""
from __future__ import annotations

from specdec_jax.decoding.adaptive import AdaptiveConfig
from specdec_jax.decoding.feature_adaptive import AdaptiveFeatureChain
from specdec_jax.decoding.feature_chain import FeatureChain, is_feature_draft
from specdec_jax.decoding.feature_parallel import ParallelFeatureChain
from specdec_jax.decoding.lookup_feature import LookupFeatureChain
from specdec_jax.decoding.speculative import Chain
from specdec_jax.decoding.tree.dynamic import DynamicTreeScheme
from specdec_jax.decoding.tree.feature import FeatureDynamicTreeScheme, FeatureTreeScheme
from specdec_jax.decoding.tree.scheme import TreeScheme


def chain_for(draft, gamma: int, *, parallel: bool = False, lookup_gamma: int = 0,
              lookup_ngram: int = 2):
  """`speculative.Chain` for a token draft; for a feature-level draft `FeatureChain`, or with
  `parallel` `ParallelFeatureChain` (one draft call per block, the draft's own mask token), or
  with `lookup_gamma` > 0 `LookupFeatureChain` (prompt lookup drafts `lookup_gamma` tokens
  where its last n-gram matches >= `lookup_ngram` tokens, the feature draft `gamma` elsewhere).
  These are the caller's decoding choices (`runner.drafts.chain_options`, the API's `parallel=` /
  `lookup_gamma=`), not properties of the draft: ignored for a token draft."""
  if not is_feature_draft(draft):
    return Chain(gamma)
  if lookup_gamma:
    if parallel:
      raise ValueError("lookup_gamma drafts with the feature chain where the lookup does not "
                       "match; the parallel chain is not combined with it")
    return LookupFeatureChain.for_draft(draft, gamma, lookup_gamma=lookup_gamma,
                                        lookup_ngram=lookup_ngram)
  if parallel:
    return ParallelFeatureChain.for_draft(draft, gamma)
  return FeatureChain.for_draft(draft, gamma)


def scheme_for(draft, scheme):
  """`scheme` as `draft` decodes it: for a feature-level draft a static `TreeScheme` becomes
  `tree.feature.FeatureTreeScheme`, a `DynamicTreeScheme` `FeatureDynamicTreeScheme` (the
  same tree or budget and verifier, drafted from the target's states) and an `AdaptiveConfig`
  `AdaptiveFeatureChain` (the same schedule and threshold); any scheme of a token draft, or a
  feature draft's own scheme, as given. Refused by name: the prompt-lookup tree with a
  feature-level draft (it drafts from tokens only)."""
  if not is_feature_draft(draft) or isinstance(
      scheme, (FeatureChain, ParallelFeatureChain, FeatureTreeScheme, LookupFeatureChain,
               AdaptiveFeatureChain)):
    return scheme
  if isinstance(scheme, AdaptiveConfig):
    return AdaptiveFeatureChain.for_draft(draft, scheme)
  if isinstance(scheme, TreeScheme):
    return FeatureTreeScheme.for_draft(draft, scheme)
  if isinstance(scheme, DynamicTreeScheme):
    return FeatureDynamicTreeScheme.for_draft(draft, scheme)
  raise ValueError(f"{type(scheme).__name__} drafts from tokens; a feature-level draft decodes "
                   "with a chain (an int gamma) or a tree (TreeScheme, DynamicTreeScheme)")
