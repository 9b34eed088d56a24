r"""Side-by-side with Hugging Face: the same weights, the same prompts, one process.

  python scripts/compare_hf.py --target=smollm2-135m-instruct --task=humaneval \
      --prompt_format=chat --gamma=3 --temperatures=0 --num_examples=24 --max_new_tokens=128
  python scripts/compare_hf.py                                  # zoo en-de pair (when trained)
  python scripts/compare_hf.py --target=t5_test_target --draft=t5_test_draft   # random presets
  python scripts/compare_hf.py --task=summarize --gamma=3 --temperatures=0,1 --num_examples=16

Both of our models are exported to HF T5ForConditionalGeneration (specdec_jax.checkpoints.hf.to_hf,
v1.1 layout with an untied head) and run in float32 on CPU. Per temperature it times, prompt by
prompt at batch 1 (HF assisted generation supports T5 at batch 1 only), interleaved:
  ours AR      specdec_jax autoregressive loop        vs  HF plain   model.generate(...)
  ours spec    specdec_jax speculative loop (gamma)   vs  HF assist  model.generate(assistant_model=...)
HF assisted generation is pinned to the same draft length: num_assistant_tokens=gamma with the
'constant' schedule and assistant_confidence_threshold=0 (its default 0.4 cuts a weak draft's
proposals short). Sampling uses temperature T with top-k and top-p off on both sides (HF's default
top_k=50 is switched off). Prints tokens/s of each and the ratios; --output writes them as JSON.
Warm-up (jit compilation, first torch call) is excluded.

A fetched GGUF target (`checkpoints.fetch`, SmolLM2) is compared decoder-only: transformers loads
the very GGUF file ours was converted from (`from_pretrained(dir, gguf_file=...)`, float32), and
the systems are ours AR / ours speculative (prompt lookup, or --draft's model) beside HF plain
`generate` and HF prompt-lookup decoding (`prompt_lookup_num_tokens=gamma`), and, with a model
--draft, HF assisted generation with that very draft as the assistant (exported as a
LlamaForCausalLM by `checkpoints.hf.to_hf`, the same gamma pinned as for T5), all greedy or
sampled at T, prompt by prompt at batch 1:
  python scripts/compare_hf.py --target=smollm2-135m-instruct --draft=runs/train/smollm2_draft/export \
      --task=summarize --prompt_format=chat --gamma=3 --temperatures=0 --num_examples=8
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ZOO = "specdec_jax/assets/zoo"


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--target", default=f"{ZOO}/t5_target", help="checkpoint dir or preset name")
  p.add_argument("--draft", default=None, help="checkpoint dir or preset; default: the zoo's "
                 "t5_draft_small_distill (T5), prompt lookup (a fetched decoder-only target)")
  p.add_argument("--task", default="translate_en_de", help="local task or JSONL path")
  p.add_argument("--split", default="valid")
  p.add_argument("--num_examples", type=int, default=16)
  p.add_argument("--max_new_tokens", type=int, default=64)
  p.add_argument("--max_input_length", type=int, default=128)
  p.add_argument("--gamma", type=int, default=4)
  p.add_argument("--temperatures", default="0,1")
  p.add_argument("--repeats", type=int, default=1, help="timed passes over the prompts")
  p.add_argument("--torch_threads", type=int, default=0, help="0: torch's default")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--output", default=None, help="write the results as JSON here")
  p.add_argument("--prompt_format", default="plain", help="'chat': the tokenizer's chat template "
                 "(decoder-only targets, data/chat.py)")
  return p.parse_args(argv)


def load_pair(target_spec: str, draft_spec: str, task: str, split: str, num_examples: int,
              max_input_length: int):
  """Our (target, params), (draft, params) and fixed-width prompts [N, P] (+ their lengths)."""
  from specdec_jax.checkpoints import loader
  from specdec_jax.data import tasks
  examples = tasks.load_examples(task, split, num_examples)
  text = tasks.needs_text(examples)
  vocab = tasks.load_vocabulary(None, required=text)
  preset_vocab = vocab.padded_vocab_size if (text and vocab is not None) else None
  target = loader.load_model(target_spec, vocab_size=preset_vocab, dtype="float32")
  draft = loader.load_model(draft_spec, vocab_size=preset_vocab, dtype="float32", seed=1)
  if not target[0].config.is_encoder_decoder:
    raise SystemExit("compare_hf compares T5 (encoder-decoder) models; HF assisted generation "
                     "for decoder-only models would need a decoder-only export")
  ids = tasks.tokenize(examples, vocab if text else None, model_vocab_size=target[0].vocab_size,
                       encoder_decoder=True, max_input_length=max_input_length)
  return target, draft, ids


def to_torch(model, params, out_dir: str):
  import torch
  import transformers
  from specdec_jax.checkpoints import hf
  hf.to_hf(model.config, params, out_dir, dtype=np.float32)
  m = transformers.T5ForConditionalGeneration.from_pretrained(out_dir, dtype=torch.float32).eval()
  if m.lm_head.weight.data_ptr() == m.shared.weight.data_ptr():
    raise RuntimeError("HF tied the head to the embedding; the export would not be T5 v1.1")
  gc = m.generation_config
  gc.pad_token_id, gc.eos_token_id, gc.decoder_start_token_id = (
      model.config.pad_id, model.config.eos_id, model.config.pad_id)
  return m


def _hf_kwargs(temperature: float, max_new_tokens: int) -> dict:
  kw = dict(max_new_tokens=max_new_tokens, num_beams=1)
  if temperature > 0:
    kw.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
  else:
    kw.update(do_sample=False)
  return kw


def _hf_tokens(out, eos_id: int) -> list[int]:
  toks = out[0, 1:].tolist()  # drop the decoder start token
  if eos_id in toks:
    toks = toks[:toks.index(eos_id) + 1]
  while toks and toks[-1] == 0:
    toks.pop()
  return toks


def compare(target_spec: str, draft_spec: str, *, task: str = "translate_en_de",
            split: str = "valid", num_examples: int = 16, max_new_tokens: int = 64,
            max_input_length: int = 128, gamma: int = 4, temperatures=(0.0, 1.0),
            repeats: int = 1, torch_threads: int = 0, seed: int = 0, log=print) -> dict:
  """Times the four programs per temperature; returns {temperature: {system: stats}, ...}."""
  import jax
  import torch
  from specdec_jax.decoding.decoder import Decoder, Params
  from specdec_jax.decoding.sampling import SamplingConfig
  from specdec_jax.decoding.speculative import Chain

  if torch_threads:
    torch.set_num_threads(torch_threads)
  (tm, tp), (dm, dp), ids = load_pair(target_spec, draft_spec, task, split, num_examples,
                                      max_input_length)
  width = max(len(r) for r in ids)
  eos = tm.config.eos_id
  with tempfile.TemporaryDirectory() as tmp:
    hf_t = to_torch(tm, tp, os.path.join(tmp, "target"))
    hf_d = to_torch(dm, dp, os.path.join(tmp, "draft"))
  log(f"target {target_spec} ({sum(x.size for x in jax.tree.leaves(tp)) / 1e6:.1f}M params), "
      f"draft {draft_spec} ({sum(x.size for x in jax.tree.leaves(dp)) / 1e6:.1f}M); "
      f"{len(ids)} prompts, gamma {gamma}, max_new_tokens {max_new_tokens}, "
      f"torch threads {torch.get_num_threads()}")
  results = {"target": target_spec, "draft": draft_spec, "task": task, "gamma": gamma,
             "num_examples": len(ids), "max_new_tokens": max_new_tokens, "by_temperature": {}}
  for temperature in temperatures:
    sampling = SamplingConfig(temperature=float(temperature), top_k=0, top_p=1.0)
    hf_kw = _hf_kwargs(float(temperature), max_new_tokens)
    assist_kw = dict(assistant_model=hf_d, num_assistant_tokens=gamma,
                     num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)

    ar_decoder = Decoder(tm, sampling=sampling, max_decode_len=max_new_tokens)
    spec_decoder = Decoder(tm, dm, Chain(gamma), sampling, max_decode_len=max_new_tokens)

    def ours(decoder, params):
      return ours_system(lambda row, key: decoder.generate(params, row, key), ids,
                         lambda _: width, 0, seed)

    def hf(extra):
      return hf_system(hf_t, ids, {**hf_kw, **extra}, lambda out, i: _hf_tokens(out, eos), seed)

    systems = {"ours_ar": ours(ar_decoder, Params(tp)),
               "ours_spec": ours(spec_decoder, Params(tp, dp)), "hf_plain": hf({}),
               "hf_assisted": hf(assist_kw)}
    row = measure(systems, len(ids), repeats, "hf_assisted", float(temperature))
    results["by_temperature"][f"{float(temperature):g}"] = row
  return results


def ours_system(generate, ids, pad_to, pad_id: int, seed: int):
  """call(i, r) -> our tokens for prompt i: `generate(row_1xP, key)` on the prompt right-padded
  to `pad_to(prompt)` with `pad_id`, its output cut at its length."""
  import jax
  from specdec_jax.data.local_tasks import batch_inputs

  def call(i, r):
    row = batch_inputs([ids[i]], pad_to=pad_to(ids[i]), pad_id=pad_id)
    res = jax.block_until_ready(generate(jax.numpy.asarray(row),
                                         jax.random.key(seed * 100003 + 7 * i + r)))
    n = int(np.asarray(res.lengths_B)[0])
    return np.asarray(res.tokens_BxN)[0, :n].tolist()
  return call


def hf_system(model, ids, kwargs: dict, tokens, seed: int):
  """call(i, r) -> `tokens(model.generate(prompt i, **kwargs), i)`, seeded as ours."""
  import torch

  def call(i, r):
    torch.manual_seed(seed * 100003 + 7 * i + r)
    x = torch.tensor([ids[i]], dtype=torch.long)
    with torch.no_grad():
      out = model.generate(x, attention_mask=torch.ones_like(x), **kwargs)
    return tokens(out, i)
  return call


def measure(systems: dict, n: int, repeats: int, peer: str, temperature: float) -> dict:
  """Tokens/s of each system over prompts 0..n-1 and the ratios: per prompt a warm-up call
  (compile / first torch call) kept as the output, then the systems timed in rotating order,
  median per system (drift hits all alike). `peer`: HF's speculative system."""
  from specdec_jax import timing
  secs, toks, outputs = ({k: 0.0 for k in systems}, {k: 0 for k in systems},
                         {k: [] for k in systems})
  for i in range(n):
    first, med = timing.interleaved(
        {k: functools.partial(fn, i, 0) for k, fn in systems.items()}, max(repeats, 1),
        min_sample_s=0.0, max_calls=1)
    for k, out in first.items():
      secs[k] += med[k]
      toks[k] += len(out)
      outputs[k].append(out)
  tps = {k: toks[k] / secs[k] if secs[k] > 0 else None for k in systems}
  row = {"tokens_per_s": tps, "tokens": toks, "seconds": secs,
         f"spec_vs_{peer}": tps["ours_spec"] / tps[peer],
         "ar_vs_hf_plain": tps["ours_ar"] / tps["hf_plain"],
         "ours_spec_vs_ours_ar": tps["ours_spec"] / tps["ours_ar"],
         **{f"{k}_vs_hf_plain": tps[k] / tps["hf_plain"] for k in systems
            if k.startswith("hf_") and k != "hf_plain"}}
  if temperature == 0:
    def agree(a, b):
      return statistics.mean(float(x == y) for x, y in zip(outputs[a], outputs[b]))
    row["greedy_agreement"] = {"ours_ar=hf_plain": agree("ours_ar", "hf_plain"),
                               "ours_spec=ours_ar": agree("ours_spec", "ours_ar"),
                               **{f"{k}=hf_plain": agree(k, "hf_plain") for k in systems
                                  if k.startswith("hf_") and k != "hf_plain"}}
  return row


