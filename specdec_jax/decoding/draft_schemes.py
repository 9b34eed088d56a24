"""A chain's decoding choices for a draft: `plan(draft, scheme, parallel=..., lookup_gamma=...)`.

Why one function: the run's decode, its calibration decode, the timed loops ('auto'), the API and
the AOT programs must all build the same (scheme, drafter) pair from the same options.
"""
from __future__ import annotations

from specdec_jax.decoding.drafter import FeatureDrafter, TokenDrafter, is_feature_draft
from specdec_jax.decoding.lookup_feature import LookupFeatureDrafter
from specdec_jax.decoding.speculative import Chain


def plan(draft, scheme, *, parallel: bool = False, lookup_gamma: int = 0,
         lookup_ngram: int = 2, prompt_cache: str = "auto"):
  """(scheme, drafter) for `draft` (drafter None: the draft's default). `scheme`: a scheme, or an
  int gamma (a `Chain`). A feature-level draft's chain has choices: `parallel` drafts the block
  in one call; `lookup_gamma` > 0 lets prompt lookup draft `lookup_gamma` tokens where its last
  n-gram matches >= `lookup_ngram` tokens and the feature draft `gamma` elsewhere
  (`LookupFeatureDrafter(draft_gamma=gamma)`). A token draft's one, in any scheme:
  `prompt_cache` ('auto', 'own', 'target': whether it starts from the target's cache of the
  prompt, `TokenDrafter`; a feature-level draft always prefills its own, and refuses 'target')."""
  if isinstance(scheme, int):
    scheme = Chain(scheme)
  if prompt_cache != "auto":
    if draft is not None and is_feature_draft(draft):
      if prompt_cache == "target":
        raise ValueError("prompt_cache='target' is a token draft's option (a self-draft starting "
                         "from the target's cache); a feature-level draft prefills its own")
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
