r"""The most any draft tree could gain over the best chain on the machine a run was timed on.

  python experiments/tree_bound.py --chain_record=main_ende_t0_after_int8 \
      --rank_record=tree_rank_acceptance_ende --temperature=0 [--record=tree_bound_ende_t0]

Why: a tree is measured against the chain of the same draft (issue 29 asks for 1.15x its speed),
and a slow tree may be a bad shape or a machine whose verify is not flat. This separates the two
from measurements only (no decode): for every depth D the chain record timed and every number of
drafted nodes N,
- tokens: `theory.tree_tokens_bound(N + 1, a[d][r], D)`, more than ANY tree of N drafted nodes and
  depth <= D keeps per call under the rank acceptance a[d][r] that `--rank_record`
  (experiments/tree_rank_acceptance.py, held-out prompts) measured at `--temperature` (only the
  ranks its probe tree tried; at most as many children a node as its widest level);
- time: at least the depth-D chain's measured loop iteration (`loop_costs.iteration_ms`, held-out
  prompts: a tree of depth D makes D draft calls as that chain does, each over more rows) plus the
  wider verify, (v(N + 1) - v(D + 1)) x the autoregressive iteration (the run's lone `v_curve`; a
  width past the curve takes its last entry, a non-monotone curve its smallest value at that width
  or wider). Nothing is charged for the tree's own glue (its attention mask, path commit, per-node
  sampling), which is real: the bound is generous to trees.
Their ratio against the best chain's tokens per millisecond (its timed iteration; its tokens the
lower of its calibration decode's and the same rates' rank-0 path, `chain_tokens`) bounds the
tree's speed over the chain's per iteration, for trees whose nodes are taken by sibling rank
(static, or per iteration from these rates; not a dynamic tree that follows the draft's
confidence, and under the positional model's independence of ranks across depths); per-request fixed costs only pull an end-to-end ratio towards 1. The
`flat_verify` column is the same with v = 1 at every width: what a verify as flat as a TPU v4's
(docs/roofline_tpu_v4.md) would allow with this draft's costs. `--record NAME` writes
docs/results/NAME.json (its load: the chain record's, whose timings it uses).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from specdec_jax.metrics import results, theory  # noqa: E402  pylint: disable=wrong-import-position

RESULTS = os.path.join(ROOT, "docs", "results")


def _load(name: str) -> dict:
  path = os.path.join(RESULTS, f"{name}.json")
  if not os.path.exists(path):
    raise SystemExit(f"error: no results record {path}")
  with open(path) as f:
    return json.load(f)


def verify_floor(v_curve: dict[int, float], tokens: int) -> float:
  """The least v(T) may be at `tokens` given the measured curve: its smallest value at that
  width or wider (a wider verify costs at least as much); past the curve, its last entry."""
  widths = sorted(v_curve)
  return min(v_curve[w] for w in widths if w >= min(tokens, widths[-1]))


def chain_tokens(accept, loop: dict) -> dict[int, float]:
  """{gamma: tokens per call} of each timed chain, the lower of what its calibration decode wrote
  and what the same a[d][r] as the trees' gives it (the rank-0 path; `theory.tree_expected_tokens`).
  Why the lower: the two are different decodes (a tree's iterations start at other positions, so
  its rates are another sample), and scoring the chain low keeps the ratio an upper bound; the
  same rates on both sides also make a tree that is the chain come out at 1.00x."""
  out = {}
  for g, t in loop["tokens_per_iteration"].items():
    if str(g).isdigit():
      from_rates = theory.tree_expected_tokens([-1] + list(range(int(g))), accept)
      out[int(g)] = min(float(t), from_rates)
  return out


def bound_rows(accept, loop: dict, v_curve: dict[int, float], max_nodes: int,
               measured=None) -> list[dict]:
  """One row per (depth, drafted nodes): the tokens bound, the iteration floor and both ratios,
  against the best chain as `chain_tokens` scores it."""
  iteration = {int(g): float(ms) for g, ms in loop["iteration_ms"].items() if str(g).isdigit()}
  tokens = chain_tokens(accept, loop)
  ar_ms = float(loop["ar_ms"])
  best_chain = max(tokens[g] / iteration[g] for g in iteration)
  rows = []
  for depth in sorted(iteration):
    for nodes in range(depth, max_nodes + 1):
      e = theory.tree_tokens_bound(nodes + 1, accept, depth, measured)
      floor = iteration[depth] + max(
          0.0, verify_floor(v_curve, nodes + 1) - verify_floor(v_curve, depth + 1)) * ar_ms
      rows.append({"depth": depth, "drafted_nodes": nodes, "tokens_bound": e,
                   "iteration_floor_ms": floor, "speed_over_best_chain": e / floor / best_chain,
                   "flat_verify": e / iteration[depth] / best_chain})
  return rows


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--chain_record", required=True,
                  help="a benchmark record with loop_costs and v_curve (held-out timings)")
  ap.add_argument("--rank_record", default="tree_rank_acceptance_ende")
  ap.add_argument("--temperature", type=float, default=0.0)
  ap.add_argument("--max_nodes", type=int, default=16, help="drafted nodes at most")
  ap.add_argument("--record", default="")
  args = ap.parse_args(argv)
  if args.max_nodes < 1:
    raise SystemExit(f"error: --max_nodes must be >= 1, got {args.max_nodes}")
  chain, ranks = _load(args.chain_record), _load(args.rank_record)
  m = chain["metrics"]
  if "loop_costs" not in m or "v_curve" not in m:
    raise SystemExit(f"error: {args.chain_record} has no loop_costs / v_curve (a benchmark run "
                     "with GAMMA='auto' or a timed loop records them)")
  if float(m["temperature"]) != args.temperature:
    raise SystemExit(f"error: {args.chain_record} decoded at T = {m['temperature']}, not "
                     f"--temperature={args.temperature:g}")
  drafts = [os.path.basename(str(x).rstrip("/")) for x in (m.get("draft"),
                                                            ranks["metrics"].get("draft"))]
  if drafts[0] != drafts[1]:
    raise SystemExit(f"error: {args.chain_record} timed the draft {drafts[0]!r}, "
                     f"{args.rank_record} measured {drafts[1]!r}")
  row = [r for r in ranks["metrics"]["rows"] if float(r["temperature"]) == args.temperature]
  if not row:
    raise SystemExit(f"error: {args.rank_record} has no row at T = {args.temperature:g}")
  accept = row[0]["rank_acceptance"]
  v_curve = {int(k): float(x) for k, x in m["v_curve"].items()}
  probe = ranks["metrics"]["tree"]  # the probe's children per depth: the ranks it measured
  rows = bound_rows(accept, m["loop_costs"], v_curve, args.max_nodes, probe)
  best = max(rows, key=lambda r: r["speed_over_best_chain"])
  flat = max(rows, key=lambda r: r["flat_verify"])
  for r in rows:
    print(f"depth {r['depth']} nodes {r['drafted_nodes']:2d}: tokens <= {r['tokens_bound']:.3f}, "
          f"iteration >= {r['iteration_floor_ms']:.3f} ms, speed over the best chain <= "
          f"{r['speed_over_best_chain']:.3f} (flat verify {r['flat_verify']:.3f})")
  print(f"best: depth {best['depth']}, {best['drafted_nodes']} nodes, <= "
        f"{best['speed_over_best_chain']:.3f}x the best chain; with a flat verify: depth "
        f"{flat['depth']}, {flat['drafted_nodes']} nodes, <= {flat['flat_verify']:.3f}x")
  if args.record:
    metrics = {"chain_record": args.chain_record, "rank_record": args.rank_record,
               "temperature": args.temperature, "draft": m.get("draft"), "probe": probe,
               "task": m.get("task"), "max_nodes": args.max_nodes, "rank_acceptance": accept,
               "chain_tokens": {str(g): t for g, t in chain_tokens(accept, m["loop_costs"]).items()},
               "rows": rows, "best": best, "best_flat_verify": flat}
    path = results.save_record(RESULTS, args.record, metrics, command="python " + " ".join(
        ["experiments/tree_bound.py"] + sys.argv[1:]), load=chain["load_average"])
    print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
