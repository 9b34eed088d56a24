r"""Issue-7 figures: alpha per draft (Table-3 style), token-wise vs block verification, fixed vs
adaptive gamma: tokens per target call and wall-clock, per local task.

  # random presets (shows the script works; alphas of random models mean nothing):
  python scripts/bench_drafts.py --output_dir=/tmp/bench_drafts
  # the shipped zoo (any checkpoint path or preset name; model drafts as model:PATH):
  python scripts/bench_drafts.py --target=specdec_jax/assets/zoo/t5_target \
      --drafts=model:specdec_jax/assets/zoo/t5_draft_small_distill,unigram,bigram,prompt_lookup \
      --tasks=translate_en_de,summarize --num_examples=32 --batch_size=1 --output_dir=runs/bench_t5
  python scripts/bench_drafts.py --target=specdec_jax/assets/zoo/lm_target \
      --drafts=model:specdec_jax/assets/zoo/lm_draft,unigram,bigram,prompt_lookup \
      --tasks=code_complete --num_examples=32 --batch_size=1 --output_dir=runs/bench_code

For every task, temperature and draft it decodes the same prompts with:
  fixed gamma + token-wise verification (gives alpha, the Table-3 number),
  fixed gamma + block verification (temperature > 0 only; at 0 both rules are the same),
  adaptive gamma (HF schedule: +2 when all accepted, -1 otherwise, start at --gamma, up to
  --gamma_max), and for model drafts also with HF's confidence stop (--confidence_threshold),
and the autoregressive baseline, all in one process. Reported per row: alpha (mean over generated
positions of sum_x min(p, q)), acceptance rate, tokens per target call, ms per token (median of
--repeats timed calls after a compile call) and speedup over autoregressive on the same prompts.
Writes OUTPUT_DIR/bench_drafts.json and bench_drafts.md (`--render PATH.json` re-prints the
tables of a finished run).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

from specdec_jax import timing
from specdec_jax.checkpoints import loader
from specdec_jax.data import local_tasks, ngram_tables, tasks
from specdec_jax.decoding import adaptive
from specdec_jax.models import model_free
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.metrics import acceptance_stats


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--tasks", default=",".join(local_tasks.task_names()))
  ap.add_argument("--target", default="t5_test_target", help="checkpoint path or preset")
  ap.add_argument("--drafts", default="model:t5_test_draft,unigram,bigram,prompt_lookup",
                  help="comma list of model:PATH_OR_PRESET, unigram, bigram, prompt_lookup")
  ap.add_argument("--temperatures", default="0,1")
  ap.add_argument("--gammas", default="4", help="fixed draft lengths (comma list); the best of "
                  "them is the 'fixed optimal gamma' the adaptive rows are compared with")
  ap.add_argument("--gamma_max", type=int, default=8)
  ap.add_argument("--confidence_threshold", type=float, default=0.4)
  ap.add_argument("--num_examples", type=int, default=8)
  ap.add_argument("--batch_size", type=int, default=4)
  ap.add_argument("--max_decode_length", type=int, default=32)
  ap.add_argument("--max_input_length", type=int, default=128)
  ap.add_argument("--table_examples", type=int, default=20000,
                  help="training examples the unigram/bigram tables are estimated on")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--skip", default="", help="comma list of variants to skip: block, adaptive, "
                  "adaptive_conf")
  ap.add_argument("--output_dir", default=None)
  return ap.parse_args(argv)


def timed(fn, repeats: int):
  """(result, median seconds per call): the one timer (`specdec_jax.timing`), compile excluded."""
  results, seconds = timing.interleaved({0: fn}, repeats)
  return results[0], seconds[0]


def summarize(results) -> dict:
  """Counters summed over batches -> the row's numbers (`metrics.acceptance_stats`, as the run does)."""
  s = acceptance_stats.summarize(acceptance_stats.merge(acceptance_stats.counters_to_dict(r.counters)
                                            for r in results))
  return dict(alpha=s["alpha"] or 0.0, acceptance_rate=s["acceptance_rate"] or 0.0,
              tokens_per_target_call=s["tokens_per_target_call"] or 0.0, emitted=s["emitted"])


