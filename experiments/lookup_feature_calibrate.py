"""Chooses drafting settings on a run's held-out calibration prompts only.

Why: the lookup-or-feature drafter (`LookupFeatureDrafter`) and the adaptive chain with a
feature-level draft have knobs the cost model does not predict (`lookup_ngram`, the match
length at which prompt lookup drafts, and the feature draft's gamma; the adaptive schedule's
`gamma_max` and `confidence_threshold`); choosing them on the prompts a run then reports would
fit the report. This script loads a run config's target, drafts and prompt sets exactly as the
run does (`runner.pipeline.load`), and times, on the calibration prompts alone (the run never
reports them), the autoregressive loop, the feature draft alone at `--gammas`, each model-free draft of the config
(prompt lookup, corpus lookup, ...) at `--model_free_gammas`, and, all
interleaved in one process: with the config's `RunConfig.feature_lookup_gamma`, prompt lookup
alone at that gamma and the combined scheme over `--ngrams` x `--gammas`; with `--thresholds`,
the adaptive feature chain over `--gamma_maxes` x `--thresholds` (HF's heuristic schedule)
(`timing.interleaved`, medians of `--repeats` rounds, each round decoding every calibration
prompt in the run's batch shape). It writes one JSON: per setting the speedup over the
autoregressive loop, tokens per target call, the lookup's share of target calls and the
adaptive chain's mean proposed length.

  python experiments/lookup_feature_calibrate.py --gin_file=configs/local/code_lookup_feature.gin \
      --output=/tmp/lookup_feature_calibration.json
  python experiments/lookup_feature_calibrate.py --gin_file=configs/local/feature.gin \
      --thresholds=0.5,0.7 --gamma_maxes=4,8 --output=/tmp/adaptive_feature_calibration.json
  python experiments/lookup_feature_calibrate.py --gin_file=configs/local/smollm2_humaneval.gin \
      --gin.DRAFT="['prompt_lookup', 'corpus_lookup']" --gin.RunConfig.lookup_corpus="'C.npz'" \
      --model_free_gammas=4,6 --output=/tmp/corpus_calibration.json
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time

import jax
import numpy as np
from absl import app, flags

from specdec_jax import gin_utils, timing
from specdec_jax import run as run_lib
from specdec_jax.decoding.adaptive import AdaptiveConfig, AdaptiveStats
from specdec_jax.decoding.autoregressive import Autoregressive
from specdec_jax.decoding.lookup_feature import LookupFeatureDrafter
from specdec_jax.decoding.speculative import Chain
from specdec_jax.metrics import acceptance_stats
from specdec_jax.runner import pipeline
from specdec_jax.runner.run_config import FEATURE_DRAFT, NON_MODEL_DRAFTS

flags.DEFINE_string("output", None, "Where the JSON goes (refused if it exists).")
flags.DEFINE_list("ngrams", ["1", "2", "3"], "lookup_ngram values.")
flags.DEFINE_list("gammas", ["2", "3", "4"], "The feature draft's gammas.")
flags.DEFINE_list("thresholds", [], "The adaptive feature chain's confidence thresholds "
                  "(none: no adaptive rows).")
flags.DEFINE_list("model_free_gammas", [], "Gammas of each model-free draft's chain (none: no "
                  "model-free rows beside the combined scheme's prompt lookup).")
flags.DEFINE_list("gamma_maxes", ["8"], "The adaptive feature chain's gamma_max values.")
flags.DEFINE_bool("full_width", False, "Also time each adaptive setting verifying the whole "
                  "gamma_max block (verify_buckets=(gamma_max,): no switch over widths).")
flags.DEFINE_integer("repeats", 3, "Timed rounds (medians).")
flags.DEFINE_bool("untimed", False, "Decode each drafting program once, untimed, and report its "
                  "acceptance only (no autoregressive program; greedy outputs are checked "
                  "against the first program's): a third of the time of one timed round.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  if FLAGS.output is None or os.path.exists(FLAGS.output):
    raise app.UsageError(f"--output must name a new file, got {FLAGS.output!r}")
  cfg = run_lib.parse(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths)
  if not cfg.feature.lookup_gamma and not FLAGS.thresholds and not FLAGS.model_free_gammas:
    raise app.UsageError("nothing to calibrate: the config sets no "
                         "RunConfig.feature_lookup_gamma, --thresholds and --model_free_gammas "
                         "are empty")
  loaded = pipeline.load(cfg)
  feature = next((s for s in loaded.drafts if s.kind == FEATURE_DRAFT), None)
  if feature is None and (cfg.feature.lookup_gamma or FLAGS.thresholds):
    raise app.UsageError("feature_lookup_gamma and --thresholds need a feature-level draft "
                         "among the config's drafts")
  lookup = next((s for s in loaded.drafts if s.kind == "prompt_lookup"), None)
  cal = loaded.calibration
  batches = [jax.device_put(cal.batch(list(range(i, min(i + cfg.batch_size, len(cal.ids))))))
             for i in range(0, len(cal.ids), cfg.batch_size)]
  temperature = float(np.atleast_1d(cfg.temperature)[0])
  rng = jax.random.key(cfg.seed)

  def program(spec, scheme, drafter=None):
    decoder, params = pipeline.decoder_for(cfg, loaded, temperature, spec, scheme)
    # the scheme and drafter as given here, not the run's chain options
    decoder = dataclasses.replace(decoder, scheme=scheme, drafter=drafter)
    return lambda: [decoder.generate(params, x, rng) for x in batches]

  programs = {"autoregressive": program(None, Autoregressive())}
  if lookup is not None and cfg.feature.lookup_gamma:
    programs[f"prompt_lookup g{cfg.feature.lookup_gamma}"] = program(
        lookup, Chain(cfg.feature.lookup_gamma))
  for spec in (s for s in loaded.drafts if s.kind in NON_MODEL_DRAFTS):
    for g in map(int, FLAGS.model_free_gammas):
      programs[f"{spec.kind} g{g}"] = program(spec, Chain(g))
  for g in map(int, FLAGS.gammas) if feature is not None else ():  # the feature draft alone
    programs[f"feature_draft g{g}"] = program(feature, Chain(g))
  for n in map(int, FLAGS.ngrams) if cfg.feature.lookup_gamma else ():
    for g in map(int, FLAGS.gammas):
      programs[f"lookup_feature g{g} ngram{n}"] = program(
          feature, Chain(cfg.feature.lookup_gamma),
          LookupFeatureDrafter(draft_gamma=g, lookup_ngram=n))
  for gmax in map(int, FLAGS.gamma_maxes):
    for th in map(float, FLAGS.thresholds):
      for buckets in [None] + ([(gmax,)] if FLAGS.full_width else []):
        programs[f"adaptive gmax{gmax} threshold{th:g}{' full' if buckets else ''}"] = program(
            feature, AdaptiveConfig(gamma_max=gmax, confidence_threshold=th,
                                    verify_buckets=buckets))
  t0 = time.time()
  if FLAGS.untimed:
    results = {n: jax.block_until_ready(p()) for n, p in programs.items() if n != "autoregressive"}
    seconds = {n: float("nan") for n in results}
    reference = next(iter(results))
  else:
    results, seconds = timing.interleaved(programs, FLAGS.repeats)
    reference = "autoregressive"
  ar_s = seconds.get("autoregressive", float("nan"))
  rows = {}
  for name, outs in results.items():
    per_batch = [acceptance_stats.counters_to_dict(r.counters, None, r.stats, r.draft_stats)
                 for r in outs]
    c, calls = acceptance_stats.merge(per_batch), max(sum(d["target_calls"] for d in per_batch), 1)
    rows[name] = {"speedup": ar_s / seconds[name], "seconds": seconds[name],
                  "tokens_per_target_call": c["emitted"] / calls,
                  "lookup_share": sum(d.get("lookup_iterations", 0) for d in per_batch) / calls,
                  "alpha": c["accepted"] / max(c["drafted"], 1)}
    if temperature == 0.0:  # greedy: every program must write the autoregressive tokens
      rows[name][f"same_tokens_as_{reference}"] = all(
          np.array_equal(np.asarray(a.tokens_BxN), np.asarray(b.tokens_BxN))
          for a, b in zip(outs, results[reference]))
    if isinstance(outs[0].stats, AdaptiveStats):  # proposed lengths, every active row's iteration
      hist = sum(np.asarray(r.stats.proposed_hist, np.int64) for r in outs)
      rows[name]["mean_proposed"] = float(hist @ np.arange(len(hist)) / max(hist.sum(), 1))
    print(f"{name:32s} {rows[name]['speedup']:.3f}x  {rows[name]['tokens_per_target_call']:.2f} "
          f"tok/call  lookup {rows[name]['lookup_share']:.2f}  "
          f"proposed {rows[name].get('mean_proposed', float('nan')):.2f}")
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False).stdout.strip()
  out = {"gin_files": FLAGS.gin_file, "bindings": FLAGS.gin_bindings, "commit": commit,
         "calibration_prompts": len(cal.ids), "held_out": loaded.held_out,
         "repeats": 0 if FLAGS.untimed else FLAGS.repeats, "seconds": time.time() - t0,
         "load_average": [round(x, 2) for x in os.getloadavg()], "rows": rows}
  with open(FLAGS.output, "x") as f:
    json.dump(out, f, indent=1)


if __name__ == "__main__":
  gin_utils.run(main)  # --gin_file, --gin.NAME=VALUE as the run takes them
