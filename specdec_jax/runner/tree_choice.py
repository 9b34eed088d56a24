"""GAMMA='auto' over static and dynamic trees as well as chains: the calibration tree decodes,
each candidate tree's expected tokens per call, and whether a tree beats the best chain
(runner/calibrate.py).

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

A dynamic tree (`DynamicTreeScheme`, EAGLE-2 style) has no parent list: its shape follows the
draft's confidence row by row and iteration by iteration, which the positional model cannot see.
Its tokens per call are measured instead: one more untimed decode of the same calibration
prompts, with the same seed, with that scheme itself (`dynamic_acceptance`); its loop is timed
like any candidate's, and it competes on loop.speedup(label, measured tokens) with the rest. The
memo names a chosen dynamic tree by its budget (`dynamic_tree`: depth, width, branch, nodes)
beside the static tree's `tree` (parents), and `chosen` rebuilds either.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from specdec_jax.decoding.tree.dynamic import DynamicTreeScheme
from specdec_jax.decoding.tree.scheme import TreeScheme
from specdec_jax.decoding.tree.shape import Tree
from specdec_jax.metrics import acceptance_stats, theory
from specdec_jax.runner.costs import LoopCosts, loop_key


def positional_tree(num_nodes: int, accept_by_rank: Sequence[float], max_depth: int = 0
                    ) -> Tree:
  """`theory.positional_parents` as a Tree: the tree of `num_nodes` nodes that keeps the most
  tokens per call when rank r is accepted at rate accept_by_rank[r] (gin:
  `@positional_tree()` among `RunConfig.tree_candidates`, configs/paper/trees/)."""
  return Tree(theory.positional_parents(num_nodes, accept_by_rank, max_depth))


def is_dynamic(scheme) -> bool:
  """Whether a candidate is a dynamic tree (predicted from its own decode, not positionally)."""
  return isinstance(scheme, DynamicTreeScheme)


def probe(trees: Sequence[TreeScheme]) -> TreeScheme:
  """The calibration decode's tree: at depth d, every node gets the most children any candidate
  gives a depth-d node (so `theory.rank_acceptance` reads every rank a candidate uses), with the
  first candidate's verifier. Static candidates only (a dynamic one has no fixed children)."""
  if not trees or any(is_dynamic(s) for s in trees):
    raise ValueError(f"the probe tree is made of static TreeSchemes only, got {list(trees)!r}")
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


def dynamic_acceptance(decoder, params, inputs_BxP, *, seed: int) -> dict[str, Any]:
  """{'tokens_per_call', 'emitted', 'target_calls', 'dynamic'} of one untimed decode of the
  calibration prompts with a dynamic tree (`decoder.scheme`; the probe's random key, seed +
  7919): tokens written per target call over the batch's rows (one device: no padding rows),
  what that tree is predicted to keep per call (measured: no positional model fits its shape),
  and its budget."""
  res = decoder.generate(params, inputs_BxP, jax.random.key(seed + 7919))
  totals = acceptance_stats.counters_to_dict(res.counters)
  return {"tokens_per_call": totals["emitted"] / max(totals["target_calls"], 1),
          "emitted": totals["emitted"], "target_calls": totals["target_calls"],
          "dynamic": dataclasses.asdict(decoder.scheme.tree)}


def calibration_decodes(trees: Sequence, decode: Callable) -> dict[str, Any]:
  """The tree decodes of one draft and temperature: the probe's `tree_acceptance` over the static
  candidates ({'rank_acceptance': None} without one) and 'dynamic_tokens' {label: measured
  tokens per call} of each dynamic one. decode(suffix, scheme, fn) -> fn(decoder, params, inputs,
  seed=...) of the run's decoder with `scheme` on the calibration prompts, remembered under
  suffix ('tree' for the probe, 'tree/<label>' for a dynamic tree)."""
  static = [s for s in trees if not is_dynamic(s)]
  out = (dict(decode("tree", probe(static), tree_acceptance)) if static
         else {"rank_acceptance": None})
  out["dynamic_tokens"] = {
      loop_key(s): float(decode("tree/" + loop_key(s), s, dynamic_acceptance)["tokens_per_call"])
      for s in trees if is_dynamic(s)}
  return out


def tree_curve(trees: Sequence, accept, loop: LoopCosts,
               measured: Mapping[str, float] | None = None) -> dict[str, dict]:
  """{label: {'expected_tokens', 'speedup'}} of every candidate whose loop was timed and whose
  tokens per call are known: a static tree's from a[d][r] (`accept`, positional), a dynamic
  tree's `measured` by its own calibration decode."""
  out = {}
  for scheme in trees:
    label = loop_key(scheme)
    if label not in loop.iteration_ms:
      continue
    if is_dynamic(scheme):
      e = (measured or {}).get(label)
    else:
      e = None if accept is None else theory.tree_expected_tokens(scheme.tree.parents, accept)
    if e is not None:
      out[label] = {"expected_tokens": float(e), "speedup": loop.speedup(label, e)}
  return out


def choose_tree(trees: Sequence, accept, loop: LoopCosts | None,
                chain_curve: Mapping[int, float], min_speedup: float,
                measured: Mapping[str, float] | None = None) -> dict[str, Any]:
  """What the memo of an 'auto' point adds for its trees: their curve, where each prediction
  came from ('tree_expected_from': 'positional' or 'decode') and, where the best tree's
  prediction beats min_speedup and every chain's, that tree ('tree': a static tree's parents, or
  'dynamic_tree': a dynamic tree's budget; 'gamma': its depth). Nothing is chosen without timed
  loops, or without a measured a[d][r] or dynamic decode."""
  if loop is None or (accept is None and not measured):
    return {"tree": None}
  curve = tree_curve(trees, accept, loop, measured)
  memo = {"tree": None, "rank_acceptance": accept,
          "tree_curve": [[k, v["speedup"]] for k, v in curve.items()],
          "tree_expected_tokens": {k: v["expected_tokens"] for k, v in curve.items()},
          "tree_expected_from": {k: "decode" if k in (measured or {}) else "positional"
                                 for k in curve}}
  if not curve:
    return memo
  best = max(curve, key=lambda k: curve[k]["speedup"])
  bar = max([min_speedup] + [s for g, s in chain_curve.items() if g > 0])
  if curve[best]["speedup"] > bar:
    scheme = next(s for s in trees if loop_key(s) == best)
    memo.update(tree_label=best, gamma=scheme.tree.max_depth)
    memo.update({"dynamic_tree": dataclasses.asdict(scheme.tree)} if is_dynamic(scheme)
                else {"tree": list(scheme.tree.parents)})
  return memo


def chosen(memo: Mapping[str, Any], trees: Sequence,
           default=None) -> TreeScheme | DynamicTreeScheme | None:
  """The scheme a memo chose: a candidate of the run with its parents ('tree') or its dynamic
  budget ('dynamic_tree'), else one rebuilt from them with `default`'s verifier (the run's), or
  'auto'; None for a chain."""
  parents, budget = memo.get("tree"), memo.get("dynamic_tree")
  if not parents and not budget:
    return None
  for scheme in trees:
    if is_dynamic(scheme) and budget and dataclasses.asdict(scheme.tree) == dict(budget):
      return scheme
    if not is_dynamic(scheme) and parents and list(scheme.tree.parents) == list(parents):
      return scheme
  verifier = default.verifier if default is not None else "auto"
  if budget:
    return DynamicTreeScheme(**{k: int(v) for k, v in budget.items()}, verifier=verifier)
  return TreeScheme(Tree(tuple(int(p) for p in parents)), verifier)
