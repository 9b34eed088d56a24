"""A tree as static data (`decoding.tree.Tree`): every derived array against a brute force.

Why: the verifiers, the tree attention mask and the cache commit all read these arrays; an
ancestor mask that lets a node see its uncle, or a rank order that differs from the drafting
order, would run without error and silently bias or slow decoding.
"""
import itertools

import numpy as np
import pytest

from specdec_jax.decoding.tree import Tree
from specdec_jax.decoding.tree import shape as tree_shape

IRREGULAR = (-1, 0, 0, 1, 1, 1, 2, 4)  # leaves at depths 1..3, up to 3 children


def _brute_ancestors(parents, i):
  out = {i}
  while parents[i] >= 0:
    i = parents[i]
    out.add(i)
  return out


@pytest.mark.parametrize("branching", [(4, 2, 1), (3, 2), (1,), (2, 2, 2, 2)])
def test_from_branching_layout(branching):
  tree = Tree.from_branching(branching)
  sizes = list(itertools.accumulate(branching, lambda a, b: a * b))
  assert tree.num_nodes == 1 + sum(sizes)
  assert tree.max_depth == len(branching)
  assert tree.max_branching == max(branching)
  np.testing.assert_array_equal(np.bincount(tree.depths_N), [1, *sizes])
  # depth by depth, non-decreasing; every depth-d node has branching[d] children in rank order
  assert np.all(np.diff(tree.depths_N) >= 0)
  for node in range(tree.num_nodes):
    kids = [i for i, p in enumerate(tree.parents) if p == node]
    d = tree.depths_N[node]
    assert len(kids) == (branching[d] if d < len(branching) else 0)
    assert kids == sorted(kids) and all(tree.depths_N[k] == d + 1 for k in kids)
    np.testing.assert_array_equal(tree.ranks_N[kids], np.arange(len(kids)))
    row = tree.children_NxK[node]
    np.testing.assert_array_equal(row[:len(kids)], kids)
    assert np.all(row[len(kids):] == -1)
  assert len(tree.leaves) == sizes[-1]


@pytest.mark.parametrize("parents", [Tree.from_branching((4, 2, 1)).parents, IRREGULAR])
def test_ancestor_mask_and_paths_against_brute_force(parents):
  tree = Tree(parents)
  n = tree.num_nodes
  for i, j in itertools.product(range(n), repeat=2):
    assert tree.ancestor_mask_NxN[i, j] == (j in _brute_ancestors(parents, i)), (i, j)
  for i in range(n):
    path = tree.path_to(i)
    assert set(path) == _brute_ancestors(parents, i) and list(path) == sorted(path)
    assert path[0] == 0 and path[-1] == i and len(path) == tree.depths_N[i] + 1
  assert tree.paths_LxD1.shape == (len(tree.leaves), tree.max_depth + 1)
  for row, leaf in zip(tree.paths_LxD1, tree.leaves):
    path = tree.path_to(leaf)
    np.testing.assert_array_equal(row[:len(path)], path)
    assert np.all(row[len(path):] == -1)


def test_irregular_tree():
  tree = Tree(IRREGULAR)
  assert tree.leaves == (3, 5, 6, 7)
  np.testing.assert_array_equal(tree.depths_N, [0, 1, 1, 2, 2, 2, 2, 3])
  np.testing.assert_array_equal(tree.ranks_N, [0, 0, 1, 0, 1, 2, 0, 0])
  assert tree.max_branching == 3 and tree.max_depth == 3
  np.testing.assert_array_equal(tree.children_NxK[1], [3, 4, 5])
  np.testing.assert_array_equal(tree.children_NxK[2], [6, -1, -1])


def test_chain_is_the_causal_mask():
  """A chain of gamma tokens is a tree whose mask is the chain's causal mask, depth = index."""
  tree = Tree.chain(4)
  assert tree.parents == (-1, 0, 1, 2, 3)
  np.testing.assert_array_equal(tree.ancestor_mask_NxN, np.tril(np.ones((5, 5), bool)))
  np.testing.assert_array_equal(tree.depths_N, np.arange(5))
  assert tree == Tree.from_branching((1, 1, 1, 1))


def test_static_and_hashable():
  """A static jit argument: equal trees hash equal; the derived arrays cannot be written."""
  a, b = Tree.from_branching((3, 2)), Tree.from_branching([3, 2])
  assert a == b and hash(a) == hash(b) and len({a, b}) == 1
  assert a != Tree.from_branching((2, 3))
  for arr in (a.depths_N, a.ranks_N, a.children_NxK, a.ancestor_mask_NxN, a.paths_LxD1,
              a.parents_N):
    with pytest.raises(ValueError):
      arr.flat[0] = 7


@pytest.mark.parametrize("parents,error,match", [
    ((0, 0), ValueError, "parents\\[0\\] must be -1"),
    ((-1,), ValueError, "at least one drafted node"),
    ((-1, 0, 2), ValueError, "node 2's parent must be an earlier node"),
    ((-1, 0, -1), ValueError, "node 2's parent"),
    ((-1, 0.0), TypeError, "must hold ints"),
    ((-1, True), TypeError, "must hold ints"),
    ([-1, 0], TypeError, "must be a tuple"),
])
def test_parent_validation(parents, error, match):
  with pytest.raises(error, match=match):
    Tree(parents)


@pytest.mark.parametrize("branching,match", [
    ((), "at least one depth"),
    ((2, 0), "integer >= 1"),
    ((2, -1), "integer >= 1"),
    ((2.0,), "integer >= 1"),
    ((64, 64, 64), "over the budget"),
])
def test_branching_validation(branching, match):
  with pytest.raises(ValueError, match=match):
    Tree.from_branching(branching)


def test_chain_and_path_validation():
  with pytest.raises(ValueError, match="gamma >= 1"):
    Tree.chain(0)
  with pytest.raises(ValueError, match="node must be in"):
    Tree.chain(2).path_to(3)
  with pytest.raises(ValueError, match="over the budget"):
    Tree((-1,) + (0,) * tree_shape.MAX_NODES)
