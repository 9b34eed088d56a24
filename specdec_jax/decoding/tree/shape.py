"""A draft tree as static data: parents, depths, sibling ranks, the ancestor mask, paths.

Why static: a tree verified in one target call must have a shape XLA knows at compile time (a
fixed node budget), and the verifiers walk it with loops unrolled over depth and sibling rank.
So a `Tree` is a frozen, hashable dataclass (a static jit argument, part of a scheme) whose
derived arrays are NumPy constants, computed once.

Conventions every tree user relies on:
- node 0 is the root: the last committed token, fed first by the verify call (as the chain feeds
  [last, x_1..x_G]); it is not drafted. Nodes 1..N-1 are drafted tokens.
- topological order: `parents[i] < i`, so along any root-to-leaf path the indices increase and a
  path's cache entries can be gathered into consecutive slots in one pass.
- siblings appear in rank order (rank 0: the draft's first draw without replacement), the order
  in which the recursive rejection verifier tries them.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence

import numpy as np

# A bound on the node budget: one target call scores every node, and the verifiers unroll depth x
# rank; beyond this a tree is almost surely a typo (a branching of (64, 64, 64) is 266,305 nodes).
MAX_NODES = 4096


def _is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class Tree:
  """A rooted tree of draft positions, given by each node's parent (`parents[0] == -1`).

  Build one from a branching per depth with `Tree.from_branching((4, 2, 1))` (every depth-d node
  has branching[d] children: 4 + 8 + 8 = 20 drafted nodes), a chain with `Tree.chain(gamma)`, or
  any topologically ordered parent list (Sequoia-style trees). Derived arrays are NumPy and
  read-only: `depths_N`, `ranks_N`, `children_NxK`, `ancestor_mask_NxN`, `paths_LxD1`.
  """

  parents: tuple[int, ...]

  def __post_init__(self):
    parents = self.parents
    if not isinstance(parents, tuple):
      raise TypeError(f"Tree.parents must be a tuple of ints (hashable), got "
                      f"{type(parents).__name__}")
    if len(parents) < 2:
      raise ValueError(f"a tree needs the root and at least one drafted node, got "
                       f"{len(parents)} node(s)")
    if len(parents) > MAX_NODES:
      raise ValueError(f"a tree of {len(parents)} nodes is over the budget of {MAX_NODES} "
                       "(one target call scores every node)")
    if not all(_is_int(p) for p in parents):
      raise TypeError(f"Tree.parents must hold ints, got {parents!r}")
    if parents[0] != -1:
      raise ValueError(f"node 0 is the root: parents[0] must be -1, got {parents[0]}")
    bad = [i for i, p in enumerate(parents) if i > 0 and not 0 <= p < i]
    if bad:
      i = bad[0]
      raise ValueError(f"node {i}'s parent must be an earlier node (0 <= parent < {i}: "
                       f"topological order), got {parents[i]}")

  # ---- constructors ----------------------------------------------------------------------------
  @classmethod
  def from_branching(cls, branching: Sequence[int]) -> "Tree":
    """Every node at depth d (the root is depth 0) gets branching[d] children; nodes are laid out
    depth by depth, each node's children contiguous and in rank order."""
    branching = tuple(branching)
    if not branching:
      raise ValueError("a branching needs at least one depth, e.g. (4, 2, 1)")
    if not all(_is_int(b) and b >= 1 for b in branching):
      raise ValueError(f"every branching entry must be an integer >= 1, got {branching!r}")
    total = sum(itertools.accumulate(branching, lambda a, b: a * b))
    if total + 1 > MAX_NODES:
      raise ValueError(f"branching {branching} makes {total + 1} nodes, over the budget of "
                       f"{MAX_NODES} (one target call scores every node)")
    parents, level = [-1], [0]
    for b in branching:
      nxt = []
      for node in level:
        for _ in range(b):
          nxt.append(len(parents))
          parents.append(node)
      level = nxt
    return cls(tuple(int(p) for p in parents))

  @classmethod
  def chain(cls, gamma: int) -> "Tree":
    """gamma drafted tokens in a row: the chain scheme's proposal, as a tree."""
    if not _is_int(gamma) or gamma < 1:
      raise ValueError(f"a chain needs gamma >= 1 drafted tokens, got {gamma!r}")
    return cls.from_branching((1,) * int(gamma))

  # ---- derived static arrays -------------------------------------------------------------------
  @property
  def num_nodes(self) -> int:
    """N, the root included: the width of the verify call."""
    return len(self.parents)

  @property
  def parents_N(self) -> np.ndarray:
    return _frozen(np.asarray(self.parents, np.int32))

  @functools.cached_property
  def depths_N(self) -> np.ndarray:
    """Depth of each node (root 0): its position offset in the verify call (positions by depth)."""
    depths = np.zeros(self.num_nodes, np.int32)
    for i in range(1, self.num_nodes):
      depths[i] = depths[self.parents[i]] + 1
    return _frozen(depths)

  @property
  def max_depth(self) -> int:
    """D: the most drafted tokens one iteration can accept."""
    return int(self.depths_N.max())

  @functools.cached_property
  def ranks_N(self) -> np.ndarray:
    """Sibling rank of each node (0 = its parent's first child; the root is 0)."""
    ranks, seen = np.zeros(self.num_nodes, np.int32), {}
    for i in range(1, self.num_nodes):
      p = self.parents[i]
      ranks[i] = seen.get(p, 0)
      seen[p] = ranks[i] + 1
    return _frozen(ranks)

  @property
  def max_branching(self) -> int:
    """K: the most children any node has (the verifiers' sibling loop)."""
    return int(np.bincount(self.parents_N[1:], minlength=self.num_nodes).max())

  @functools.cached_property
  def children_NxK(self) -> np.ndarray:
    """children_NxK[n, r]: node n's child of rank r, -1 where it has fewer than r + 1."""
    out = np.full((self.num_nodes, self.max_branching), -1, np.int32)
    for i in range(1, self.num_nodes):
      out[self.parents[i], self.ranks_N[i]] = i
    return _frozen(out)

  @functools.cached_property
  def ancestor_mask_NxN(self) -> np.ndarray:
    """mask[i, j]: node j is node i or one of its ancestors: which tree nodes node i attends to
    in the verify call (with the whole cache prefix); the tree attention mask."""
    mask = np.eye(self.num_nodes, dtype=bool)
    for i in range(1, self.num_nodes):
      mask[i] |= mask[self.parents[i]]
    return _frozen(mask)

  @functools.cached_property
  def leaves(self) -> tuple[int, ...]:
    has_child = np.zeros(self.num_nodes, bool)
    has_child[self.parents_N[1:]] = True
    return tuple(int(i) for i in np.flatnonzero(~has_child))

  @functools.cached_property
  def paths_LxD1(self) -> np.ndarray:
    """One row per leaf: the node indices root -> leaf (column d is the depth-d node), -1 past
    the leaf. Every root-to-node path is a prefix of one of these rows."""
    out = np.full((len(self.leaves), self.max_depth + 1), -1, np.int32)
    for row, leaf in enumerate(self.leaves):
      node = leaf
      while node >= 0:
        out[row, self.depths_N[node]] = node
        node = self.parents[node]
    return _frozen(out)

  def path_to(self, node: int) -> tuple[int, ...]:
    """Node indices from the root to `node`, both included."""
    if not _is_int(node) or not 0 <= node < self.num_nodes:
      raise ValueError(f"node must be in [0, {self.num_nodes}), got {node!r}")
    out = [int(node)]
    while self.parents[out[-1]] >= 0:
      out.append(self.parents[out[-1]])
    return tuple(reversed(out))


