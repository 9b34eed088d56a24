"""A block laid out as a tree (`Model.extend_with_mask`) scores every node as a chain scores its
path, for T5 and the decoder-only LM, unrolled and scanned, wherever each example sits.

Why: one target call verifies a whole draft tree only if each node sees exactly the cached
prefix and its ancestors, at its depth's position (T5's relative biases and the decoder-only
positions alike); a node that saw its uncle, or sat at its index instead of its depth, would run
without error and shift every probability the verifier compares.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.tree import Tree
from specdec_jax.models import packed
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.kv_cache import valid_prefix_equal
from specdec_jax.models.model import Model
from specdec_jax.models.transformer import masked_block
from specdec_jax.testing import ragged_prompts

IRREGULAR = Tree((-1, 0, 0, 1, 1, 1, 2, 4))  # leaves at depths 1..3, up to 3 children
VARIANTS = [("t5", False, Tree.from_branching((3, 2))), ("decoder", False, IRREGULAR),
            ("decoder", True, Tree.from_branching((2, 2, 1))), ("t5", True, IRREGULAR),
            ("llama", False, IRREGULAR)]  # rotary: keys rotated at their node's depth
CACHE_LEN = 32


def placed(kind, scan, seed=0):
  """(model, params, cache) with the four rows at different cache indices."""
  model = Model(get_preset(f"{kind}_test_target").replace(scan_layers=scan))
  params = model.init(jax.random.key(seed))
  if model.config.kind == "decoder":
    _, prompts = ragged_prompts([6, 3, 1, 5], extra=0)
    return model, params, jax.jit(model.prefill, static_argnums=2)(params, jnp.asarray(prompts),
                                                                   CACHE_LEN)
  inputs = jnp.asarray([[5, 6, 7, 8, 1], [9, 10, 1, 0, 0], [3, 1, 0, 0, 0], [11, 12, 13, 1, 0]])
  cache = jax.jit(model.prefill, static_argnums=2)(params, inputs, CACHE_LEN)
  _, cache = jax.jit(model.extend)(params, cache, jnp.asarray(np.full((4, 4), 7, np.int32)))
  return model, params, cache.rollback(jnp.asarray([4, 2, 1, 3]))


def random_tokens(batch, n, seed=1):
  return jnp.asarray(np.random.default_rng(seed).integers(2, 64, (batch, n)), jnp.int32)


@pytest.mark.parametrize("kind,scan,tree", VARIANTS)
def test_tree_logits_equal_chain_logits_along_every_path(kind, scan, tree):
  model, params, cache = placed(kind, scan)
  tokens = random_tokens(4, tree.num_nodes)
  logits, after = jax.jit(model.extend_with_mask)(params, cache, tokens, tree.depths_N,
                                                  tree.ancestor_mask_NxN)
  np.testing.assert_array_equal(after.index_B, cache.index_B + tree.num_nodes)
  extend = jax.jit(model.extend)
  for leaf in tree.leaves:
    path = list(tree.path_to(leaf))
    chain, _ = extend(params, cache, tokens[:, path])
    np.testing.assert_allclose(np.asarray(logits[:, path]), np.asarray(chain), rtol=1e-5,
                               atol=1e-5, err_msg=f"path {path}")


@pytest.mark.parametrize("kind,scan,tree", VARIANTS)
def test_level_by_level_window_equals_one_block(kind, scan, tree):
  """Each depth fed alone, its window (visible [T, U], U > T) reaching back over the levels
  cached before: every node scores as in the one-block call and the cache ends the same. How
  the tree scheme's draft expands a tree, one call per level."""
  model, params, cache = placed(kind, scan)
  tokens = random_tokens(4, tree.num_nodes, seed=5)
  step = jax.jit(model.extend_with_mask)
  want, want_cache = step(params, cache, tokens, tree.depths_N, tree.ancestor_mask_NxN)
  got, depths = [], tree.depths_N
  for d in range(tree.max_depth + 1):
    lo, hi = int(np.searchsorted(depths, d)), int(np.searchsorted(depths, d, "right"))
    logits, cache = step(params, cache, tokens[:, lo:hi], depths[:hi],
                         tree.ancestor_mask_NxN[lo:hi, :hi])
    got.append(np.asarray(logits))
  np.testing.assert_allclose(np.concatenate(got, axis=1), np.asarray(want), rtol=1e-5,
                             atol=1e-5)
  assert valid_prefix_equal(cache, want_cache, atol=1e-5)


