"""GAMMA read in one place (specdec_jax/runner/schedule.py): scheme objects bound by gin are the
run their shorthand is, conflicting bindings are refused by name, and the run, the API and
check_exactness build one (scheme, drafter) pair and refuse the same combinations.

Why: GAMMA was a string decoded in many rooms and the combinations were checked twice with
near-identical messages; a config written with objects must resume a run written with strings
(same fingerprint, same point keys: metrics.json's contract)."""
import dataclasses

import pytest

import specdec_jax as sd
from specdec_jax import configurables
from specdec_jax.decoding.adaptive import AdaptiveConfig
from specdec_jax.decoding.autoregressive import Autoregressive
from specdec_jax.decoding.speculative import Chain
from specdec_jax.decoding.tree.dynamic import DynamicTreeScheme
from specdec_jax.decoding.tree.lookup_scheme import LookupTreeScheme
from specdec_jax.decoding.tree.scheme import TreeScheme
from specdec_jax.runner import run_config as rc, schedule

SMOKE = "configs/local/smoke.gin"


def _cfg(*bindings):
  configurables.parse([SMOKE], list(bindings))
  return configurables.run_config()


def test_gin_objects_are_the_runs_their_shorthands_are():
  pairs = [
      (["GAMMA = @Chain()", "Chain.gamma = 3"], ["GAMMA = 3"]),
      (["GAMMA = @TreeScheme()", "TreeScheme.tree = (2, 1)"],
       ["GAMMA = 'tree'", "RunConfig.tree = @TreeScheme()", "TreeScheme.tree = (2, 1)"]),
      (["GAMMA = @AdaptiveConfig()", "AdaptiveConfig.gamma_max = 5"],
       ["GAMMA = 'adaptive'", "RunConfig.adaptive = @AdaptiveConfig()",
        "AdaptiveConfig.gamma_max = 5"]),
      (["GAMMA = @Auto()", "Auto.trees = [(2, 1)]", "Auto.min_speedup = 1.2",
        "Auto.timing_examples = 8"],
       ["GAMMA = 'auto'", "RunConfig.tree_candidates = [(2, 1)]",
        "RunConfig.auto_min_speedup = 1.2", "RunConfig.auto_timing_examples = 8"]),
      (["GAMMA = @FeatureChain()", "FeatureChain.gamma = 2", "FeatureChain.lookup_gamma = 6"],
       ["GAMMA = 2", "RunConfig.feature_lookup_gamma = 6"]),
      (["GAMMA = [2, @DynamicTreeScheme(), @Auto()]"],
       ["GAMMA = [2, 'tree', 'auto']", "RunConfig.tree = @DynamicTreeScheme()"]),
  ]
  for objects, words in pairs:
    a, b = _cfg(*objects), _cfg(*words)
    assert a == b, objects
    assert a.fingerprint() == b.fingerprint(), objects
    assert [p.key for p in rc.points(a)] == [p.key for p in rc.points(b)], objects