def _frozen(a: np.ndarray) -> np.ndarray:
  a.setflags(write=False)
  return a


@dataclasses.dataclass(frozen=True)
class DynamicTree:
  """The budget of a dynamic draft tree (EAGLE-2 style, `tree.dynamic`): its shape is chosen on
  device per row and per iteration from the draft's own scores, within these static sizes.

  depth D: draft calls (the root's, then one per beam level 1..D-1) and the deepest node.
  width W: beam nodes per level that the draft expands (W <= branch: depth 1 has branch nodes).
  branch k: children drawn per expanded node (the root and every beam node).
  nodes N: the verify call's width, the root included: the N - 1 best of the
    k + (D - 1) W k candidates are verified.
  Candidates are laid out by expander e (0: the root; 1 + (d - 1) W + j: beam node j of depth
  d): expander e's rank-r child is candidate e k + r, so candidate ids grow with depth.
  """

  depth: int = 4
  width: int = 4
  branch: int = 4
  nodes: int = 32

  def __post_init__(self):
    for name in ("depth", "width", "branch", "nodes"):
      if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
        raise ValueError(f"DynamicTree.{name} must be an integer >= 1, got "
                         f"{getattr(self, name)!r}")
    if self.depth > 1 and self.width > self.branch:
      raise ValueError(f"DynamicTree.width ({self.width}) must be <= branch ({self.branch}): "
                       "the first beam is chosen among the root's children")
    most = min(self.num_candidates + 1, MAX_NODES)
    if not 2 <= self.nodes <= most:
      raise ValueError(f"DynamicTree.nodes must be in [2, {most}] (the root and at most every "
                       f"one of the {self.num_candidates} candidates), got {self.nodes}")

  @property
  def num_nodes(self) -> int:
    return self.nodes

  @property
  def max_depth(self) -> int:
    return self.depth

  @property
  def max_branching(self) -> int:
    return self.branch

  @property
  def num_expanders(self) -> int:
    """E: the root and the (D - 1) W beam nodes, each at draft slot root + e."""
    return 1 + (self.depth - 1) * self.width

  @property
  def num_candidates(self) -> int:
    return self.num_expanders * self.branch

  @property
  def label(self) -> str:
    return f"dynamic(depth={self.depth},width={self.width},branch={self.branch},nodes={self.nodes})"

  def expander_depths_E(self) -> np.ndarray:
    """Depth of each expander (the root 0)."""
    e_E = np.arange(self.num_expanders)
    return _frozen(np.where(e_E == 0, 0, 1 + (e_E - 1) // self.width).astype(np.int32))

  def candidate_depths_C(self) -> np.ndarray:
    """Depth of each candidate: its expander's + 1."""
    return _frozen(np.repeat(self.expander_depths_E() + 1, self.branch).astype(np.int32))
