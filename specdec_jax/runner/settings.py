"""The run's nested settings: the autotuner's (`Auto`) and a feature draft's chain options
(`FeatureOptions`, and `FeatureChain`, GAMMA's object that carries them), and how a RunConfig
settles them from every place that may set them.

Why a module: a setting may be given four ways (GAMMA's scheme object, the nested object
`RunConfig.auto` / `RunConfig.feature`, a flat shorthand keyword such as
`RunConfig.auto_min_speedup` that gin files and records use, or a RunConfig field such as
`gamma_max`), and every way must mean one run: the same value twice is one binding, two values
are refused by name, never one silently overriding the other. `bound` and `settled` do that
once, when the RunConfig is made; afterwards the run reads `cfg.auto.min_speedup`, every field filled.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any


def as_list(x) -> list:
  return list(x) if isinstance(x, (list, tuple)) else [x]


@dataclasses.dataclass(frozen=True)
class Auto:
  """The autotuner's settings: choose per draft and temperature among chains up to `gamma_max`,
  the `trees` and plain decoding, from held-out calibration prompts (runner/autotune.py).

  Two places hold one: `GAMMA = @Auto(...)` (the run decodes 'auto' with these settings) and
  `RunConfig.auto` (the settings of every 'auto' in GAMMA; what the run reads, every field
  filled: `settle`). A field left None is unset; set in two places (`GAMMA`'s Auto,
  `RunConfig.auto`, or a shorthand keyword such as `RunConfig.auto_min_speedup`) to different
  values is refused, never overridden.

  Attributes:
    trees: tree candidates weighed beside the chains (a branching per depth, a Tree, a
      TreeScheme or a DynamicTreeScheme; shorthand `RunConfig.tree_candidates`).
    gamma_max: the longest chain considered; set here, it is the run's `RunConfig.gamma_max`
      (which also sizes the verify blocks timed and an 'adaptive' schedule without its own
      AdaptiveConfig), so a settled `RunConfig.auto` leaves it None.
    min_speedup: the gate: plain decoding unless a candidate is predicted above it (default
      1.0; gin/decoding/auto_gamma.gin: 1.1).
    calibration_gamma: the calibration decode's gamma (at least gamma_max is used, at most a
      lookup-first draft's lookup_gamma; default 4).
    calibration_examples: held-out prompts the calibration decode reads (default 4).
    timing_examples: of those, how many the candidate loops are timed on (default 16).
    each_gamma: give every candidate gamma (and a fixed gamma) its own calibration decode and
      predict it from that decode's acceptance profile, instead of reading every gamma's profile
      off the one decode at the calibration gamma (default False: one decode). Why: a draft
      whose proposals depend on where a call starts keeps more per call at a small gamma than
      the large gamma's profile says. Prompt lookup on HumanEval: a call that starts inside a
      copied span keeps its drafts, and gamma 4's calls start there more often than gamma 8's
      (A_1 0.44 against 0.36; 2.34 tokens per call against 2.07 predicted; 1.54x measured
      against 1.35x predicted). Costs one untimed decode of the calibration prompts per gamma.
  """
  trees: Sequence[Any] | None = None
  gamma_max: int | None = None
  min_speedup: float | None = None
  calibration_gamma: int | None = None
  calibration_examples: int | None = None
  timing_examples: int | None = None
  each_gamma: bool | None = None

  # field -> its shorthand keyword of RunConfig (the flat spelling of gin files and records)
  FIELDS = {"trees": "tree_candidates", "gamma_max": "gamma_max",
            "min_speedup": "auto_min_speedup", "calibration_gamma": "auto_calibration_gamma",
            "calibration_examples": "auto_calibration_examples",
            "timing_examples": "auto_timing_examples", "each_gamma": "auto_each_gamma"}
  DEFAULTS = {"trees": (), "min_speedup": 1.0, "calibration_gamma": 4,
              "calibration_examples": 4, "timing_examples": 16, "each_gamma": False}


def same(a, b) -> bool:
  """Whether two bindings are one value (a gin list and a tuple of the same entries are)."""
  as_json = lambda x: json.dumps(x, default=str, sort_keys=True)  # noqa: E731
  return as_json(a) == as_json(b)


@dataclasses.dataclass(frozen=True)
class FeatureChain:
  """GAMMA = @FeatureChain(): a feature-level draft's chain of `gamma` with its options
  (`FeatureOptions`; `decoding.draft_schemes.plan` builds the drafter).

  Attributes:
    gamma: the feature draft's tokens per target call.
    parallel, lookup_gamma, lookup_ngram: `FeatureOptions`' (all of them set: the run's
      feature chains share one set of options).
  """
  gamma: int = 2
  parallel: bool = False
  lookup_gamma: int = 0
  lookup_ngram: int = 2

  FIELDS = {"parallel": "feature_parallel", "lookup_gamma": "feature_lookup_gamma",
            "lookup_ngram": "feature_lookup_ngram"}


@dataclasses.dataclass(frozen=True)
class FeatureOptions:
  """How a feature-level draft's chains draft (`RunConfig.feature`; token drafts ignore it, but
  for a model self-draft's lookup_gamma).

  Attributes:
    parallel: the whole block in one draft call (`FeatureDrafter(parallel=True)`; a
      block-trained draft). Default False.
    lookup_gamma: > 0: prompt lookup drafts this many tokens where the last n-gram matches at
      least `lookup_ngram` tokens, the feature draft GAMMA elsewhere (int GAMMAs, or 'auto'
      with `Auto.each_gamma`, choosing GAMMA within 1..lookup_gamma). Default 0.
      With a model token draft, the same with the draft in the target's cache
      (`decoding.lookup_token.LookupTokenDrafter`: a self-draft, e.g. the target's checkpoint in
      int8 panels); model-free drafts ignore it.
    lookup_ngram: that match length (default 2).
  None: unset (`settle`); shorthands `RunConfig.feature_parallel`, `feature_lookup_gamma`,
  `feature_lookup_ngram`.
  """
  parallel: bool | None = None
  lookup_gamma: int | None = None
  lookup_ngram: int | None = None

  FIELDS = FeatureChain.FIELDS
  DEFAULTS = {"parallel": False, "lookup_gamma": 0, "lookup_ngram": 2}


# RunConfig's shorthand keywords of the nested settings, in the order RunConfig declares them
# (its __post_init__ receives them so); not stored: `settle` folds them in.
SHORTHANDS = ("tree_candidates", "auto_calibration_examples", "auto_timing_examples",
              "auto_calibration_gamma", "auto_min_speedup", "auto_each_gamma",
              "feature_parallel", "feature_lookup_gamma", "feature_lookup_ngram")
assert set(SHORTHANDS) == {f for f in {**Auto.FIELDS, **FeatureOptions.FIELDS}.values()
                           if f != "gamma_max"}


def flatten(settings) -> dict[str, Any]:
  """{shorthand: value} of an `Auto` or `FeatureOptions`' set fields (None: {})."""
  if settings is None:
    return {}
  if not isinstance(settings, (Auto, FeatureOptions)):
    raise TypeError(f"expected an Auto or FeatureOptions, got {type(settings).__name__}")
  return {short: tuple(as_list(v)) if name == "trees" else v
          for name, short in type(settings).FIELDS.items()
          if (v := getattr(settings, name)) is not None}


