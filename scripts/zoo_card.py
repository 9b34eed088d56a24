r"""Measures the shipped zoo for its model card: target quality against trivial baselines, and the
Table-3-style alpha of every draft against its target at temperatures 0 and 1.

  python scripts/zoo_card.py                       # all of valid for quality, 128 examples for alpha
  python scripts/zoo_card.py --alpha_examples=32 --quality_examples=64   # a quick look
  python scripts/zoo_card.py --parts=quality --t5_target=runs/train/t5_target_stage2/export \
      --output=/tmp/candidate.json                   # a candidate target before it is shipped

Quality (greedy target output, valid split): sacrebleu BLEU for translate_en_de against copying the
English source; ROUGE-1/2/L for summarize against the document's first sentence (lead-1). alpha is
E[beta] = E[sum_x min(p(x), q(x))] over every drafted position of a speculative decode (gamma 4)
of the first `alpha_examples` valid prompts, from the loop's own on-device counters; the value
does not depend on gamma. Writes the figures as JSON (default: specdec_jax/assets/zoo/
zoo_eval.json) and prints the markdown tables MODEL_CARD.md quotes.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ZOO = os.path.join(ROOT, "specdec_jax", "assets", "zoo")
T5_TASKS = {"translate_en_de": dict(max_input=64, max_decode=48, metric="bleu"),
            "summarize": dict(max_input=128, max_decode=32, metric="rouge")}
T5_DRAFTS = ("t5_draft_small", "t5_draft_small_distill", "t5_draft_base", "t5_draft_large")
CODE = dict(task="code_complete", max_input=192, max_decode=64)


def _first_sentence(text: str) -> str:
  parts = re.split(r"(?<=[.!?])\s+", text.strip(), maxsplit=1)
  return parts[0]


def _source(ex) -> str:
  """The example's input without its task prefix ("translate English to German: ", ...)."""
  text = ex.inputs or ""
  return text.split(": ", 1)[1] if ": " in text[:40] else text


def _batches(n: int, size: int):
  for start in range(0, n, size):
    yield range(start, min(n, start + size))


def _load(name: str, target_params=None):
  """(model, float32 params) of a zoo model (or a checkpoint path), loaded as the runner does; a
  feature-level draft takes its target's pieces from `target_params` (checked against its
  pairing record)."""
  import jax
  from specdec_jax.checkpoints import feature_draft_io as fd_ckpt
  from specdec_jax.checkpoints import loader
  path = name if os.sep in name else os.path.join(ZOO, name)
  if fd_ckpt.is_feature_draft(path):
    fd_ckpt.check_target(path, "t5_target", target_params)
    draft, params = fd_ckpt.load(path, target_params)
    return draft, jax.device_put(params)
  return loader.load_model(path)


def _decode_texts(result, vocab, rows: int) -> list[str]:
  import numpy as np
  tokens, lengths = np.asarray(result.tokens_BxN), np.asarray(result.lengths_B)
  return [vocab.decode(tokens[i, :lengths[i]].astype(int).tolist()) for i in range(rows)]


