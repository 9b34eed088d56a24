r"""alpha and tokens per target call of a feature-level draft beside the shipped shared draft.

Counts, not timing: both drafts decode the same prompts with the same target at the same gamma
(both with `Chain`: the feature draft through its `FeatureDrafter`), one device, XLA's dot;
the prompts are the Table-3 analogue's (configs/local/table3_ende.gin: 100 valid prompts drawn by
SEED, calibration prompts held out as that run holds them out).

  python experiments/feature_draft_alpha.py --feature_draft=runs/train/t5_feature_draft/export \
      --output=runs/feature_eval/ende_t0_g4.json [--gamma=4 --temperature=0 --batch_size=10]

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
from specdec_jax.checkpoints import loader
from specdec_jax.data import tasks
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


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--feature_draft", required=True)
  ap.add_argument("--shared_draft", default="specdec_jax/assets/zoo/t5_shared_draft")
  ap.add_argument("--gin_file", default="configs/local/table3_ende.gin")
  ap.add_argument("--gamma", type=int, default=4)
  ap.add_argument("--temperature", type=float, default=0.0)
  ap.add_argument("--batch_size", type=int, default=10)
  ap.add_argument("--limit", type=int, default=0, help="first N measured prompts only (0: all)")
  ap.add_argument("--output", required=True)
  args = ap.parse_args()
  target, tp = loader.load_model("specdec_jax/assets/zoo/t5_target", dtype="float32")
  inputs, cfg = measured_prompts(args.gin_file, ["RunConfig.auto_calibration_examples = 8",
                                                 "TEMPERATURE = 0.0", "DRAFT = 'model'"], target)
  inputs = inputs[:args.limit] if args.limit else inputs
  sampling = SamplingConfig(temperature=args.temperature)
  fd, fp = fd_ckpt.load(args.feature_draft, tp)
  fd_ckpt.check_target(args.feature_draft, "t5_target", tp)
  shared, sp = loader.load_model(args.shared_draft, dtype="float32")
  rows, outs = {}, {}
  for name, draft, dparams, scheme in (
      ("feature_draft", fd, jax.device_put(fp), Chain(args.gamma)),
      ("t5_shared_draft", shared, sp, Chain(args.gamma))):
    dec = Decoder(target, draft, scheme, sampling, max_decode_len=cfg.max_decode_length)
    rows[name], outs[name] = decode_counts(dec, Params(tp, dparams), inputs, args.batch_size)
    print(name, json.dumps(rows[name]), flush=True)
  record = {"prompts": int(len(inputs)), "gamma": args.gamma, "temperature": args.temperature,
            "max_decode_length": cfg.max_decode_length, "seed": cfg.seed,
            "feature_draft": args.feature_draft, "shared_draft": args.shared_draft,
            "same_outputs": bool(np.array_equal(outs["feature_draft"], outs["t5_shared_draft"])),
            "rows": rows}
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1)
  print(json.dumps(record, indent=1))


if __name__ == "__main__":
  main()
