"""Draft trees on the TPU roofline: v(nodes), a tree iteration's draft cost, and the predicted
tree speedup at the paper's alpha beside the chain's (issue 29).

Why a tree can pay on a TPU where it did not on the 2-core CPU: a batch-1 T5-XXL verify streams
its weights once whatever the width, so v(N) = verify(N nodes) / target step stays near 1 far
beyond a chain's 8 tokens (`roofline.step_cost`, the same byte basis), while a tree keeps a
token at a depth where the chain's one candidate was rejected.

The cost of one tree call, in target steps (the chain's G c + v(G + 1) when every level is one
node wide):
- the draft expands the tree level by level (`decoding.tree.scheme.draft_tree`): D calls, the
  call at depth d feeding that level's nodes (1 at the root) and drawing their children
  (sampling over the vocabulary per fed node, as a chain's draft step);
- one target call over all N nodes: v(N), on a cache with the tree's slack (N - 1 + 2 slots past
  the decode length, `start.slack`), as are the draft's calls.

Expected tokens per call (`metrics.theory.tree_expected_tokens`, the positional model): a node
of sibling rank r is accepted with probability a_r once its parent was kept and its elder
siblings rejected, at every depth. a_0 is the paper's alpha (Table 2); a_r for r >= 1 is alpha
times the ratio a_r / a_0 measured at depth 1 on the local en-de zoo pair at the row's
temperature (`RANK_RATIOS`, from docs/results/tree_rank_acceptance_ende.json; a measured decay,
not the paper's). At rank 0 this is the chain's model (alpha^i), so a tree of width 1 predicts
the chain's Table-2 figure exactly. Each row's tree of N nodes is the one that keeps the most
tokens in that model with at most the chain's gamma levels (`shape.positional_tree`: the same
draft calls as the chain, each wider). These are predictions from the paper's alpha and a local
decay, not measurements. Fed the local pair's own rates by depth and rank, the model gave the
(3, 2, 1) tree 1.25x the depth-3 chain's tokens per call where 1.24x was measured (T = 0); that
T5-XXL's drafts decay by rank as the local draft's do, and keep one rate at every depth, is
assumed.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from specdec_jax.aot import roofline as R
from specdec_jax.metrics import theory

TREE_NODES = (16, 32, 64)   # the node budgets of the trees table (the verify call's width)
# a_r / a_0 at depth 1 for r = 1, 2, 3, measured with the (4, 3, 2, 1) tree on 48 held-out en-de
# prompts (experiments/tree_rank_acceptance.py; docs/results/tree_rank_acceptance_ende.json, rounded
# to 2 decimals), by temperature (0: greedy, where siblings are the draft's next most likely
# tokens; 1: drawn without replacement, tested against the residual). Measured a_0 was 0.598 at
# T = 0 and 0.518 at T = 1; ranks past 3 take rank 3's rate.
RANK_RATIOS = {0: (1.0, 0.64, 0.32, 0.19), 1: (1.0, 0.47, 0.30, 0.22)}


def accept_by_rank(alpha: float, temperature: float) -> tuple[float, ...]:
  """a_r of the positional model at the paper's alpha: alpha x the local ratio for rank r."""
  ratios = RANK_RATIOS[0 if float(temperature) == 0.0 else 1]
  return tuple(min(1.0, alpha * x) for x in ratios)


def tree_for(nodes: int, alpha: float, temperature: float, depth: int) -> tuple[int, ...]:
  """The parents of the tree of `nodes` nodes (root included) a Table-2 row is predicted with:
  the best in the positional model at this alpha, at most `depth` levels (the chain's gamma)."""
  return theory.positional_parents(nodes, accept_by_rank(alpha, temperature), max_depth=depth)


def level_widths(parents: Sequence[int]) -> list[int]:
  """Nodes per depth 0..D - 1 of the tree given by `parents`: what each of the draft's D calls
  feeds (the deepest level is drafted, never fed)."""
  depth = [0]
  for p in parents[1:]:
    depth.append(depth[p] + 1)
  return [depth.count(d) for d in range(max(depth))]


def _with_tree_slack(p: R.Placement, layout_gamma: int, nodes: int) -> R.Placement:
  """`p` with the cache a tree of `nodes` nodes needs: its slack (nodes - 1 + 2 slots) in place of
  the chain's (layout_gamma + 2) that the roofline steps were compiled with."""
  return dataclasses.replace(p, cache_len=p.cache_len + (nodes - 1) - layout_gamma)


def layout_gamma(aot: Sequence[Mapping[str, Any]]) -> int:
  """The gamma the roofline steps' caches were sized for (`steps.step_programs`: the largest
  verify block less one; 1 with no verify step)."""
  tokens = [r["tokens"] for r in R.step_records(aot) if r["kind"] == R.VERIFY]
  return max(max(tokens, default=2) - 1, 1)