def quality(target, params, vocab, task: str, spec: dict, n: int | None, batch: int) -> dict:
  """Greedy target output vs the task's trivial baseline on the first `n` valid examples."""
  import jax
  from specdec_jax.data import local_tasks
  from specdec_jax.decoding.decoder import Decoder, Params
  from specdec_jax.decoding.sampling import SamplingConfig
  from specdec_jax.metrics import quality as q
  examples = local_tasks.load_examples(task, "valid", n)
  ids = local_tasks.tokenize_examples(examples, vocab, spec["max_input"], truncate=True)
  preds = []
  t0 = time.perf_counter()
  for rows in _batches(len(examples), batch):
    inputs = local_tasks.batch_inputs([ids[i] for i in rows], pad_to=spec["max_input"])
    res = Decoder(target, sampling=SamplingConfig(0.0), max_decode_len=spec["max_decode"]
                  ).generate(Params(params), inputs, jax.random.key(0))
    preds += _decode_texts(res, vocab, len(rows))
  refs = [ex.reference for ex in examples]
  if spec["metric"] == "bleu":
    baseline_name, baseline = "copy source", [_source(ex) for ex in examples]
  else:
    baseline_name, baseline = "lead-1 (first sentence)", [_first_sentence(_source(ex))
                                                          for ex in examples]

  def score(keep):
    """{metric: model score, baseline_<metric>: baseline score} over the rows in `keep`."""
    p, b, r = ([xs[i] for i in keep] for xs in (preds, baseline, refs))
    if spec["metric"] == "bleu":
      return {"bleu": q.bleu(p, r), "baseline_bleu": q.bleu(b, r)}
    return {**q.rouge(p, r), **{f"baseline_{k}": v for k, v in q.rouge(b, r).items()}}

  # Rows whose source has a word-for-word twin in train (local_tasks.valid_sources_in_train)
  # flatter a model trained on train; the scores without them are kept beside the others.
  twins = set(local_tasks.valid_sources_in_train(task))
  unseen = [i for i in range(len(examples)) if i not in twins]
  scores = {**score(range(len(examples))), "num_unseen": len(unseen),
            "unseen": score(unseen)}
  return {"task": task, "num_examples": len(examples), "baseline": baseline_name, **scores,
          "seconds": time.perf_counter() - t0,
          "samples": [{"input": _source(ex), "reference": r, "prediction": p}
                      for ex, r, p in list(zip(examples, refs, preds))[:3]]}


