"""A feature-level draft on a mesh decodes exactly what it decodes on one device.

Why: on a mesh the feature draft runs under the draft's rules (its block's heads and MLP, the
copied embedding and head split over model_inner, replicated over model_outer), reads the
target's states sharded by the target's rules, and carries its pending features (`FeatureCarry`,
the state's `draft_carry`) batch-sharded across iterations; any layout mistake that changed a
value (a feature fused from the wrong shard, a pending entry lost when the state is resharded)
changes the greedy tokens or the acceptance counters. T5 (the draft cross-attends to the
target's encoder output) and decoder-only, the chained and the parallel drafter, a batch of
ragged prompts, data parallel 2.
"""
import dataclasses
import functools

import jax
import numpy as np
import pytest

from specdec_jax import sharding as sh
from specdec_jax.decoding.adaptive import AdaptiveConfig
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.draft_schemes import plan
from specdec_jax.decoding.tree.dynamic import DynamicTreeScheme
from specdec_jax.decoding.tree.scheme import TreeScheme
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.testing import tiny_feature_pair

GAMMA, MAX_LEN, EOS = 3, 10, 63
MESH = sh.MeshConfig(data=2, model_outer=2, model_inner=2)  # target on 4 chips, draft on 2


@functools.lru_cache(maxsize=None)
def _pair(kind):
  """The tiny pair with EOS moved to an id these random models rarely pick (long outputs)."""
  t, tp, d, dp = tiny_feature_pair(kind)
  t = dataclasses.replace(t, config=t.config.replace(eos_id=EOS))
  d = dataclasses.replace(d, config=d.config.replace(eos_id=EOS))
  return t, tp, d, dp


def _inputs(batch=4):
  x = np.random.default_rng(0).integers(3, 60, (batch, 6)).astype(np.int32)
  x[1, 3:] = 0  # ragged prompts: right padding
  x[3, 2:] = 0
  return x


def _decode(t, d, scheme, drafter, params, temperature, mesh=None, inputs=None):
  decoder = Decoder(t, d, scheme, SamplingConfig(temperature=temperature),
                    max_decode_len=MAX_LEN, mesh=mesh, drafter=drafter)
  inputs = _inputs() if inputs is None else inputs
  return jax.device_get(decoder.generate(params, inputs, jax.random.key(1)))


SLOW = pytest.mark.slow
CASES = [("t5", False, 0.0), ("decoder", True, 0.0), ("decoder", False, 1.0),
         pytest.param("t5", True, 1.0, marks=SLOW), pytest.param("t5", True, 0.0, marks=SLOW),
         pytest.param("decoder", False, 0.0, marks=SLOW),
         pytest.param("t5", False, 1.0, marks=SLOW), pytest.param("decoder", True, 1.0, marks=SLOW)]


TREE_CASES = [("decoder", "tree", 1.0), ("t5", "tree", 0.0),
              pytest.param("decoder", "tree", 0.0, marks=SLOW),
              pytest.param("t5", "tree", 1.0, marks=SLOW),
              ("decoder", "dynamic", 1.0), pytest.param("t5", "dynamic", 0.0, marks=SLOW)]
LOOKUP_CASES = [("decoder", "lookup", 0.0), pytest.param("t5", "lookup", 0.0, marks=SLOW)]
ADAPTIVE_CASES = [("decoder", "adaptive", 1.0), pytest.param("t5", "adaptive", 0.0, marks=SLOW)]


@pytest.mark.parametrize("kind,parallel,temperature",
                         CASES + TREE_CASES + LOOKUP_CASES + ADAPTIVE_CASES)
def test_feature_draft_sharded_equals_unsharded(kind, parallel, temperature):
  """Greedy: the tokens (the random tiny draft is rarely accepted, the decoder-only one on some
  rows); sampling: the acceptance counters too, with every row accepting some drafts. 'tree':
  the feature draft's (2, 2) tree (`TreeScheme` with `FeatureDrafter`: the masked verify with
  states, the path gathered in the target's sharded cache, the pending entries batch-sharded
  beside the summed tree counters); 'dynamic': its dynamic tree (per-row layouts and feature
  gathers); 'lookup': prompt lookup where it matches, the feature draft elsewhere
  (`LookupFeatureDrafter`, as `draft_schemes.plan` builds it: the batch-sharded feature log,
  the `lax.cond` on a batch-wide choice, the catch-up loop), greedy on one prompt in every row:
  the batch drafts with the lookup only when every row matches, which different random rows of
  this vocabulary seldom do at once; 'adaptive': a per-row
  block length (`AdaptiveConfig` with `FeatureDrafter`: the bucketed verify with states on the
  mesh), its proposed lengths and schedules equal too."""
  t, tp, d, dp = _pair(kind)
  scheme, drafter = (
      (TreeScheme((2, 2)), None) if parallel == "tree"
      else (DynamicTreeScheme(depth=3, width=2, branch=3, nodes=8), None)
      if parallel == "dynamic"
      else plan(d, GAMMA, lookup_gamma=4, lookup_ngram=1) if parallel == "lookup"
      else (AdaptiveConfig(GAMMA + 1, gamma_init=2, confidence_threshold=0.1), None)
      if parallel == "adaptive"
      else plan(d, GAMMA, parallel=parallel))
  inputs = np.repeat(_inputs()[:1], 4, axis=0) if parallel == "lookup" else _inputs()
  ref = _decode(t, d, scheme, drafter, Params(tp, dp), temperature, inputs=inputs)
  if temperature > 0:
    assert ref.counters.accepted_B.min() > 0  # the counters below compare something
  p = sh.shard_models(t, tp, d, dp, mesh_config=MESH, batch_size=len(_inputs()))
  # The draft is placed on its own axes: its MLP kernel split over model_inner only.
  wi = jax.tree.leaves(p.draft_params["layer"]["mlp"])[0]
  assert {s.data.shape for s in wi.addressable_shards} != {wi.shape}
  assert p.draft.axis_rules == MESH.rules_for("draft")
  got = _decode(p.target, p.draft, scheme, drafter, Params(p.target_params, p.draft_params),
                temperature, p.mesh, inputs)
  assert ref.lengths_B.max() > 4  # long enough for several iterations to be compared
  np.testing.assert_array_equal(got.tokens_BxN, ref.tokens_BxN)
  np.testing.assert_array_equal(got.lengths_B, ref.lengths_B)
  for name in ("accepted_B", "drafted_B", "emitted_B", "target_calls_B"):
    np.testing.assert_array_equal(getattr(got.counters, name), getattr(ref.counters, name),
                                  err_msg=name)
  if parallel == "lookup":  # both drafts drafted, the same iterations on the mesh
    lookups, calls = ref.draft_stats["lookups_B"], ref.counters.target_calls_B
    assert 0 < lookups.max() and np.any(lookups < calls)
    np.testing.assert_array_equal(got.draft_stats["lookups_B"], lookups)
  if parallel == "adaptive":
    hist = ref.stats.proposed_hist
    assert np.count_nonzero(hist) >= 2, hist  # the block length varied
    np.testing.assert_array_equal(got.stats.proposed_hist, hist)
    np.testing.assert_array_equal(got.stats.gamma_B, ref.stats.gamma_B)


def test_feature_draft_mesh_that_does_not_divide_is_refused():
  t, tp, d, dp = _pair("decoder")  # the draft block has 2 heads: 4 chips cannot split them
  with pytest.raises(ValueError, match="heads"):
    sh.shard_models(t, tp, d, dp, mesh_config=sh.MeshConfig(data=2, model_outer=1,
                                                            model_inner=4))
