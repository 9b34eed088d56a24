"""A self-draft drafting in the target's cache decodes on a mesh what it decodes on one device.

Why: with prompt_cache 'shared' the draft has no cache of its own; it runs under the draft's
rules (its heads and MLP over model_inner only) on the target's cache, laid out by the target's
rules, and the verify call continues on the buffer the draft wrote (`speculative.handoff`). A
layout mistake that changed a value (an entry read from the wrong shard, a draft write landing
where the verify does not overwrite it) changes the greedy tokens or the counters.
`LookupTokenDrafter` adds the batch-sharded prompt in its carry and the draft-or-lookup loop.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import sharding as sh
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.drafter import TokenDrafter
from specdec_jax.decoding.lookup_token import LookupTokenDrafter
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model import Model
from specdec_jax.models.model_config import get_preset

MESH = sh.MeshConfig(data=2, model_outer=2, model_inner=2)  # target on 4 chips, draft on 2


@functools.lru_cache(maxsize=None)
def _self_pair():
  """The decoder test target (vocabulary 16, so outputs repeat and the lookup matches) and its
  own params perturbed as the draft's."""
  target = Model(get_preset("decoder_test_target", vocab_size=16, eos_id=-1))
  tp = target.init(jax.random.key(0))
  leaves, tree = jax.tree_util.tree_flatten(tp)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  dp = jax.tree_util.tree_unflatten(tree, [
      x + 0.05 * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
      for x, k in zip(leaves, keys)])
  return target, tp, target, dp


def _decode(t, d, drafter, params, mesh=None):
  inputs = np.array([[5, 6, 7, 5, 6, 0], [3, 4, 3, 4, 3, 4], [9, 9, 9, 0, 0, 0],
                     [7, 2, 0, 0, 0, 0]], np.int32)
  decoder = Decoder(t, d, Chain(3), SamplingConfig(temperature=0.0), max_decode_len=12,
                    mesh=mesh, drafter=drafter)
  return jax.device_get(decoder.generate(params, inputs, jax.random.key(1)))


@pytest.mark.parametrize("drafter", [TokenDrafter("shared"),
                                     LookupTokenDrafter(draft_gamma=2, lookup_ngram=1)],
                         ids=["shared", "lookup"])
def test_self_draft_in_the_targets_cache_sharded_equals_unsharded(drafter):
  t, tp, d, dp = _self_pair()
  ref = _decode(t, d, drafter, Params(tp, dp))
  assert 0 < ref.counters.accepted_B.sum() < ref.counters.drafted_B.sum()
  p = sh.shard_models(t, tp, d, dp, mesh_config=MESH, batch_size=4)
  assert p.draft.axis_rules == MESH.rules_for("draft")
  got = _decode(p.target, p.draft, drafter, Params(p.target_params, p.draft_params), p.mesh)
  np.testing.assert_array_equal(got.tokens_BxN, ref.tokens_BxN)
  np.testing.assert_array_equal(got.lengths_B, ref.lengths_B)
  for name in ("accepted_B", "drafted_B", "emitted_B", "target_calls_B"):
    np.testing.assert_array_equal(getattr(got.counters, name), getattr(ref.counters, name),
                                  err_msg=name)
  if isinstance(drafter, LookupTokenDrafter):
    np.testing.assert_array_equal(got.draft_stats["lookups_B"], ref.draft_stats["lookups_B"])