def table(results: dict, peer: str = "hf_assisted", label: str = "HF assist") -> str:
  lines = [f"{'T':>3}  {'ours AR':>9}  {'HF plain':>9}  {'AR/HF':>6}  {'ours spec':>9}  "
           f"{label:>9}  {'spec/HF':>7}  {'ours spec/AR':>12}  {label + '/plain':>15}"
           "   (tokens/s)"]
  for t, row in results["by_temperature"].items():
    s = row["tokens_per_s"]
    lines.append(f"{t:>3}  {s['ours_ar']:9.1f}  {s['hf_plain']:9.1f}  {row['ar_vs_hf_plain']:5.2f}x"
                 f"  {s['ours_spec']:9.1f}  {s[peer]:9.1f}  "
                 f"{row['spec_vs_' + peer]:6.2f}x  {row['ours_spec_vs_ours_ar']:11.2f}x  "
                 f"{row[peer + '_vs_hf_plain']:14.2f}x")
    if "greedy_agreement" in row:
      lines.append("     greedy output agreement: " + ", ".join(
          f"{k} {v:.2f}" for k, v in row["greedy_agreement"].items()))
  return "\n".join(lines)


def compare_decoder(target_spec: str, draft_spec: str | None, *, task: str, split: str,
                    num_examples: int, max_new_tokens: int, max_input_length: int, gamma: int,
                    temperatures, repeats: int, torch_threads: int, seed: int,
                    prompt_format: str = "plain", log=print) -> dict:
  """A fetched GGUF target (decoder-only) against transformers' load of the same file."""
  import torch
  import transformers
  from specdec_jax import api
  from specdec_jax.checkpoints import fetch
  from specdec_jax.data import tasks

  if not fetch.is_remote(target_spec):
    raise SystemExit("decoder-only comparison reads a fetched GGUF target (known: "
                     f"{sorted(fetch.REMOTE)})")
  if torch_threads:
    torch.set_num_threads(torch_threads)
  directory, remote = fetch.ensure(target_spec), fetch.REMOTE[target_spec]
  gguf_dir = os.path.join(fetch.home(), "downloads")
  data = tasks.load(task, split, num_examples, vocabulary=directory, prompt_format=prompt_format)
  ids = data.input_ids(model_vocab_size=10**9, encoder_decoder=False,
                       max_input_length=max_input_length)
  pair = api.load(target_spec, draft_spec or "prompt_lookup")
  eos, pad = pair.target.config.eos_id, pair.target.config.pad_id
  hf_t = transformers.AutoModelForCausalLM.from_pretrained(
      gguf_dir, gguf_file=remote.filename, dtype=torch.float32).eval()
  assistant = None
  if draft_spec not in (None, "prompt_lookup"):  # a model draft: HF assisted generation with it
    from specdec_jax.checkpoints import hf as hf_io, loader
    draft_model, draft_params = loader.load_model(draft_spec, dtype="float32")
    with tempfile.TemporaryDirectory() as tmp:
      hf_io.to_hf(draft_model.config, draft_params, tmp, dtype=np.float32)
      assistant = transformers.AutoModelForCausalLM.from_pretrained(
          tmp, dtype=torch.float32).eval()
  log(f"target {target_spec} (GGUF {remote.filename}), draft {draft_spec or 'prompt_lookup'}; "
      f"{len(ids)} prompts, gamma {gamma}, max_new_tokens {max_new_tokens}, torch threads "
      f"{torch.get_num_threads()}")
  results = {"target": target_spec, "draft": draft_spec or "prompt_lookup", "task": task,
             "prompt_format": prompt_format, "gamma": gamma, "num_examples": len(ids),
             "max_new_tokens": max_new_tokens, "by_temperature": {}}
  for temperature in temperatures:
    hf_kw = _hf_kwargs(float(temperature), max_new_tokens)
    decoders = {"ours_ar": pair.decoder(0, temperature=float(temperature),
                                        max_new_tokens=max_new_tokens),
                "ours_spec": pair.decoder(gamma, temperature=float(temperature),
                                          max_new_tokens=max_new_tokens)}

    def ours(decoder):
      return ours_system(lambda row, key: decoder.generate(pair.params, row, key), ids,
                         lambda r: max(16, 1 << (len(r) - 1).bit_length()), pad, seed)

    def hf(extra):
      def tokens(out, i):
        toks = out[0, len(ids[i]):].tolist()
        return toks[:toks.index(eos) + 1] if eos in toks else toks
      return hf_system(hf_t, ids, dict(hf_kw, eos_token_id=eos, pad_token_id=pad, **extra), tokens,
                       seed)

    systems = {"ours_ar": ours(decoders["ours_ar"]), "ours_spec": ours(decoders["ours_spec"]),
               "hf_plain": hf({}), "hf_prompt_lookup": hf({"prompt_lookup_num_tokens": gamma})}
    if assistant is not None:
      systems["hf_assisted"] = hf(dict(
          assistant_model=assistant, num_assistant_tokens=gamma,
          num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0))
    row = measure(systems, len(ids), repeats,
                  "hf_prompt_lookup" if assistant is None else "hf_assisted", float(temperature))
    results["by_temperature"][f"{float(temperature):g}"] = row
    log(json.dumps({k: round(v, 2) for k, v in row["tokens_per_s"].items()}))
  return results