def v_tree(layout: R.Layout, gamma: int, nodes: int) -> float:
  """v(N): one target call over `nodes` tree nodes / one target step (on the tree's cache)."""
  p = _with_tree_slack(layout.target, gamma, nodes)
  return R.step_cost(p, nodes).seconds(layout.chip) / layout.target_s()


def c_tree(layout: R.Layout, gamma: int, draft: str, parents: Sequence[int]) -> float:
  """A tree's draft calls / one target step: one call per level, each feeding that level's nodes
  and sampling their children (the chain's gamma x c for a tree one node wide)."""
  p = _with_tree_slack(layout.drafts[draft], gamma, len(parents))
  seconds = sum(R.step_cost(p, w).seconds(layout.chip) for w in level_widths(parents))
  return seconds / layout.target_s()


def tree_rows(layout: R.Layout, gamma: int, nodes: Sequence[int] = TREE_NODES
              ) -> list[dict[str, Any]]:
  """Each Table-2 row of `layout` (`Layout.table2`) with, per node budget, its tree's depth,
  expected tokens per call, c and v(N), and the predicted speedup (`theory.loop_speedup`)."""
  out = []
  for row in layout.table2():
    a = accept_by_rank(row["alpha"], row["temperature"])
    trees = []
    for n in nodes:
      parents = tree_for(n, row["alpha"], row["temperature"], row["gamma"])
      e = theory.tree_expected_tokens(parents, a)
      c, v = c_tree(layout, gamma, row["draft"], parents), v_tree(layout, gamma, n)
      trees.append(dict(nodes=n, depth=len(level_widths(parents)), expected_tokens=e, c=c, v=v,
                        predicted=theory.loop_speedup(e, 1.0, c + v)))
    chain_e = theory.expected_tokens(row["alpha"], row["gamma"])
    out.append(dict(row, accept_by_rank=list(a), chain_expected_tokens=chain_e, trees=trees))
  return out


def trees_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Leviathan's Table-2 rows on one layout, the chain's prediction beside the trees' (each
  cell: expected tokens per call, v(N), predicted speedup), from the paper's alpha."""
  rec = R._one(records, "roofline_trees")  # pylint: disable=protected-access
  aot = rec["metrics"]["aot"]
  layout = R.layout_of_record(rec)
  rows = tree_rows(layout, layout_gamma(aot))
  head = (["task", "draft", "T", "gamma", "paper alpha", "a_r (rank 0, 1, 2, 3)",
           "chain: tokens/call, v(gamma+1), predicted"]
          + [f"{n}-node tree: depth, tokens/call, v({n}), predicted" for n in TREE_NODES]
          + ["best tree / chain"])
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    best = max(t["predicted"] for t in r["trees"])
    short = R._short(r["draft"])  # pylint: disable=protected-access
    cells = [r["task"], short, str(r["temperature"]), str(r["gamma"]), f"{r['alpha']:.2f}",
             ", ".join(f"{a:.2f}" for a in r["accept_by_rank"]),
             f"{r['chain_expected_tokens']:.2f}, {r['v']:.4f}, {r['predicted']:.2f}x"]
    cells += [f"{t['depth']}, {t['expected_tokens']:.2f}, {t['v']:.4f}, {t['predicted']:.2f}x"
              for t in r["trees"]]
    cells.append(f"{best / r['predicted']:.2f}x")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def compiled_trees_table(records: Sequence[Mapping[str, Any]]) -> str:
  """The decode programs an AOT job compiled, trees and the chain beside them: the verify
  call's width (a tree's nodes, a chain's gamma + 1) and depth, per chip the compiler's bytes
  against the usable HBM, host transfers inside the loop."""
  head = ("program", "verify width", "depth", "per chip: arguments / temporaries / total (GiB)",
          "usable HBM (GiB)", "fits", "host transfers in the loop", "compile (s, 2-core host)")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for rec in records:
    for r in rec["metrics"]["aot"]:
      if "tree_nodes" not in r and "gamma" not in r:
        continue
      b = r.get("per_chip_bytes") or {}
      width, depth = ((r["tree_nodes"], r["tree_depth"]) if "tree_nodes" in r
                      else (r["gamma"] + 1, r["gamma"]))
      lines.append("| " + " | ".join((
          r["program"], str(width), str(depth),
          " / ".join(f"{b.get(k, 0) / R.GiB:.2f}" for k in ("arguments", "temporaries", "total")),
          f"{(r.get('hbm_bytes_per_chip') or 0) / R.GiB:.2f}",
          {True: "yes", False: "NO"}.get(r.get("fits"), "-"),
          str(r.get("host_transfers_in_loop", "-")),
          f"{r.get('compile_seconds') or 0:.0f}")) + " |")
  return "\n".join(lines)
