"""What a run decodes at each point, read in one place: GAMMA as an object gin binds, or its
shorthand; which combinations are built; the (scheme, drafter) pair every program decodes with.

Why one module: the run, its calibration decodes and timed loops, the Python API and
check_exactness all turn GAMMA into a decoding scheme, and each used to read the strings and
refuse combinations itself (two near-identical lists of refusals). Here GAMMA is either

  a scheme object, bound by gin (gin/decoding/*.gin):
    GAMMA = @Chain()             # Chain.gamma = 3: a chain of 3 drafts per target call
    GAMMA = @FeatureChain()      # a feature-level draft's chain with its options (parallel
                                 # block, prompt lookup first): RunConfig.feature
    GAMMA = @TreeScheme()        # a static draft tree; @DynamicTreeScheme(), @LookupTreeScheme()
    GAMMA = @AdaptiveConfig()    # a per-example draft length inside the loop
    GAMMA = @Auto()              # the autotuner (runner/autotune.py): a chain's gamma, a tree or
                                 # plain decoding, chosen on held-out prompts
  or its shorthand: an int (a chain; 0: the target alone), 'tree' (`RunConfig.tree`),
  'adaptive' (`RunConfig.adaptive`), 'auto' (`RunConfig.auto`), or a list of these (a sweep).

The settings GAMMA's words read are nested objects, `RunConfig.auto` (an `Auto`) and
`RunConfig.feature` (a `FeatureOptions`), settled when the config is made (runner/settings.py,
which also reads their flat shorthand keywords such as `RunConfig.auto_min_speedup`).

`lower` turns the objects into the shorthand and the settings it stands for, once, when the
RunConfig is made: `GAMMA = @TreeScheme()` is the run `GAMMA = 'tree'` with `RunConfig.tree =
@TreeScheme()` (gin/decoding/tree.gin's spelling), `GAMMA = @AdaptiveConfig()` the run of
gin/decoding/adaptive.gin, `GAMMA = @Auto(trees=...)` the run of `GAMMA = 'auto'` with those
`RunConfig.tree_candidates` (and each other field of Auto that is set, the same field of
`RunConfig.auto`): the same settings, so the same fingerprint and point keys ('auto', 'tree',
'adaptive', 3: metrics.json's keys), and either spelling resumes the other's run. A setting
bound both ways to different values is refused, never overridden (`configurables.run_config`
also catches a RunConfig binding equal to the field's default). A run has one tree and one
adaptive schedule (as it has one `RunConfig.tree`); several trees are weighed by
`@Auto(trees=...)`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specdec_jax.decoding.adaptive import AdaptiveConfig
from specdec_jax.decoding.autoregressive import Autoregressive
from specdec_jax.decoding.draft_schemes import plan
from specdec_jax.decoding.drafter import is_feature_draft
from specdec_jax.decoding.prompt_cache import has_cache
from specdec_jax.decoding.speculative import Chain
from specdec_jax.decoding.tree.dynamic import DynamicTreeScheme
from specdec_jax.decoding.tree.lookup_scheme import LookupTreeScheme
from specdec_jax.decoding.tree.scheme import TreeScheme
from specdec_jax.decoding.tree.shape import Tree
from specdec_jax.runner.settings import (  # noqa: F401  (schedule.Auto etc.: GAMMA's objects)
    Auto, FeatureChain, FeatureOptions, as_list, same)

AUTO, ADAPTIVE, TREE = "auto", "adaptive", "tree"
WORDS = (AUTO, ADAPTIVE, TREE)
TREE_SCHEMES = (TreeScheme, DynamicTreeScheme, LookupTreeScheme)


def lower(gamma, bound: Mapping[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
  """(GAMMA in shorthand, {RunConfig field: value}) for a GAMMA that may hold scheme objects
  (see the module docstring). A tree or adaptive object fills `tree` / `adaptive`; an `Auto`
  fills the fields it sets. `bound`: the RunConfig's fields the config set to other than their
  defaults; an object that would give one of them another value is refused (so is GAMMA
  holding two trees, two adaptive schedules or two autotuners that differ), never silently
  overridden. Shorthands pass unchanged."""
  bound, fields = dict(bound or {}), {}

  def put(field: str, value, what: str):
    for was, source in ((fields, "GAMMA"), (bound, f"RunConfig.{field}")):
      if field in was and not same(was[field], value):
        raise ValueError(f"GAMMA holds {value!r} for RunConfig.{field} but {source} gives it "
                         f"{was[field]!r}: {what}")
    fields[field] = value

  out = []
  for v in as_list(gamma):
    if isinstance(v, Chain):
      out.append(v.gamma)
    elif isinstance(v, TREE_SCHEMES):
      put("tree", v, "a run decodes one tree (weigh several with @Auto(trees=...))")
      out.append(TREE)
    elif isinstance(v, AdaptiveConfig):
      put("adaptive", v, "a run decodes one adaptive schedule")
      out.append(ADAPTIVE)
    elif isinstance(v, FeatureChain):
      for name, field in FeatureChain.FIELDS.items():
        put(field, getattr(v, name), "a run's feature chains share one set of options")
      out.append(v.gamma)
    elif isinstance(v, Auto):
      for name, field in Auto.FIELDS.items():
        if getattr(v, name) is not None:
          put(field, tuple(as_list(v.trees)) if name == "trees" else getattr(v, name),
              "bind it in one place")
      out.append(AUTO)
    else:
      out.append(v)
  return (out if isinstance(gamma, (list, tuple)) else out[0]), fields


def candidate_schemes(candidates: Sequence[Any], verifier) -> tuple:
  """'auto''s tree candidates as schemes: a branching per depth or a `Tree` becomes a
  TreeScheme with `verifier`; a TreeScheme or DynamicTreeScheme stays; repeats dropped."""
  out = []
  for c in candidates:
    if not isinstance(c, (TreeScheme, DynamicTreeScheme, Tree, list, tuple)):
      raise TypeError(f"RunConfig.tree_candidates: {c!r} is neither a branching per depth such "
                      "as (3, 2, 1), a Tree, a TreeScheme nor a DynamicTreeScheme")
    scheme = c if isinstance(c, (TreeScheme, DynamicTreeScheme)) else TreeScheme(c, verifier)
    if scheme not in out:
      out.append(scheme)
  return tuple(out)


def check_value(g) -> None:
  """Refuses a GAMMA entry that is neither an int >= 0 nor a word (after `lower`)."""
  if g not in WORDS and not (isinstance(g, int) and not isinstance(g, bool) and g >= 0):
    raise ValueError(f"GAMMA must be an int >= 0, 'auto', 'adaptive', 'tree', a scheme "
                     f"(@Chain(), @FeatureChain(), @TreeScheme(), @DynamicTreeScheme(), "
                     f"@LookupTreeScheme(), @AdaptiveConfig(), @Auto()) or a list of them; got "
                     f"{g!r}")


def check(gammas: Sequence[Any], *, feature: str | None, parallel: bool = False,
          lookup_gamma: int = 0, trees: Sequence[Any] = (), model: bool = False) -> None:
  """Refuses a feature-level draft's chain options without one, or combined in ways not built,
  before anything is loaded or compiled. The run (`RunConfig.feature_parallel`,
  `feature_lookup_gamma`) and the API (`parallel=`, `lookup_gamma=`) ask the same question.

  Args:
    gammas: the GAMMA values decoded (shorthand).
    feature: the name of the run's (or pair's) feature-level draft; None without one.
    parallel: the parallel chain (`FeatureDrafter(parallel=True)`).
    lookup_gamma: > 0: prompt lookup where it matches, the feature draft (or a model
      self-draft, `LookupTokenDrafter`) elsewhere.
    trees: the tree schemes decoded ('tree') or weighed ('auto').
    model: the run (or pair) has a model token draft (lookup_gamma's self-draft).
  Trees, static and dynamic, and the adaptive chain are drafted from the target's states
  (every scheme takes the feature drafter, `decoding.drafter`); a mesh is fine.
  """
  gammas = as_list(gammas)
  words = [g for g in gammas if g in WORDS]
  if parallel and feature is None:
    raise ValueError("the parallel chain (RunConfig.feature_parallel, parallel=True) drafts a "
                     "block in one call of a feature-level draft: this run or pair has none (a "
                     "DRAFT_CHECKPOINT holding feature_draft_config.json)")
  if lookup_gamma and feature is None and not model:
    raise ValueError("lookup_gamma (RunConfig.feature_lookup_gamma) combines prompt lookup with "
                     "a feature-level draft or a model self-draft: this run or pair has neither "
                     "(a DRAFT_CHECKPOINT)")
  not_chains = ([repr(w) for w in words if w != AUTO]
                + [type(t).__name__ for t in trees if t is not None])
  if lookup_gamma and not_chains:
    raise ValueError(f"lookup_gamma (RunConfig.feature_lookup_gamma) decodes chains, at int "
                     f"GAMMAs or 'auto' (the draft's gamma chosen, lookup_gamma fixed); got "
                     f"{not_chains[0]}: 'adaptive' and trees (GAMMA 'tree', RunConfig."
                     "tree_candidates) are not combined with it (not built)")
  if feature is None:
    return
  if parallel and (ADAPTIVE in gammas or trees):
    raise ValueError("a feature-level draft's adaptive chain and trees draft one call per token "
                     "or level; they are not combined with feature_parallel (parallel=True)")
  if lookup_gamma:
    if parallel:
      raise ValueError("lookup_gamma (RunConfig.feature_lookup_gamma) drafts with the feature "
                       "chain where the lookup does not match; it is not combined with "
                       "feature_parallel (parallel=True)")
  other = [t for t in trees if not isinstance(t, (TreeScheme, DynamicTreeScheme))]
  if other:
    raise ValueError(f"{type(other[0]).__name__} drafts from tokens; a feature-level draft "
                     f"({feature}) drafts static or dynamic model trees only")


def decoding_scheme(value, draft, *, tree=None, adaptive=None, parallel: bool = False,
                    lookup_gamma: int = 0, lookup_ngram: int = 2, prompt_cache: str = "auto"
                    ) -> tuple[Any, Any]:
  """(scheme, drafter) a program decodes `value` with: an int (0: the target alone), 'tree'
  (`tree`), 'adaptive' (`adaptive`) or a scheme object; a feature-level draft's chain with the
  run's options (`draft_schemes.plan`: its parallel block, prompt lookup first; a token
  draft's prompt cache). None: the draft's default drafter."""
  if value == TREE:
    value = tree
  elif value == ADAPTIVE:
    value = adaptive
  if isinstance(value, int) and not isinstance(value, bool) and value == 0:
    return Autoregressive(), None
  if value is None:
    raise ValueError("GAMMA 'tree' / 'adaptive' needs its scheme (RunConfig.tree / adaptive)")
  return plan(draft, value, parallel=parallel, lookup_gamma=lookup_gamma,
              lookup_ngram=lookup_ngram, prompt_cache=prompt_cache)


def check_pair(value, draft, *, parallel: bool = False, lookup_gamma: int = 0,
               trees: Sequence[Any] = ()) -> None:
  """`check` for one decoder (the API's `Pair.decoder`): the draft object instead of a name."""
  check([value], feature="the draft" if draft is not None and is_feature_draft(draft) else None,
        parallel=parallel, lookup_gamma=lookup_gamma, trees=trees, model=has_cache(draft))