def given(*sources: tuple[str, Mapping[str, Any]]) -> dict[str, Any]:
  """The union of (where, {shorthand: value}) sources; a key two of them give different
  values is refused, naming both."""
  out, where = {}, {}
  for name, values in sources:
    for key, value in values.items():
      if key in out and not same(out[key], value):
        raise ValueError(f"{where[key]} gives {key} {out[key]!r} but {name} gives it "
                         f"{value!r}: bind it in one place")
      out.setdefault(key, value)
      where.setdefault(key, name)
  return out


def settle(cls, values: Mapping[str, Any]):
  """A settled `Auto` or `FeatureOptions`: each field from `values` ({shorthand: value}) or its
  default (an Auto's gamma_max stays None: it is the RunConfig's)."""
  out = {name: values.get(short, cls.DEFAULTS.get(name))
         for name, short in cls.FIELDS.items() if name != "gamma_max"}
  if "trees" in out:  # a gin list: a tuple (the RunConfig is hashable)
    out["trees"] = tuple(as_list(out["trees"]))
  return cls(**out)


# The RunConfig fields a setting may also be given by (`tree` and `adaptive` by GAMMA's objects).
FIELDS = ("tree", "adaptive", "gamma_max")


def bound(auto, feature, shorthands: Mapping[str, Any], fields: Mapping[str, Any]
          ) -> dict[str, Any]:
  """{shorthand or field: value} a RunConfig was given outside GAMMA: its nested objects, its
  shorthand keywords (None: not given) and `fields` (its FIELDS set to other than the default);
  one setting given two values is refused (`given`)."""
  return given(("RunConfig.auto", flatten(auto)), ("RunConfig.feature", flatten(feature)),
               ("a RunConfig keyword", {k: v for k, v in shorthands.items() if v is not None}),
               ("RunConfig", dict(fields)))


def settled(values: Mapping[str, Any]) -> dict[str, Any]:
  """The RunConfig's settled `auto` and `feature` (checked) and its FIELDS, from every value
  given (`bound` and what GAMMA's objects lowered to)."""
  auto = settle(Auto, values)
  speedup = auto.min_speedup
  if (isinstance(speedup, bool) or not isinstance(speedup, (int, float))
      or not (math.isfinite(speedup) and speedup > 0)):
    raise ValueError(f"RunConfig.auto_min_speedup must be a finite number > 0 (Auto.min_speedup),"
                     f" got {speedup!r}")
  if not isinstance(auto.each_gamma, bool):
    raise ValueError(f"RunConfig.auto_each_gamma must be True or False (Auto.each_gamma), got "
                     f"{auto.each_gamma!r}")
  for name in ("timing_examples", "calibration_examples", "calibration_gamma"):
    if not isinstance(getattr(auto, name), int) or getattr(auto, name) < 1:
      raise ValueError(f"RunConfig.auto_{name} must be an integer >= 1 (Auto.{name}), got "
                       f"{getattr(auto, name)!r}")
  return dict(auto=auto, feature=settle(FeatureOptions, values),
              **{k: values[k] for k in FIELDS if k in values})
