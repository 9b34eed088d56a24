r"""alpha and tokens per target call of feature-level drafts beside the shipped shared draft.

Counts, not timing: every draft decodes the same prompts with the same target at the same gamma
(`Chain`: a feature draft through its `FeatureDrafter`, by `draft_schemes.plan`), one device,
XLA's dot; the prompts are a run config's measured ones (default configs/local/table3_ende.gin:
100 valid prompts drawn by SEED, calibration prompts held out as that run holds them out).

  python experiments/feature_draft_alpha.py --feature_draft=runs/train/t5_feature_draft/export \
      --output=runs/feature_eval/ende_t0_g4.json [--gamma=4 --temperature=0 --batch_size=10]

Several drafts and both chains (the block-loss comparison, docs/feature_draft.md): name each
draft, list the schemes, drop the shared draft; rows are "NAME" (chain) and "NAME, parallel":

  python experiments/feature_draft_alpha.py --feature_draft=base=DIR_A/export,block=DIR_B/export \
      --schemes=parallel,chain --shared_draft= --gamma=3 --gin_file=configs/local/default.gin ...

A draft trained by `specdec_jax.train` has train_summary.json one level above its export: its
steps, wall time and target tokens go into the record's "training" (the table's cost column).

alpha: mean over drafted positions of sum_x min(p, q) (the shared draft's row also counts the
bonus positions, as the runner does; the feature chain scores drafted positions only).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax
import numpy as np

from specdec_jax import configurables
from specdec_jax.checkpoints import feature_draft_io as fd_ckpt
from specdec_jax.checkpoints import head_ranking, loader
from specdec_jax.data import tasks
from specdec_jax.decoding import draft_schemes
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.runner import prompt_sets
from specdec_jax.runner.inputs import Prompts


def measured_prompts(gin_file: str, bindings, target):
  """(int32 prompts [N, P], the RunConfig): the run's measured prompts, as its pipeline picks."""
  configurables.parse([gin_file], bindings)
  cfg = configurables.run_config()
  data = tasks.load(cfg.task, cfg.split, None, vocabulary=cfg.vocabulary,
                    max_input_length=cfg.max_input_length, tfds_data_dir=cfg.tfds_data_dir)
  sets = prompt_sets.choose(len(data.examples), num_examples=cfg.num_examples,
                            calibration_examples=cfg.auto.calibration_examples,
                            calibration=cfg.calibration, sample=cfg.sample_examples, seed=cfg.seed)
  chosen = list(dict.fromkeys(sets.measured + sets.calibration))
  data = dataclasses.replace(data, examples=[data.examples[i] for i in chosen])
  prompts = Prompts.tokenized(data, target, cfg.max_input_length)
  return prompts.batch(range(len(sets.measured))), cfg


def decode_counts(decoder: Decoder, params: Params, inputs_NxP: np.ndarray, batch: int):
  """Summed counters and tokens over the prompts in batches of `batch`."""
  sums, outputs, t0 = {}, [], time.perf_counter()
  for s in range(0, len(inputs_NxP), batch):
    result = decoder.generate(params, inputs_NxP[s:s + batch], jax.random.key(s))
    c = jax.device_get(result.counters)
    for name in ("drafted_B", "accepted_B", "emitted_B", "target_calls_B", "beta_sum_B",
                 "beta_count_B"):
      sums[name] = sums.get(name, 0.0) + float(np.sum(getattr(c, name)))
    per_position = np.sum(c.accepts_per_position_BxG, axis=0).astype(float)
    sums["per_position"] = sums.get("per_position", 0.0) + per_position
    outputs.append(np.asarray(result.tokens_BxN))
  return {"alpha": sums["beta_sum_B"] / max(sums["beta_count_B"], 1.0),
          "acceptance_rate": sums["accepted_B"] / max(sums["drafted_B"], 1.0),
          "tokens_per_target_call": sums["emitted_B"] / max(sums["target_calls_B"], 1.0),
          "target_calls": int(sums["target_calls_B"]), "tokens": int(sums["emitted_B"]),
          # P(at least i drafts kept in a call), i = 1..gamma: depth 1 reads the target's
          # states, deeper drafts the draft's own features
          "accept_at_least": [round(float(x) / max(sums["target_calls_B"], 1.0), 4)
                              for x in sums["per_position"]],
          "seconds": round(time.perf_counter() - t0, 1)}, np.concatenate(outputs)


SCHEMES = ("chain", "parallel")