def test_conflicting_bindings_are_refused_not_overridden():
  bad = [
      (["GAMMA = @TreeScheme()", "TreeScheme.tree = (2,)", "RunConfig.tree = @DynamicTreeScheme()"],
       "RunConfig.tree gives it DynamicTreeScheme"),
      (["GAMMA = @Auto()", "Auto.gamma_max = 6", "RunConfig.gamma_max = 5"],
       "RunConfig.gamma_max gives it 5"),
  ]
  for bindings, match in bad:
    with pytest.raises(ValueError, match=match):
      _cfg(*bindings)
  # A binding equal to the field's default is still a binding (auto_gamma.gin binds
  # RunConfig.gamma_max = 8): refused against another value, not silently replaced.
  with pytest.raises(ValueError, match="RunConfig.gamma_max is bound to 8"):
    _cfg("include 'gin/decoding/auto_gamma.gin'", "GAMMA = @Auto()", "Auto.gamma_max = 6")
  # The same value both ways is one binding (a gin list and Auto's tuple alike).
  same = _cfg("include 'gin/decoding/auto_tree.gin'", "GAMMA = @Auto()",
              "Auto.trees = [(2,), (2, 1), (3, 2, 1), (2, 2, 2, 1), (4, 2)]")
  assert same.fingerprint() == _cfg("include 'gin/decoding/auto_tree.gin'").fingerprint()
  assert _cfg("GAMMA = @TreeScheme()").tree == TreeScheme((3, 2, 1))  # 'tree''s default tree
  with pytest.raises(ValueError, match="a run decodes one tree"):
    rc.RunConfig(gamma=[TreeScheme((2,)), TreeScheme((3,))])
  with pytest.raises(ValueError, match="GAMMA must be"):
    rc.RunConfig(gamma=Autoregressive())
  # The same value twice is one binding, and a lowered config survives replace (resume).
  cfg = rc.RunConfig(gamma=[schedule.Auto(gamma_max=6)], gamma_max=6)
  assert cfg.gamma == ["auto"] and dataclasses.replace(cfg, seed=1).gamma_max == 6


def test_one_check_for_the_run_and_the_api():
  """`schedule.check`'s refusals, the same whichever door asks; trees of a feature draft are
  built static or dynamic, the prompt-lookup tree is not."""
  ok = dict(feature="fd")
  schedule.check(["adaptive", "tree"], trees=[TreeScheme((2,)), DynamicTreeScheme()], **ok)
  schedule.check([2], lookup_gamma=4, **ok)
  schedule.check(["auto", 3], lookup_gamma=4, **ok)  # the draft's gamma chosen, lookup's fixed
  schedule.check(["auto"], feature=None, model=True, lookup_gamma=4)
  for kwargs, match in (
      (dict(gammas=[2], feature=None, parallel=True), "has none"),
      (dict(gammas=[2], feature=None, lookup_gamma=3), "has neither"),
      (dict(gammas=["adaptive"], feature="fd", parallel=True), "not combined"),
      (dict(gammas=[2], feature="fd", parallel=True, trees=[TreeScheme((2,))]), "not combined"),
      (dict(gammas=[2], feature="fd", parallel=True, lookup_gamma=3), "feature_parallel"),
      (dict(gammas=["adaptive"], feature="fd", lookup_gamma=3), "'adaptive'"),
      (dict(gammas=["tree"], feature=None, model=True, lookup_gamma=3), "'tree'"),
      (dict(gammas=["auto"], feature="fd", lookup_gamma=3, trees=[TreeScheme((2,))]),
       "TreeScheme"),
      (dict(gammas=["tree"], feature="fd", trees=[LookupTreeScheme()]), "drafts from tokens")):
    gammas = kwargs.pop("gammas")
    with pytest.raises(ValueError, match=match):
      schedule.check(gammas, **kwargs)
  pair = sd.load("t5_test_target", "t5_test_draft", vocabulary=False)
  with pytest.raises(ValueError, match="laid out as the target's"):  # a draft, not a self-draft
    pair.decoder(2, lookup_gamma=3)


def test_the_api_takes_the_scheme_objects_a_run_takes():
  pair = sd.load("t5_test_target", "t5_test_draft", vocabulary=False)
  assert pair.decoder(Chain(3)).scheme == Chain(3) == pair.decoder(3).scheme
  tree = TreeScheme((2, 1))
  assert pair.decoder(tree).scheme == tree == pair.decoder("tree", tree=(2, 1)).scheme
  assert pair.decoder(AdaptiveConfig(gamma_max=5)).scheme == AdaptiveConfig(gamma_max=5)
  assert pair.decoder(0).scheme == Autoregressive() and pair.decoder(0).draft is None
  with pytest.raises(ValueError, match="autotuner"):
    pair.decoder("auto")
  with pytest.raises(ValueError, match="autotuner"):
    pair.decoder(schedule.Auto())
  with pytest.raises(ValueError, match="would be ignored"):
    pair.decoder(tree, tree=(3, 1))
  assert schedule.decoding_scheme("tree", None, tree=tree) == (tree, None)
  with pytest.raises(ValueError, match="laid out as the target's"):  # its lookup: a feature
    pair.decoder(schedule.FeatureChain(2, lookup_gamma=4))  # draft or a self-draft
  with pytest.raises(ValueError, match="has none"):  # the parallel chain: a feature draft
    pair.decoder(schedule.FeatureChain(2, parallel=True))
  assert schedule.decoding_scheme(0, None) == (Autoregressive(), None)


