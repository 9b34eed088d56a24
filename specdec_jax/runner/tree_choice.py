"""GAMMA='auto' over static trees as well as chains: the calibration tree decode, each candidate
tree's expected tokens per call, and whether a tree beats the best chain (runner/calibrate.py).

Why these pieces: a tree's loop is timed like a chain's (`costs.measure_loops`, the program the
run decodes with), but its expected length is not the chain profile's 1 + sum A_i: it needs how
often a sibling of rank r is accepted after its elder siblings were rejected. One untimed decode
of the calibration prompts with a probe tree (`probe`: at each depth as many children per node as
any candidate has there, so every candidate's ranks are tried) measures a[d][r]
(`theory.rank_acceptance` of its `TreeStats`), and every candidate is predicted from it in the
positional model (`theory.tree_expected_tokens`): out of sample as the chains are, since the
calibration prompts are never reported (held out). A tree is chosen only where its loop was timed
(one device: on a mesh, chains only) and its prediction beats both the best chain's and
min_speedup.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from specdec_jax.decoding.tree.scheme import TreeScheme
from specdec_jax.decoding.tree.shape import Tree
from specdec_jax.metrics import theory
from specdec_jax.runner.costs import LoopCosts, loop_key


def positional_tree(num_nodes: int, accept_by_rank: Sequence[float], max_depth: int = 0
                    ) -> Tree:
  """`theory.positional_parents` as a Tree: the tree of `num_nodes` nodes that keeps the most
  tokens per call when rank r is accepted at rate accept_by_rank[r] (gin:
  `@positional_tree()` among `RunConfig.tree_candidates`, configs/paper/trees/)."""
  return Tree(theory.positional_parents(num_nodes, accept_by_rank, max_depth))


def probe(trees: Sequence[TreeScheme]) -> TreeScheme:
  """The calibration decode's tree: at depth d, every node gets the most children any candidate
  gives a depth-d node (so `theory.rank_acceptance` reads every rank a candidate uses), with the
  first candidate's verifier."""
  most: list[int] = []
  for scheme in trees:
    t = scheme.tree
    kids = np.bincount(t.parents_N[1:], minlength=t.num_nodes)
    for d in range(t.max_depth):
      k = int(kids[t.depths_N == d].max())
      if d < len(most):
        most[d] = max(most[d], k)
      else:
        most.append(k)
  return TreeScheme(Tree.from_branching(tuple(max(k, 1) for k in most)), trees[0].verifier)


def tree_acceptance(decoder, params, inputs_BxP, *, seed: int) -> dict[str, Any]:
  """{'rank_acceptance', 'kept_rank', 'reached', 'probe'} of one untimed decode of the
  calibration prompts with the probe tree (`decoder.scheme`); the stats are summed over the
  batch's rows (one device: no padding rows)."""
  res = decoder.generate(params, inputs_BxP, jax.random.key(seed + 7919))
  kept = np.asarray(res.stats.kept_rank_DxK).tolist()
  reached = np.asarray(res.stats.reached_D).tolist()
  tree = decoder.scheme.tree
  kids = np.bincount(tree.parents_N[1:], minlength=tree.num_nodes)
  branching = [int(kids[tree.depths_N == d].max()) for d in range(tree.max_depth)]
  return {"rank_acceptance": theory.rank_acceptance(kept, reached, branching), "kept_rank": kept,
          "reached": reached, "probe": list(decoder.scheme.tree.parents)}


def tree_curve(trees: Sequence[TreeScheme], accept, loop: LoopCosts) -> dict[str, dict]:
  """{label: {'expected_tokens', 'speedup'}} of every candidate whose loop was timed."""
  out = {}
  for scheme in trees:
    label = loop_key(scheme)
    if label in loop.iteration_ms:
      e = theory.tree_expected_tokens(scheme.tree.parents, accept)
      out[label] = {"expected_tokens": e, "speedup": loop.speedup(label, e)}
  return out


def choose_tree(trees: Sequence[TreeScheme], accept, loop: LoopCosts | None,
                chain_curve: Mapping[int, float], min_speedup: float) -> dict[str, Any]:
  """What the memo of an 'auto' point adds for its trees: their curve and, where the best tree's
  prediction beats min_speedup and every chain's, that tree ('tree': its parents; 'gamma': its
  depth). Nothing is chosen without timed loops or a measured a[d][r]."""
  if loop is None or accept is None:
    return {"tree": None}
  curve = tree_curve(trees, accept, loop)
  memo = {"tree": None, "rank_acceptance": accept,
          "tree_curve": [[k, v["speedup"]] for k, v in curve.items()],
          "tree_expected_tokens": {k: v["expected_tokens"] for k, v in curve.items()}}
  if not curve:
    return memo
  best = max(curve, key=lambda k: curve[k]["speedup"])
  bar = max([min_speedup] + [s for g, s in chain_curve.items() if g > 0])
  if curve[best]["speedup"] > bar:
    scheme = next(s for s in trees if loop_key(s) == best)
    memo.update(tree=list(scheme.tree.parents), tree_label=best, gamma=scheme.tree.max_depth)
  return memo


def chosen(memo: Mapping[str, Any], trees: Sequence[TreeScheme],
           default: TreeScheme | None = None) -> TreeScheme | None:
  """The TreeScheme a memo chose (a candidate of the run, else its parents with `default`'s
  verifier, or 'auto'), None for a chain."""
  parents = memo.get("tree")
  if not parents:
    return None
  for scheme in trees:
    if list(scheme.tree.parents) == list(parents):
      return scheme
  verifier = default.verifier if default is not None else "auto"
  return TreeScheme(Tree(tuple(int(p) for p in parents)), verifier)