def named_drafts(spec: str) -> dict[str, str]:
  """--feature_draft: a path (named feature_draft) or NAME=PATH,NAME=PATH."""
  items = [x for x in spec.split(",") if x]
  if len(items) == 1 and "=" not in items[0]:
    return {"feature_draft": items[0]}
  if not all("=" in x for x in items):
    raise SystemExit(f"--feature_draft: one path, or NAME=PATH entries; got {spec!r}")
  return dict(x.split("=", 1) for x in items)


def training_summary(export_dir: str) -> dict | None:
  """The trainer's train_summary.json beside the export's parent, if there is one."""
  path = os.path.join(os.path.dirname(os.path.normpath(export_dir)), "train_summary.json")
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--feature_draft", required=True)
  ap.add_argument("--shared_draft", default="specdec_jax/assets/zoo/t5_shared_draft",
                  help="the chain draft beside them ('' for none)")
  ap.add_argument("--schemes", default="chain",
                  help=f"comma list of a feature draft's chains: {', '.join(SCHEMES)}")
  ap.add_argument("--gin_file", default="configs/local/table3_ende.gin")
  ap.add_argument("--head_vocab", type=int, default=0,
                  help="restrict each feature draft's head to this many ids (0: the full head)")
  ap.add_argument("--head_ranking", default="specdec_jax/assets/zoo/t5_shared_draft",
                  help="the directory whose head_ranking.json ranks them (the run's task)")
  ap.add_argument("--gamma", type=int, default=4)
  ap.add_argument("--temperature", type=float, default=0.0)
  ap.add_argument("--batch_size", type=int, default=10)
  ap.add_argument("--limit", type=int, default=0, help="first N measured prompts only (0: all)")
  ap.add_argument("--output", required=True)
  args = ap.parse_args()
  drafts = named_drafts(args.feature_draft)
  schemes = [x for x in args.schemes.split(",") if x]
  if not schemes or any(x not in SCHEMES for x in schemes):
    raise SystemExit(f"--schemes: a comma list of {SCHEMES}; got {args.schemes!r}")
  target, tp = loader.load_model("specdec_jax/assets/zoo/t5_target", dtype="float32")
  inputs, cfg = measured_prompts(args.gin_file, ["RunConfig.auto_calibration_examples = 8",
                                                 "TEMPERATURE = 0.0", "DRAFT = 'model'"], target)
  inputs = inputs[:args.limit] if args.limit else inputs
  sampling = SamplingConfig(temperature=args.temperature)
  candidates, training = [], {}
  for name, path in drafts.items():
    fd, fp = fd_ckpt.load(path, tp)
    fd_ckpt.check_target(path, "t5_target", tp)
    if args.head_vocab:
      fd, fp, _ = head_ranking.restrict_to_ranking(fd, fp, args.head_ranking, args.head_vocab,
                                                   cfg.task)
    for kind in schemes:
      row = name if kind == "chain" else f"{name}, {kind}"
      scheme, drafter = draft_schemes.plan(fd, args.gamma, parallel=kind == "parallel")
      candidates.append((row, fd, jax.device_put(fp), scheme, drafter))
      summary = training_summary(path)
      if summary is not None:
        training[row] = summary
  if args.shared_draft:
    shared, sp = loader.load_model(args.shared_draft, dtype="float32")
    candidates.append((os.path.basename(os.path.normpath(args.shared_draft)), shared, sp,
                       Chain(args.gamma), None))
  rows, outs = {}, {}
  for name, draft, dparams, scheme, drafter in candidates:
    dec = Decoder(target, draft, scheme, sampling, max_decode_len=cfg.max_decode_length,
                  drafter=drafter)
    rows[name], outs[name] = decode_counts(dec, Params(tp, dparams), inputs, args.batch_size)
    print(name, json.dumps(rows[name]), flush=True)
  first = next(iter(outs.values()))
  record = {"prompts": int(len(inputs)), "gamma": args.gamma, "temperature": args.temperature,
            "max_decode_length": cfg.max_decode_length, "seed": cfg.seed,
            "gin_file": args.gin_file, "feature_drafts": drafts, "schemes": schemes,
            "head_vocab": args.head_vocab or None,
            "head_ranking": args.head_ranking if args.head_vocab else None,
            "shared_draft": args.shared_draft or None,
            # T = 0: every draft must give the target's greedy output (a check, not a result)
            "same_outputs": all(np.array_equal(first, o) for o in outs.values()),
            "rows": rows, "training": training}
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1)
  print(json.dumps(record, indent=1))


if __name__ == "__main__":
  main()
