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
    assert a == dataclasses.replace(b, tree_candidates=tuple(b.tree_candidates)), objects
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
  for kwargs, match in (
      (dict(gammas=[2], feature=None, parallel=True), "has none"),
      (dict(gammas=[2], feature=None, lookup_gamma=3), "has none"),
      (dict(gammas=["adaptive"], feature="fd", parallel=True), "not combined"),
      (dict(gammas=[2], feature="fd", parallel=True, trees=[TreeScheme((2,))]), "not combined"),
      (dict(gammas=[2], feature="fd", parallel=True, lookup_gamma=3), "feature_parallel"),
      (dict(gammas=["auto"], feature="fd", lookup_gamma=3), "fixed int GAMMAs"),
      (dict(gammas=["tree"], feature="fd", trees=[LookupTreeScheme()]), "drafts from tokens")):
    gammas = kwargs.pop("gammas")
    with pytest.raises(ValueError, match=match):
      schedule.check(gammas, **kwargs)
  pair = sd.load("t5_test_target", "t5_test_draft", vocabulary=False)
  with pytest.raises(ValueError, match="has none"):
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
  with pytest.raises(ValueError, match="has none"):  # a feature chain needs a feature draft
    pair.decoder(schedule.FeatureChain(2, lookup_gamma=4))
  assert schedule.decoding_scheme(0, None) == (Autoregressive(), None)
