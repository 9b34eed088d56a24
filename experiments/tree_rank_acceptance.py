r"""Measure a draft tree's acceptance by depth and sibling rank on local prompts, and record it.

  python experiments/tree_rank_acceptance.py --tree=4,3,2,1 --temperature=0 --temperature=1 \
      --name=tree_rank_acceptance_ende

Decodes held-out en-de prompts (the default run's calibration draw: never among its reported
prompts) with the zoo target, a draft (`--draft`: the shared draft of configs/local/default.gin by
default; a feature-level draft drafts the tree from the target's states, `FeatureDrafter`;
`--draft_panels` as the run's) and a static tree, and prints a[d][r] =
P(rank r accepted at depth d + 1 | parent kept, elder siblings rejected)
(`metrics.theory.rank_acceptance` of the decode's `TreeStats`). The TPU roofline
(`aot.roofline`, docs/roofline_tpu_v4.md) scales these rates by rank to the paper's alpha. With
--name it writes docs/results/NAME.json (`metrics.results.make_record`).
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402  pylint: disable=wrong-import-position
import numpy as np  # noqa: E402  pylint: disable=wrong-import-position

import specdec_jax as sd  # noqa: E402  pylint: disable=wrong-import-position
from specdec_jax.data import local_tasks, tasks  # noqa: E402  pylint: disable=wrong-import-position
from specdec_jax.metrics import results, theory  # noqa: E402  pylint: disable=wrong-import-position
from specdec_jax.runner import prompt_sets  # noqa: E402  pylint: disable=wrong-import-position

TARGET, DRAFT = "specdec_jax/assets/zoo/t5_target", "specdec_jax/assets/zoo/t5_shared_draft"


def held_out_prompts(count: int, seed: int) -> list[str]:
  """The `count` calibration prompts a held-out run with this seed draws (never reported)."""
  examples = tasks.load_examples("translate_en_de", "valid", None)
  sets = prompt_sets.choose(len(examples), num_examples=100, calibration_examples=count,
                            sample=True, seed=seed)
  prefix = "translate English to German: "  # the pair adds the task's prefix itself
  return [examples[i].inputs[len(prefix):] if examples[i].inputs.startswith(prefix)
          else examples[i].inputs for i in sets.calibration]


def measure(pair, prompts, tree, temperature: float, batch: int, max_new: int) -> dict:
  """One tree decode of `prompts`: its summed TreeStats and a[d][r]."""
  decoder = pair.decoder("tree", tree=tree, temperature=temperature, max_new_tokens=max_new)
  ids = pair.tokenize(prompts)
  kept, reached, calls, emitted = 0, 0, 0, 0
  for first in range(0, len(ids), batch):
    rows = ids[first:first + batch]
    rows += rows[-1:] * (batch - len(rows))
    width = -(-max(len(r) for r in rows) // 32) * 32
    x = local_tasks.batch_inputs(rows, pad_to=width)
    n = min(batch, len(ids) - first)
    out = decoder.generate(pair.params, x, jax.random.fold_in(jax.random.key(0), first))
    if n < batch:
      raise SystemExit("error: --examples must be a multiple of --batch (stats are summed)")
    kept = kept + np.asarray(out.stats.kept_rank_DxK)
    reached = reached + np.asarray(out.stats.reached_D)
    calls += int(np.asarray(out.counters.target_calls_B).sum())
    emitted += int(np.asarray(out.counters.emitted_B).sum())
  return {"temperature": temperature, "kept_rank": kept.tolist(), "reached": reached.tolist(),
          "rank_acceptance": theory.rank_acceptance(kept.tolist(), reached.tolist(), tree),
          "target_calls": calls, "tokens_per_target_call": emitted / max(calls, 1)}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--tree", default="4,3,2,1", help="branching per depth")
  ap.add_argument("--temperature", type=float, action="append")
  ap.add_argument("--examples", type=int, default=48)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--max_new_tokens", type=int, default=64)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--draft", default=DRAFT, help="a draft checkpoint of the zoo target")
  ap.add_argument("--draft_panels", default="auto", help="'auto', 'float32' or 'int8'")
  ap.add_argument("--name", default="")
  args = ap.parse_args(argv)
  tree = tuple(int(b) for b in args.tree.split(","))
  pair = sd.load(TARGET, args.draft, task="translate_en_de", head_vocab=3072,
                 draft_panels=args.draft_panels)
  prompts = held_out_prompts(args.examples, args.seed)
  rows = [measure(pair, prompts, tree, t, args.batch, args.max_new_tokens)
          for t in args.temperature or [0.0]]
  for r in rows:
    print(f"T={r['temperature']:g}: tokens/call {r['tokens_per_target_call']:.3f}; a[d][r] = "
          + "; ".join(", ".join(f"{a:.3f}" for a in row) for row in r["rank_acceptance"]))
  if not args.name:
    return 0
  metrics = {"task": "translate_en_de", "target": TARGET, "draft": args.draft, "head_vocab": 3072,
             "draft_panels": args.draft_panels,
             "tree": list(tree), "examples": args.examples, "prompts": "held-out calibration draw",
             "max_new_tokens": args.max_new_tokens, "batch": args.batch, "rows": rows}
  path = results.save_record(os.path.join(ROOT, "docs", "results"), args.name, metrics,
                             command=" ".join(sys.argv))
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