def alpha(target, tparams, draft, dparams, vocab, task: str, spec: dict, n: int, batch: int,
          temperature: float, *, decoder_only: bool = False) -> dict:
  """alpha = sum beta / drafted positions over a gamma-4 speculative decode of `n` prompts (a
  feature-level draft with its own drafter (`decoding.drafter`): its drafted positions only,
  no bonus position)."""
  import jax
  from specdec_jax.data import local_tasks
  from specdec_jax.decoding.decoder import Decoder, Params
  from specdec_jax.decoding.speculative import Chain
  from specdec_jax.decoding.sampling import SamplingConfig
  from specdec_jax.metrics import acceptance_stats
  examples = local_tasks.load_examples(task, "valid", n)
  ids = local_tasks.tokenize_examples(examples, vocab, spec["max_input"], truncate=True,
                                      add_eos=not decoder_only)
  totals = []
  for b, rows in enumerate(_batches(len(examples), batch)):
    inputs = local_tasks.batch_inputs([ids[i] for i in rows], pad_to=spec["max_input"])
    decoder = Decoder(target, draft, Chain(4), SamplingConfig(temperature),
                      max_decode_len=spec["max_decode"])
    res = decoder.generate(Params(tparams, dparams), inputs, jax.random.key(b))
    totals.append(acceptance_stats.counters_to_dict(res.counters))
  merged = acceptance_stats.merge(totals)
  s = acceptance_stats.summarize(merged)
  return {"alpha": s["alpha"] or 0.0, "positions": merged["beta_count"],
          "acceptance_rate": s["acceptance_rate"] or 0.0,
          "tokens_per_call": merged["emitted"] / max(merged["target_calls"], 1)}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quality_examples", type=int, default=None, help="default: all of valid")
  ap.add_argument("--alpha_examples", type=int, default=128)
  ap.add_argument("--batch_size", type=int, default=32)
  ap.add_argument("--output", default=os.path.join(ZOO, "zoo_eval.json"))
  ap.add_argument("--parts", default="quality,alpha",
                  help="which to measure; the others are kept from an existing --output")
  ap.add_argument("--t5_target", default="t5_target",
                  help="the T5 target: a zoo name or a checkpoint path (a candidate before it "
                       "replaces the shipped one; write to another --output then)")
  ap.add_argument("--t5_drafts", default=",".join(T5_DRAFTS),
                  help="comma-separated T5 drafts for --parts=alpha (zoo names or checkpoint "
                       "paths; shared-encoder drafts too); --code=0 skips the code pair")
  ap.add_argument("--code", type=int, default=1, help="measure the code pair's alpha (0: skip)")
  ap.add_argument("--code_pair", default="lm_target,lm_draft",
                  help="the code pair's target and draft (zoo names or checkpoint paths; the "
                       "modern-family pair: zoo names llama_target,llama_draft)")
  ap.add_argument("--head_vocab", type=int, default=0,
                  help="restrict the T5 drafts' heads to this many tokens of their checkpoints' "
                       "head_ranking.json (checkpoints/head_ranking.py; filed as DRAFT@headK); "
                       "0: full")
  ap.add_argument("--tasks", default=",".join(T5_TASKS),
                  help="comma-separated T5 tasks for --parts=alpha")
  ap.add_argument("--temperatures", default="0,1",
                  help="comma-separated temperatures for --parts=alpha")
  ap.add_argument("--train_root", default=None,
                  help="print the training table from RUN/*/train_summary.json and exit")
  args = ap.parse_args(argv)
  if args.train_root:
    print(training_table(args.train_root))
    return 0
  from specdec_jax.data.vocabulary import default_vocabulary
  vocab = default_vocabulary()
  parts = set(args.parts.split(","))
  out = {"quality": {}, "alpha": {}, "commands": {}}
  if os.path.exists(args.output):
    with open(args.output) as f:
      out.update(json.load(f))
  command = "python scripts/zoo_card.py " + " ".join(sys.argv[1:] if argv is None else argv)
  target, tparams = _load(args.t5_target)
  for task, spec in T5_TASKS.items():
    if "quality" not in parts:
      break
    out["commands"]["quality"] = command
    out["quality"][task] = quality(target, tparams, vocab, task, spec, args.quality_examples,
                                   args.batch_size)
    print(json.dumps({k: v for k, v in out["quality"][task].items() if k != "samples"}),
          flush=True)
  t5_drafts = [d for d in args.t5_drafts.split(",") if d]
  tasks = [t for t in args.tasks.split(",") if t]
  unknown = sorted(set(tasks) - set(T5_TASKS))
  if unknown:
    raise SystemExit(f"error: unknown --tasks {unknown}; known: {sorted(T5_TASKS)}")
  pairs = [("t5_target", d, task, T5_TASKS[task], False) for d in t5_drafts for task in tasks]
  if args.code:
    code_target, code_draft = args.code_pair.split(",")
    pairs += [(code_target, code_draft, CODE["task"], CODE, True)]
  models = {"t5_target": (target, tparams)}
  if "alpha" not in parts:
    pairs = []
  else:
    out["commands"]["alpha"] = command
  for tname, dname, task, spec, decoder_only in pairs:
    for name in (tname, dname):
      if name not in models and os.path.exists(os.path.join(ZOO, name) if os.sep not in name
                                                else name):
        models[name] = _load(name, tparams)
    if tname not in models or dname not in models:
      print(f"skipping {dname}: not in {ZOO}", flush=True)
      continue
    draft_pair, label = models[dname], dname
    if args.head_vocab and not decoder_only:
      from specdec_jax.checkpoints import head_ranking
      path = dname if os.sep in dname else os.path.join(ZOO, dname)
      draft, dparams, _ = head_ranking.restrict_to_ranking(*draft_pair, path, args.head_vocab,
                                                           task)
      draft_pair = (draft, dparams)
      label = f"{dname}@head{args.head_vocab}"
    for temperature in [float(t) for t in args.temperatures.split(",")]:
      r = alpha(*models[tname], *draft_pair, vocab, task, spec, args.alpha_examples,
                args.batch_size, temperature, decoder_only=decoder_only)
      out["alpha"][f"{label}|{task}|{temperature:g}"] = r
      print(f"{label:24s} {task:16s} T={temperature:g}: alpha {r['alpha']:.3f}, "
            f"{r['tokens_per_call']:.3f} tokens per target call", flush=True)
  with open(args.output, "w") as f:
    json.dump(out, f, indent=1)
  print(markdown(out))
  return 0


