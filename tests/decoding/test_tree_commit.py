"""Committing a kept tree path (`tree.commit.commit_path`): the cache equals the one built from
that path alone, and decoding goes on from it as from the chain's.

Why: after one target call over a tree, the kept path's keys and values sit at scattered slots;
if the gather put one in the wrong slot, or left the index past a discarded sibling, every later
step would attend to a token that was never emitted, and nothing would crash.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.tree import Tree
from specdec_jax.decoding.tree.commit import commit_path
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.kv_cache import valid_prefix_equal
from specdec_jax.models.model import Model
from specdec_jax.testing import ragged_prompts

CACHE_LEN = 32
IRREGULAR = Tree((-1, 0, 0, 1, 1, 1, 2, 4))


def _placed(kind, scan):
  """(model, params, cache) with the four rows at different cache indices."""
  model = Model(get_preset(f"{kind}_test_target").replace(scan_layers=scan))
  params = model.init(jax.random.key(0))
  if kind == "decoder":
    _, prompts = ragged_prompts([6, 3, 1, 5], extra=0)
    return model, params, model.prefill(params, jnp.asarray(prompts), CACHE_LEN)
  inputs = jnp.asarray([[5, 6, 7, 8, 1], [9, 10, 1, 0, 0], [3, 1, 0, 0, 0], [11, 12, 13, 1, 0]])
  cache = model.prefill(params, inputs, CACHE_LEN)
  _, cache = model.extend(params, cache, jnp.asarray(np.full((4, 4), 7, np.int32)))
  return model, params, cache.rollback(jnp.asarray([4, 2, 1, 3]))


def _paths(tree, ends):
  """path_BxD and num_accepted_B of the paths from the root to the nodes `ends`."""
  path = np.full((len(ends), tree.max_depth), -1, np.int32)
  for b, end in enumerate(ends):
    nodes = tree.path_to(end)[1:]
    path[b, :len(nodes)] = nodes
  return jnp.asarray(path), jnp.asarray(tree.depths_N[list(ends)])


@pytest.mark.parametrize("kind,scan,tree,ends", [
    ("decoder", False, IRREGULAR, (7, 0, 6, 3)),  # depth 3, none kept, depth 2 (other branch), 2
    ("t5", False, Tree.from_branching((3, 2)), (9, 2, 0, 5)),
    ("decoder", True, Tree.from_branching((2, 2, 1)), (10, 4, 1, 0)),
    ("t5", True, IRREGULAR, (5, 7, 2, 0))])
def test_committed_cache_equals_the_paths_own(kind, scan, tree, ends):
  model, params, cache = _placed(kind, scan)
  tokens = jnp.asarray(np.random.default_rng(1).integers(2, 64, (4, tree.num_nodes)), jnp.int32)
  _, after = jax.jit(model.extend_with_mask)(params, cache, tokens, tree.depths_N,
                                             tree.ancestor_mask_NxN)
  path_BxD, n_B = _paths(tree, ends)
  got = jax.jit(commit_path)(after, cache.index_B, path_BxD, n_B)
  # The reference: the root and the kept nodes fed as a chain (ragged lengths: feed the longest
  # chain, then roll each row back to its own length).
  longest = max(len(tree.path_to(e)) for e in ends)
  chain = np.stack([np.resize(np.asarray(tokens)[b, list(tree.path_to(e))], longest)
                    for b, e in enumerate(ends)])
  _, want = jax.jit(model.extend)(params, cache, jnp.asarray(chain))
  want = want.rollback(cache.index_B + n_B + 1)
  np.testing.assert_array_equal(got.index_B, cache.index_B + n_B + 1)
  assert valid_prefix_equal(got, want, atol=1e-5)
  # and decoding continues identically from both (the discarded siblings are gone for good)
  nxt = jnp.asarray(np.random.default_rng(2).integers(2, 64, (4, 3)), jnp.int32)
  a, _ = jax.jit(model.extend)(params, got, nxt)
  b, _ = jax.jit(model.extend)(params, want, nxt)
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_commit_path_of_the_verdict():
  """The verifier's own verdict drives the commit: the greedy path through a tree whose nodes
  are the target's greedy tokens along one branch ends where the chain's greedy decode does."""
  model, params, cache = _placed("decoder", False)
  tree = Tree.from_branching((2, 2))
  from specdec_jax.decoding.sampling import SamplingConfig, process_logits
  from specdec_jax.decoding.tree import verify as tv
  greedy_cfg = SamplingConfig(temperature=0.0)
  start = model.start_tokens(jnp.asarray(ragged_prompts([6, 3, 1, 5], extra=0)[1]))
  # the target's own greedy continuation, two tokens
  l1, c1 = model.extend(params, cache, start[:, None])
  g1 = jnp.argmax(l1[:, 0], axis=-1).astype(jnp.int32)
  l2, _ = model.extend(params, c1, g1[:, None])
  g2 = jnp.argmax(l2[:, 0], axis=-1).astype(jnp.int32)
  wrong = lambda x: (x + 1) % 64  # noqa: E731
  # node layout: 0 root; 1, 2 depth 1; 3, 4 children of 1; 5, 6 children of 2. Put the greedy
  # branch at rank 1 at depth 1 (node 2) and rank 0 below it (node 5).
  tokens = jnp.stack([start, wrong(g1), g1, wrong(g2), g2, g2, wrong(g2)], axis=1)
  logits, after = model.extend_with_mask(params, cache, tokens, tree.depths_N,
                                         tree.ancestor_mask_NxN)
  verdict = tv.greedy(None, tree, tokens, None, process_logits(logits, greedy_cfg))
  np.testing.assert_array_equal(verdict.last_node_B, 5)
  got = commit_path(after, cache.index_B, verdict.path_BxD, verdict.num_accepted_B)
  _, want = model.extend(params, cache, jnp.stack([start, g1, g2], axis=1))
  assert valid_prefix_equal(got, want, atol=1e-5)
