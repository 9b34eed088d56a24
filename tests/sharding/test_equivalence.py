"""Sharded decoding must give the unsharded tokens, for every layout (issue 3, check 1).

Why exact equality, also when sampling: jax's threefry is partitionable here
(`jax_threefry_partitionable`, the default), so a key gives the same random bits however the
array it fills is sharded, and the vocabulary is gathered before sampling (`Model.extend`), so
every draw sees whole rows. What can differ is the summation order of sharded matmuls (last-bit
noise in the logits); these tiny models have no near-ties, so any mismatch here is a real bug.
"""
import jax
import numpy as np
import pytest

from sharding_tiny import LAYOUTS, MAX_LEN, sampling_for
from specdec_jax import sharding as sh
from specdec_jax.decoding.decoder import Decoder, Params

# Greedy on every layout. Sampled on every layout too; in the fast tier only on the draft-on-
# fewer-chips layout (both vocabularies sharded, over different axes), the rest marked slow
# (each case is one more compile).
CASES = [pytest.param(layout, 0.0, id=f"{layout}-greedy") for layout in LAYOUTS]
CASES += [pytest.param(layout, 1.0, id=f"{layout}-sampled",
                       marks=() if layout == "dp2_target4_draft2" else pytest.mark.slow)
          for layout in LAYOUTS]


@pytest.mark.parametrize("layout,temperature", CASES)
def test_speculative_sharded_equals_unsharded(runs, layout, temperature):
  ref = runs.reference(temperature)
  run = runs.sharded(layout, temperature)
  out, host = run.out, run.host
  np.testing.assert_array_equal(host.tokens_BxN, ref.tokens_BxN)
  np.testing.assert_array_equal(host.lengths_B, ref.lengths_B)
  np.testing.assert_array_equal(host.counters.accepted_B, ref.counters.accepted_B)
  np.testing.assert_array_equal(host.counters.iterations, ref.counters.iterations)
  data = LAYOUTS[layout][0]
  # The token output stays batch-sharded over the data axis (replicated if data is 1).
  spec = out.tokens_BxN.sharding.spec
  assert (spec[0] if len(spec) else None) == ("data" if data > 1 else None)


def test_sampled_reference_accepts_some_and_rejects_some(runs):
  """The sampled cases exercise both branches of the acceptance rule, not just one."""
  c = runs.reference(1.0).counters
  assert 0 < int(np.sum(c.accepted_B)) < int(np.sum(c.drafted_B))


@pytest.mark.slow
def test_autoregressive_sharded_equals_unsharded(runs):
  t, tp, _, _ = runs.models
  kw = dict(sampling=sampling_for(0.0), max_decode_len=MAX_LEN)
  ref = jax.device_get(Decoder(t, **kw).generate(Params(tp), runs.inputs, runs.rng))
  p = sh.shard_models(t, tp, mesh_config=sh.MeshConfig(2, 2, 2), batch_size=len(runs.inputs))
  got = jax.device_get(Decoder(p.target, **kw, mesh=p.mesh).generate(
      Params(p.target_params), runs.inputs, runs.rng))
  np.testing.assert_array_equal(got.tokens_BxN, ref.tokens_BxN)
  np.testing.assert_array_equal(got.lengths_B, ref.lengths_B)