def training_table(train_root: str) -> str:
  """Size, steps, tokens seen, wall time and losses per model from each run's train_summary.json
  (resumed runs add up: the trainer keeps tokens and seconds in its checkpointed state)."""
  lines = ["| model | parameters | fp32 MB | steps | target tokens seen | train wall time | "
           "final train loss | valid CE (per task) | teacher |", "|---|---|---|---|---|---|---|---|---|"]
  for name in sorted(os.listdir(train_root)):
    path = os.path.join(train_root, name, "train_summary.json")
    if not os.path.exists(path):
      continue
    with open(path) as f:
      r = json.load(f)
    ce = ", ".join(f"{k} {v:.2f}" for k, v in r.get("valid_cross_entropy", {}).items())
    lines.append(f"| {name} | {r['num_params'] / 1e6:.2f}M | {4 * r['num_params'] / 2**20:.0f} | "
                 f"{r['steps']} | {r['target_tokens_seen'] / 1e6:.2f}M | "
                 f"{r['train_seconds'] / 60:.0f} min | "
                 f"{r['final_train_metrics']['train/loss']:.3f} | {ce} | "
                 f"{os.path.basename(str(r.get('teacher'))) if r.get('teacher') else '-'} |")
  return "\n".join(lines)


def markdown(out: dict) -> str:
  """The model card's two tables from the JSON figures."""
  lines = ["| task | rows | target (greedy) | baseline | baseline score |", "|---|---|---|---|---|"]

  def row(task, r, label, n, base):
    if "bleu" in r:
      return (f"| {task}{label} | {n} | BLEU {r['bleu']:.2f} | {base} | "
              f"BLEU {r['baseline_bleu']:.2f} |")
    return (f"| {task}{label} | {n} | ROUGE-1/2/L {r['rouge1']:.1f} / {r['rouge2']:.1f} / "
            f"{r['rougeL']:.1f} | {base} | ROUGE-1/2/L {r['baseline_rouge1']:.1f} / "
            f"{r['baseline_rouge2']:.1f} / {r['baseline_rougeL']:.1f} |")

  for task, r in out["quality"].items():
    lines.append(row(task, r, "", r["num_examples"], r["baseline"]))
    if "unseen" in r and r["num_unseen"] < r["num_examples"]:
      lines.append(row(task, r["unseen"], " (source not in train)", r["num_unseen"],
                       r["baseline"]))
  # Table-3 layout: a row per (task, temperature), a column per draft; +- is the binomial standard
  # error at T=0 (beta is 0 or 1 there), a bound for T=1 (beta in [0, 1]).
  known = ["t5_draft_small", "t5_draft_base", "t5_draft_large", "t5_draft_small_distill"]
  known += sorted({k.split("|")[0] for k in out["alpha"]} - set(known) - {"lm_draft"})
  drafts = [d for d in known + ["lm_draft"] if any(k.startswith(d + "|") for k in out["alpha"])]
  if not drafts:
    return "\n".join(lines)
  lines += ["", "| task | T | " + " | ".join(drafts) + " |", "|---|---|" + "---|" * len(drafts)]
  tasks = sorted({k.split("|")[1] for k in out["alpha"]})
  for task in tasks:
    for temperature in ("0", "1"):
      cells = []
      for d in drafts:
        r = out["alpha"].get(f"{d}|{task}|{temperature}")
        if r is None:
          cells.append("-")
          continue
        se = (r["alpha"] * (1 - r["alpha"]) / max(r["positions"], 1)) ** 0.5
        cells.append(f"{r['alpha']:.3f} +- {se:.3f}")
      lines.append(f"| {task} | {temperature} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  sys.exit(main())