def load_task(task: str, args, target):
  examples = tasks.load_examples(task, "valid", args.num_examples)
  vocab = tasks.load_vocabulary(None, required=tasks.needs_text(examples))
  ids = tasks.tokenize(examples, vocab, model_vocab_size=target.vocab_size,
                       encoder_decoder=target.kind == "t5", max_input_length=args.max_input_length)
  width = max(len(r) for r in ids)
  batches = [local_tasks.batch_inputs(ids[i:i + args.batch_size], pad_to=width)
             for i in range(0, len(ids), args.batch_size)]
  batches = [b for b in batches if len(b) == args.batch_size] or batches[:1]  # one shape
  return vocab, batches


def load_drafts(args, target, task, vocab, preset_vocab):
  out = {}
  for spec in args.drafts.split(","):
    spec = spec.strip()
    if spec.startswith("model:"):
      path = spec[len("model:"):]
      model, params = loader.load_model(path, vocab_size=preset_vocab, seed=args.seed + 1)
      out[f"model:{os.path.basename(os.path.normpath(path))}"] = (model, params)
    else:
      draft = model_free.make_draft(spec, target)
      out[spec] = (draft, ngram_tables.draft_params(
          target, task=task, vocabulary=vocab, needs_tables=model_free.needs_tables(draft),
          max_examples=args.table_examples))
  return out


def bench_task(task: str, args, log) -> list[dict]:
  vocab_probe = tasks.load_vocabulary(None, required=False)
  preset_vocab = vocab_probe.padded_vocab_size if vocab_probe is not None else None
  target, tparams = loader.load_model(args.target, vocab_size=preset_vocab, seed=args.seed)
  vocab, batches = load_task(task, args, target)
  drafts = load_drafts(args, target, task, vocab, preset_vocab)
  skip = set(filter(None, args.skip.split(",")))
  rows = []
  for temperature in [float(t) for t in args.temperatures.split(",")]:
    sampling = SamplingConfig(temperature=temperature)
    ar_decoder = Decoder(target, sampling=sampling, max_decode_len=args.max_decode_length)

    def ar_fn(inputs, rng):
      return ar_decoder.generate(Params(tparams), inputs, rng)

    ar_results, ar_time = [], 0.0
    for i, b in enumerate(batches):
      rng = jax.random.fold_in(jax.random.key(args.seed), i)
      r, t = timed(lambda b=b, rng=rng: ar_fn(b, rng), args.repeats)
      ar_results.append(r)
      ar_time += t
    ar = summarize(ar_results)
    ar_ms = 1e3 * ar_time / max(ar["emitted"], 1)
    rows.append(dict(task=task, temperature=temperature, draft="-", variant="autoregressive",
                     gamma=0, ms_per_token=ar_ms, speedup=1.0, tokens_per_target_call=1.0))
    log(f"{task} T={temperature:g} autoregressive: {ar_ms:.2f} ms/token")
    for dname, (draft, dparams) in drafts.items():
      gammas = [int(g) for g in args.gammas.split(",")]
      g0 = min(gammas[0], args.gamma_max)
      variants = [("tokenwise", None, g) for g in gammas]
      if temperature > 0 and "block" not in skip:
        variants += [("block", None, g) for g in gammas]
      if "adaptive" not in skip:
        variants.append(("adaptive", adaptive.AdaptiveConfig(
            gamma_max=args.gamma_max, gamma_init=g0), None))
      if dname.startswith("model:") and "adaptive_conf" not in skip:
        variants.append(("adaptive+conf", adaptive.AdaptiveConfig(
            gamma_max=args.gamma_max, gamma_init=g0,
            confidence_threshold=args.confidence_threshold), None))
      for vname, acfg, gamma in variants:
        results, secs, extra = [], 0.0, {}
        decoder = Decoder(target, draft, acfg or Chain(gamma), sampling,
                          rule="tokenwise" if acfg is not None else vname,
                          max_decode_len=args.max_decode_length)
        for i, b in enumerate(batches):
          rng = jax.random.fold_in(jax.random.key(args.seed), i)
          fn = (lambda b=b, rng=rng, decoder=decoder: decoder.generate(
              Params(tparams, dparams), b, rng))
          r, t = timed(fn, args.repeats)
          if acfg is not None:
            hist = np.asarray(r.stats.proposed_hist)
            extra["mean_proposed"] = extra.get("mean_proposed", 0.0) + float(
                (hist * np.arange(len(hist))).sum())
            extra["blocks"] = extra.get("blocks", 0.0) + float(hist.sum())
          results.append(r)
          secs += t
        s = summarize(results)
        ms = 1e3 * secs / max(s["emitted"], 1)
        row = dict(task=task, temperature=temperature, draft=dname, variant=vname,
                   gamma=(f"<={args.gamma_max}" if acfg else gamma), ms_per_token=ms,
                   speedup=ar_ms / ms if ms > 0 else None, **s)
        if extra:
          row["mean_gamma"] = extra["mean_proposed"] / max(extra["blocks"], 1.0)
        rows.append(row)
        log(f"{task} T={temperature:g} {dname} {vname} gamma {row['gamma']}: alpha {s['alpha']:.3f}, "
            f"{s['tokens_per_target_call']:.2f} tokens/call, {ms:.2f} ms/token, "
            f"speedup {row['speedup']:.2f}")
  return rows