@pytest.mark.parametrize("temperature", [pytest.param(0.0, marks=pytest.mark.slow), 1.0])
def test_adaptive_sharded_equals_unsharded(runs, temperature):
  """The adaptive loop on a mesh (a `Decoder` with the adaptive scheme and a mesh, the same
  iteration function inside the donated-state program) gives the unsharded tokens and
  statistics."""
  from specdec_jax.decoding import adaptive
  t, tp, d, dp = runs.models
  cfg = adaptive.AdaptiveConfig(gamma_max=4, gamma_init=2)
  ref = jax.device_get(Decoder(t, d, cfg, sampling_for(temperature), max_decode_len=MAX_LEN)
                       .generate(Params(tp, dp), runs.inputs, runs.rng))
  ref_stats = ref.stats
  p = sh.shard_models(t, tp, d, dp, mesh_config=sh.MeshConfig(*LAYOUTS["dp2_target4_draft2"]),
                      batch_size=len(runs.inputs))
  decoder = Decoder(p.target, p.draft, cfg, sampling_for(temperature), max_decode_len=MAX_LEN,
                    mesh=p.mesh)
  got = jax.device_get(decoder.generate(Params(p.target_params, p.draft_params), runs.inputs,
                                        runs.rng))
  stats = got.stats
  np.testing.assert_array_equal(got.tokens_BxN, ref.tokens_BxN)
  np.testing.assert_array_equal(got.lengths_B, ref.lengths_B)
  np.testing.assert_array_equal(got.counters.accepted_B, ref.counters.accepted_B)
  np.testing.assert_array_equal(stats.proposed_hist, ref_stats.proposed_hist)
  assert int(stats.draft_calls) == int(ref_stats.draft_calls)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_sharded_equals_unsharded(runs, temperature):
  """The tree scheme on a mesh (draft on fewer chips, data-parallel rows): the masked verify
  call, the per-level masked draft calls and the path commit give the unsharded tokens and
  statistics."""
  from specdec_jax.decoding.tree import TreeScheme
  t, tp, d, dp = runs.models
  scheme = TreeScheme((2, 2))
  ref = jax.device_get(Decoder(t, d, scheme, sampling_for(temperature), max_decode_len=MAX_LEN)
                       .generate(Params(tp, dp), runs.inputs, runs.rng))
  p = sh.shard_models(t, tp, d, dp, mesh_config=sh.MeshConfig(*LAYOUTS["dp2_target4_draft2"]),
                      batch_size=len(runs.inputs))
  decoder = Decoder(p.target, p.draft, scheme, sampling_for(temperature), max_decode_len=MAX_LEN,
                    mesh=p.mesh)
  got = jax.device_get(decoder.generate(Params(p.target_params, p.draft_params), runs.inputs,
                                        runs.rng))
  np.testing.assert_array_equal(got.tokens_BxN, ref.tokens_BxN)
  np.testing.assert_array_equal(got.lengths_B, ref.lengths_B)
  np.testing.assert_array_equal(got.counters.accepted_B, ref.counters.accepted_B)
  np.testing.assert_array_equal(got.stats.kept_rank_DxK, ref.stats.kept_rank_DxK)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_dynamic_tree_sharded_equals_unsharded(runs, temperature):
  """The dynamic tree scheme on a mesh: the windowed beam draft calls with per-row masks, the
  per-row rerank tables, the masked verify call and both path commits give the unsharded tokens
  and statistics (the rerank's ties are broken by candidate id, never by layout)."""
  from specdec_jax.decoding.tree import DynamicTreeScheme
  t, tp, d, dp = runs.models
  scheme = DynamicTreeScheme(depth=3, width=2, branch=3, nodes=8)
  ref = jax.device_get(Decoder(t, d, scheme, sampling_for(temperature), max_decode_len=MAX_LEN)
                       .generate(Params(tp, dp), runs.inputs, runs.rng))
  p = sh.shard_models(t, tp, d, dp, mesh_config=sh.MeshConfig(*LAYOUTS["dp2_target4_draft2"]),
                      batch_size=len(runs.inputs))
  decoder = Decoder(p.target, p.draft, scheme, sampling_for(temperature), max_decode_len=MAX_LEN,
                    mesh=p.mesh)
  got = jax.device_get(decoder.generate(Params(p.target_params, p.draft_params), runs.inputs,
                                        runs.rng))
  np.testing.assert_array_equal(got.tokens_BxN, ref.tokens_BxN)
  np.testing.assert_array_equal(got.lengths_B, ref.lengths_B)
  np.testing.assert_array_equal(got.counters.accepted_B, ref.counters.accepted_B)
  np.testing.assert_array_equal(got.stats.kept_rank_DxK, ref.stats.kept_rank_DxK)