def main(argv=None) -> dict:
  args = parse_args(argv)
  if args.output:  # refused before minutes of decoding, not after them
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
      raise SystemExit(f"error: --output {args.output}: no directory {out_dir}")
  temps = tuple(float(t) for t in args.temperatures.split(",") if t.strip())
  from specdec_jax.checkpoints import fetch
  common = dict(task=args.task, split=args.split, num_examples=args.num_examples,
                max_new_tokens=args.max_new_tokens, max_input_length=args.max_input_length,
                gamma=args.gamma, temperatures=temps, repeats=args.repeats,
                torch_threads=args.torch_threads, seed=args.seed)
  if fetch.is_remote(args.target):  # decoder-only, against transformers' load of the same GGUF
    results = compare_decoder(args.target, args.draft, prompt_format=args.prompt_format, **common)
    model_draft = args.draft not in (None, "prompt_lookup")
    print(table(results, *(("hf_assisted", "HF assist") if model_draft
                           else ("hf_prompt_lookup", "HF lookup"))))
  else:
    results = compare(args.target, args.draft or f"{ZOO}/t5_draft_small_distill", **common)
    print(table(results))
  results["kind"] = "compare_hf"  # a record's metrics (scripts/results.py record)
  if args.output:
    with open(args.output, "w") as f:
      json.dump(results, f, indent=2)
    print(f"wrote {args.output}")
  return results


if __name__ == "__main__":
  main()