def markdown(rows) -> str:
  head = ("| task | T | draft | variant | gamma | alpha | accept | tokens/call | mean gamma | "
          "ms/token | speedup |\n|---|---|---|---|---|---|---|---|---|---|---|")
  lines = [head]
  for r in rows:
    f = lambda k, fmt="{:.3f}": fmt.format(r[k]) if r.get(k) is not None else "-"  # noqa: E731
    lines.append(f"| {r['task']} | {r['temperature']:g} | {r['draft']} | {r['variant']} | "
                 f"{r['gamma']} | {f('alpha')} | {f('acceptance_rate')} | "
                 f"{f('tokens_per_target_call', '{:.2f}')} | {f('mean_gamma', '{:.2f}')} | "
                 f"{f('ms_per_token', '{:.2f}')} | {f('speedup', '{:.2f}')} |")
  return "\n".join(lines)


def summary(rows) -> str:
  """Per task, temperature and draft: block / token-wise tokens per call at each gamma, and the
  adaptive rows against the best fixed gamma (by ms per token)."""
  out = ["| task | T | draft | block/tokenwise tokens per call | best fixed gamma (ms/token) | "
         "adaptive (ms/token, tokens/call) |", "|---|---|---|---|---|---|"]
  keys = []
  for r in rows:
    k = (r["task"], r["temperature"], r["draft"])
    if r["draft"] != "-" and k not in keys:
      keys.append(k)
  for k in keys:
    rs = [r for r in rows if (r["task"], r["temperature"], r["draft"]) == k]
    tw = {r["gamma"]: r for r in rs if r["variant"] == "tokenwise"}
    bl = {r["gamma"]: r for r in rs if r["variant"] == "block"}
    ratio = ", ".join(f"g{g}: {bl[g]['tokens_per_target_call'] / tw[g]['tokens_per_target_call']:.3f}"
                      for g in tw if g in bl) or "-"
    best = min(tw.values(), key=lambda r: r["ms_per_token"]) if tw else None
    best_s = f"{best['gamma']} ({best['ms_per_token']:.2f})" if best else "-"
    ad = "; ".join(f"{r['variant']}: {r['ms_per_token']:.2f}, {r['tokens_per_target_call']:.2f}"
                   for r in rs if r["variant"].startswith("adaptive")) or "-"
    out.append(f"| {k[0]} | {k[1]:g} | {k[2]} | {ratio} | {best_s} | {ad} |")
  return "\n".join(out)


def main(argv=None):
  if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--render":
    with open(sys.argv[2]) as f:  # re-render a finished run's tables
      rows = json.load(f)["rows"]
    print(markdown(rows) + "\n\n" + summary(rows))
    return rows
  args = parse_args(argv)
  rows = []
  t0 = time.time()
  log = lambda msg: print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)  # noqa: E731
  log(f"jax {jax.__version__} on {jax.devices()[0].platform}; target {args.target}; "
      f"drafts {args.drafts}")
  for task in args.tasks.split(","):
    rows.extend(bench_task(task.strip(), args, log))
  table = markdown(rows) + "\n\n" + summary(rows)
  print(table)
  if args.output_dir:
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "bench_drafts.json"), "w") as f:
      json.dump(dict(args=vars(args), rows=rows), f, indent=1)
    with open(os.path.join(args.output_dir, "bench_drafts.md"), "w") as f:
      f.write(table + "\n")
  return rows


if __name__ == "__main__":
  main()