def test_settings_are_nested_objects_and_the_flat_names_set_them():
  """`RunConfig.auto` / `RunConfig.feature` hold the settings, every field filled; the flat
  names gin files and records use are keywords that set one field each (not attributes), and
  the nested spelling is the same run."""
  nested = _cfg("GAMMA = 'auto'", "RunConfig.auto = @Auto()", "Auto.min_speedup = 1.2",
                "Auto.trees = [(2, 1)]", "RunConfig.feature = @FeatureOptions()",
                "FeatureOptions.lookup_ngram = 3")
  flat = _cfg("GAMMA = 'auto'", "RunConfig.auto_min_speedup = 1.2",
              "RunConfig.tree_candidates = [(2, 1)]", "RunConfig.feature_lookup_ngram = 3")
  assert nested == flat and nested.fingerprint() == flat.fingerprint()
  assert flat.auto == schedule.Auto(trees=((2, 1),), min_speedup=1.2, calibration_gamma=4,
                                    calibration_examples=4, timing_examples=16, each_gamma=False)
  assert flat.feature == schedule.FeatureOptions(parallel=False, lookup_gamma=0, lookup_ngram=3)
  stored = {f.name for f in dataclasses.fields(flat)}
  assert not stored & {"auto_min_speedup", "feature_lookup_ngram", "tree_candidates"}
  assert dataclasses.replace(flat, seed=1).auto == flat.auto  # survives replace (resume)
  with pytest.raises(ValueError, match="RunConfig.auto gives auto_min_speedup 1.2 but a "
                                       "RunConfig keyword gives it 1.1"):
    rc.RunConfig(auto=schedule.Auto(min_speedup=1.2), auto_min_speedup=1.1)
  with pytest.raises(ValueError, match="feature_parallel"):
    rc.RunConfig(gamma=schedule.FeatureChain(2), feature=schedule.FeatureOptions(parallel=True))
  with pytest.raises(ValueError, match=r"auto_timing_examples must be an integer >= 1 \(Auto.timing_examples\)"):
    rc.RunConfig(auto_timing_examples=0)
  with pytest.raises(TypeError, match="expected an Auto or FeatureOptions"):
    rc.RunConfig(auto={"min_speedup": 1.2})
  # each candidate's own calibration decode: a setting of the run's outputs (fingerprinted when
  # on, so runs written before it still resume)
  own = _cfg("GAMMA = 'auto'", "RunConfig.auto_each_gamma = True")
  assert own.auto.each_gamma is True and own.fingerprint()["auto_each_gamma"] is True
  assert "auto_each_gamma" not in _cfg("GAMMA = 'auto'").fingerprint()
  with pytest.raises(ValueError, match="auto_each_gamma must be True or False"):
    rc.RunConfig(auto_each_gamma=1)


def test_the_shorthand_keywords_are_the_settings_declared():
  """RunConfig.__post_init__ receives its shorthand keywords by position: their declared order
  must be `settings.SHORTHANDS`."""
  import inspect  # pylint: disable=import-outside-toplevel
  from specdec_jax.runner import settings  # pylint: disable=import-outside-toplevel
  params = list(inspect.signature(rc.RunConfig).parameters)
  assert tuple(params[-len(settings.SHORTHANDS):]) == settings.SHORTHANDS