def test_per_row_layouts():
  """offsets [B, T] and visible [B, T, T]: each row its own tree, each row equals its chains."""
  model, params, cache = placed("decoder", False)
  trees = [Tree.from_branching((3, 2)), Tree((-1, 0, 1, 2, 3, 4, 5, 6, 7, 8)),
           Tree((-1, 0, 0, 0, 0, 0, 0, 0, 0, 0)), Tree((-1, 0, 0, 1, 1, 1, 2, 4, 7, 8))]
  assert len({t.num_nodes for t in trees}) == 1
  tokens = random_tokens(4, trees[0].num_nodes, seed=2)
  offsets = np.stack([t.depths_N for t in trees])
  visible = np.stack([t.ancestor_mask_NxN for t in trees])
  logits, _ = jax.jit(model.extend_with_mask)(params, cache, tokens, offsets, visible)
  extend = jax.jit(model.extend)
  for row, tree in enumerate(trees):
    for leaf in tree.leaves:
      path = list(tree.path_to(leaf))
      chain, _ = extend(params, cache, tokens[:, path])
      np.testing.assert_allclose(np.asarray(logits[row, path]), np.asarray(chain[row]),
                                 rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["t5", "decoder"])
def test_chain_layout_is_extend(kind):
  """offsets 0..T-1 with the lower-triangular mask is the plain extend: logits and cache."""
  model, params, cache = placed(kind, False)
  tokens = random_tokens(4, 5, seed=3)
  want, want_cache = jax.jit(model.extend)(params, cache, tokens)
  tree = Tree.chain(4)
  got, got_cache = jax.jit(model.extend_with_mask)(params, cache, tokens, tree.depths_N,
                                                   tree.ancestor_mask_NxN)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
  assert valid_prefix_equal(got_cache, want_cache, atol=1e-6)


def test_masked_block_geometry():
  """Positions, key positions and the attend mask, read off for one row by hand."""
  tree = Tree.from_branching((2, 1))  # nodes 0; 1, 2; 3 (child of 1), 4 (child of 2)
  index_B = jnp.asarray([3], jnp.int32)
  pos, key_pos, attend = (np.asarray(a)[0] for a in masked_block(
      index_B, 10, tree.depths_N, tree.ancestor_mask_NxN))
  np.testing.assert_array_equal(pos, [3, 4, 4, 5, 5])
  np.testing.assert_array_equal(key_pos, [0, 1, 2, 3, 4, 4, 5, 5, 8, 9])
  want = np.zeros((5, 10), bool)
  want[:, :3] = True  # the cached prefix
  want[:, 3:8] = tree.ancestor_mask_NxN  # the block, by ancestry; slots 8, 9 past it: masked
  np.testing.assert_array_equal(attend, want)


@pytest.mark.skipif(not packed.kernel_available(), reason="the CPU kernel is not built")
def test_tree_through_the_packed_kernel():
  """The packed CPU layout (every projection through the kernel, N rows in one pass) scores
  the tree as the XLA layout does, so the verify call can run the kernel on CPU."""
  model, params, cache = placed("decoder", False)
  tree = Tree.from_branching((3, 2))
  tokens = random_tokens(4, tree.num_nodes, seed=4)
  want, _ = jax.jit(model.extend_with_mask)(params, cache, tokens, tree.depths_N,
                                            tree.ancestor_mask_NxN)
  pmodel, pparams = packed.pack(model, params, "kernel")
  got, _ = jax.jit(pmodel.extend_with_mask)(pparams, cache, tokens, tree.depths_N,
                                            tree.ancestor_mask_NxN)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
