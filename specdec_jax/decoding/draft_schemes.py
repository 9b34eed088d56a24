"""A chain's decoding choices for a draft: `plan(draft, scheme, parallel=..., lookup_gamma=...)`.

Why one function: the run's decode, its calibration decode, the timed loops ('auto'), the API and
the AOT programs must all build the same (scheme, drafter) pair from the same options.
"""
from __future__ import annotations

from specdec_jax.decoding.drafter import FeatureDrafter, TokenDrafter, is_feature_draft
from specdec_jax.decoding.lookup_feature import LookupFeatureDrafter
from specdec_jax.decoding.lookup_token import LookupTokenDrafter
from specdec_jax.decoding.prompt_cache import has_cache
from specdec_jax.decoding.speculative import Chain


def plan(draft, scheme, *, parallel: bool = False, lookup_gamma: int = 0,
         lookup_ngram: int = 2, prompt_cache: str = "auto"):
  """(scheme, drafter) for `draft` (drafter None: the draft's default). `scheme`: a scheme, or an
  int gamma (a `Chain`). A feature-level draft's chain has choices: `parallel` drafts the block
  in one call; `lookup_gamma` > 0 lets prompt lookup draft `lookup_gamma` tokens where its last
  n-gram matches >= `lookup_ngram` tokens and the feature draft `gamma` elsewhere
  (`LookupFeatureDrafter(draft_gamma=gamma)`); with a model token draft (a self-draft), the
  same in the target's cache (`LookupTokenDrafter`; model-free drafts, lookups themselves,
  ignore it). A token draft's other choice, in any scheme: `prompt_cache` ('auto', 'own',
  'target', 'shared': whether it reads the target's cache, `TokenDrafter`; a feature-level draft
  always prefills its own, and refuses 'target' and 'shared')."""
  if isinstance(scheme, int):
    scheme = Chain(scheme)
  if lookup_gamma and isinstance(scheme, Chain) and has_cache(draft):
    if prompt_cache not in ("auto", "shared"):
      raise ValueError(f"lookup_gamma with a model token draft drafts in the target's cache "
                       f"(LookupTokenDrafter, prompt_cache 'shared'), got {prompt_cache!r}")
    return Chain(lookup_gamma), LookupTokenDrafter(draft_gamma=scheme.gamma,
                                                   lookup_ngram=lookup_ngram)
  if prompt_cache != "auto":
    if draft is not None and is_feature_draft(draft):
      if prompt_cache in ("target", "shared"):
        raise ValueError(f"prompt_cache={prompt_cache!r} is a token draft's option (a self-draft "
                         "reading the target's cache); a feature-level draft prefills its own")
    elif draft is not None:
      return scheme, TokenDrafter(prompt_cache=prompt_cache)
  if draft is None or not is_feature_draft(draft) or not isinstance(scheme, Chain):
    return scheme, None
  if lookup_gamma:
    if parallel:
      raise ValueError("lookup_gamma drafts with the feature chain where the lookup does not "
                       "match; the parallel chain is not combined with it")
    return Chain(lookup_gamma), LookupFeatureDrafter(draft_gamma=scheme.gamma,
                                                     lookup_ngram=lookup_ngram)
  return scheme, FeatureDrafter(parallel=parallel) if parallel else None
