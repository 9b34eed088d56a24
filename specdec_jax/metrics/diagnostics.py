"""Docs tables of the diagnostic experiments' records (experiments/loop_anatomy.py --goal,
experiments/tree_bound.py): what a draft or a tree would need, or could at best give, on one
machine; the peer (scripts/compare_hf.py); drafts' acceptance probed without timing
(experiments/feature_draft_alpha.py). Why apart from `results`: those tables are of the run's
metrics.json rows; these are of other experiments' outputs, and their columns say what each is.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specdec_jax.metrics import theory


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _need(tokens: float, gamma: int, alpha: float | None | str = "derive") -> str:
  """A 'needs' cell: tokens per call and the alpha that gives them (independent positions; the
  record's where it holds one, else `theory.alpha_for_tokens`); '(none)' where more than gamma + 1
  are needed, and no count where the per-request fixed costs alone exceed the goal's time
  (loop_anatomy writes infinity)."""
  if tokens == float("inf"):
    return "none (fixed costs exceed the goal)"
  if alpha == "derive":
    alpha = theory.alpha_for_tokens(tokens, gamma)
  return f"{tokens:.2f} of {gamma + 1} " + ("(none)" if alpha is None else f"({alpha:.2f})")


def anatomy_goal_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Per loop_anatomy --goal record and gamma: tokens per call and speed as timed, with a free
  draft, the tokens per call (and alpha) a free draft and this draft would need, and what one
  draft call may cost at this draft's tokens per call (`theory.draft_call_budget`; c against the
  lone target step)."""
  head = ["record", "goal", "gamma", "tokens/call", "end to end", "with a free draft",
          "free draft needs (alpha)", "this draft needs (alpha)",
          "at its tokens/call, a draft call may cost (c)"]
  out = []
  for rec in records:
    m = rec["metrics"]
    rows = m["rows"]
    for i, key in enumerate(sorted(rows, key=lambda k: rows[k]["gamma"])):
      r = rows[key]
      budget = theory.draft_call_budget(
          r["goal"], r["tokens_per_target_call"], r["iteration_ms_free_draft"], r["gamma"],
          tokens=r["tokens_per_request"], ar_iteration=m["autoregressive_iteration_ms"],
          ar_fixed=r["autoregressive_fixed_ms"], spec_fixed=r["fixed_ms"])
      out.append([rec["name"] if i == 0 else "", f"{r['goal']:g}x" if i == 0 else "",
                  str(r["gamma"]), f"{r['tokens_per_target_call']:.2f}",
                  f"{r['speedup_end_to_end']:.2f}x",
                  f"{r['speedup_end_to_end_with_free_draft']:.2f}x",
                  _need(r["free_draft_tokens_per_call_for_goal"], r["gamma"]),
                  _need(r["tokens_per_call_for_goal"], r["gamma"], r["alpha_for_goal"]),
                  "none (free calls fall short)" if budget is None else
                  f"{budget:.2f} ms ({budget / m['lone_target_ms']:.3f})"])
  return _table(head, out)


def tree_bound_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Per tree_bound record: the best tree's bound over the best chain, with the verify as
  timed and with a flat one, and where (depth, drafted nodes) each is reached."""
  head = ["record", "draft", "timings from", "T", "best bound over the best chain",
          "at (depth, drafted nodes)", "with a flat verify (v = 1)", "at"]
  out = []
  for rec in records:
    m = rec["metrics"]
    best, flat = m["best"], m["best_flat_verify"]
    out.append([rec["name"], m["draft"], m["chain_record"], f"{m['temperature']:g}",
                f"{best['speed_over_best_chain']:.2f}x",
                f"({best['depth']}, {best['drafted_nodes']})", f"{flat['flat_verify']:.2f}x",
                f"({flat['depth']}, {flat['drafted_nodes']})"])
  return _table(head, out)


PEER_SPECULATIVE = {"hf_assisted": "assisted", "hf_prompt_lookup": "prompt lookup"}


def _draft_name(draft: str) -> str:
  """A draft's name in a cell: a trainer's `D/export` is D's name."""
  parts = [p for p in draft.split("/") if p]
  return parts[-2] if len(parts) > 1 and parts[-1] == "export" else (parts[-1] if parts else draft)


def peer_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Per scripts/compare_hf.py record and temperature: tokens per second of our loops and of
  transformers' on the same weights and prompts (one process, interleaved), each side's own
  speculative speedup, and whether every greedy output agreed. Machine and load on every row:
  the ratio to transformers moved 3.70x -> 2.42x between a loaded and a quiet machine."""
  from specdec_jax.metrics.compare import machine_label  # pylint: disable=import-outside-toplevel
  head = ["record", "task", "T", "gamma", "prompts", "ours AR", "HF plain", "AR / HF",
          "ours spec / AR", "HF speculative / plain", "greedy outputs agree", "machine", "load"]
  out = []
  for rec in records:
    m = rec["metrics"]
    for t, row in sorted(m["by_temperature"].items()):
      tps = row["tokens_per_s"]
      theirs = ", ".join(f"{label} {row[k + '_vs_hf_plain']:.2f}x"
                         for k, label in PEER_SPECULATIVE.items() if k + "_vs_hf_plain" in row)
      agree = row.get("greedy_agreement")
      out.append([rec["name"], m["task"], t, str(m["gamma"]), str(m["num_examples"]),
                  f"{tps['ours_ar']:.1f} tok/s", f"{tps['hf_plain']:.1f} tok/s",
                  f"{row['ar_vs_hf_plain']:.2f}x",
                  f"{row['ours_spec_vs_ours_ar']:.2f}x ({_draft_name(m['draft'])})",
                  theirs or "-",
                  "-" if agree is None else ("all" if all(v == 1.0 for v in agree.values())
                                             else f"min {min(agree.values()):.2f}"),
                  machine_label(rec), f"{rec['load_average'][0]:.1f}"])
  return _table(head, out)


def draft_alpha_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Per experiments/feature_draft_alpha.py record and draft: its acceptance on the same prompts
  and target in one process (no timing: counts, so the machine does not enter), with the feature
  draft's training cost from the trainer's summary. alpha of a feature draft counts its drafted
  positions only; compare tokens per target call across kinds."""
  head = ["record", "draft", "training", "T", "alpha", "accepted / drafted",
          "P(>= 1, 2, ... kept)", "tokens per target call", "target calls"]
  out = []
  for rec in records:
    m = rec["metrics"]
    for draft, row in m["rows"].items():
      train = m.get("training", {}).get(draft)
      cost = ("shipped" if train is None else
              f"{train['steps']:,} steps, {train['train_seconds'] / 60:.0f} min, "
              f"{train['target_tokens_seen'] / 1e6:.2f}M tokens")
      at_least = row.get("accept_at_least")
      out.append([rec["name"], draft, cost, f"{float(m['temperature']):g}", f"{row['alpha']:.3f}",
                  f"{row['acceptance_rate']:.3f}",
                  ", ".join(f"{x:.2f}" for x in at_least) if at_least else "-",
                  f"{row['tokens_per_target_call']:.2f}", f"{row['target_calls']:,}"])
  return _table(head, out)


def cache_update_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Per experiments/cache_update_ab.py record (one process each) and cache size: the decode
  step with the cache updated in place and with the old scatter write, compiled and timed
  interleaved in that one process, and their ratio; the machine and load of the process."""
  head = ["record", "cache slots", "in place ms/step", "scatter ms/step", "scatter / in place",
          "rounds", "machine", "load", "commit"]
  out = []
  for rec in records:
    m, mach = rec["metrics"], rec.get("machine", {})
    for i, (slots, r) in enumerate(sorted(m["slots"].items(), key=lambda kv: int(kv[0]))):
      out.append([rec["name"] if i == 0 else "", slots, f"{r['in_place_ms_per_step']:.2f}",
                  f"{r['scatter_ms_per_step']:.2f}", f"{r['scatter_over_in_place']:.3f}x",
                  str(m["rounds"]), f"{mach.get('cpu')}, {mach.get('cores')} cores, "
                  f"{mach.get('memory_read_gb_s')} GB/s" if i == 0 else "",
                  f"{rec['load_average'][0]:.1f}" if i == 0 else "",
                  str(rec.get("commit", ""))[:7] if i == 0 else ""])
  return _table(head, out)


def head_ab_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Per experiments/tied_head_ab.py record (one process each): the target's tied head (XLA's
  product over the embedding table) against it untied and packed, each loop's ms per token for
  both, untied over tied with its paired bootstrap interval over documents, each head's own
  speedup, and whether both wrote the same tokens."""
  head = ["record", "T", "documents", "loop", "tied ms/token", "untied ms/token",
          "untied over tied [95% CI]", "speedup tied / untied", "same tokens", "machine", "load",
          "commit"]
  from specdec_jax.metrics.compare import machine_label  # pylint: disable=import-outside-toplevel
  out = []
  for rec in records:
    m = rec["metrics"]
    for i, loop in enumerate(("ar", "spec")):
      r = m["untied_over_tied"][loop]
      lo, hi = r["interval95"]
      out.append([rec["name"] if i == 0 else "", f"{m['temperature']:g}" if i == 0 else "",
                  str(m["documents"]) if i == 0 else "",
                  "autoregressive" if loop == "ar" else "speculative",
                  f"{m['ms_per_token'][f'tied_{loop}']:.2f}",
                  f"{m['ms_per_token'][f'untied_{loop}']:.2f}",
                  f"{r['value']:.3f}x [{lo:.3f}, {hi:.3f}]",
                  (f"{m['speedup']['tied']['value']:.2f}x / "
                   f"{m['speedup']['untied']['value']:.2f}x") if loop == "spec" else "",
                  "yes" if m["same_tokens"][loop] else "no",
                  machine_label(rec) if i == 0 else "",
                  f"{rec['load_average'][0]:.1f}" if i == 0 else "",
                  str(rec.get("commit", ""))[:7] if i == 0 else ""])
  return _table(head, out)


def weight_floor_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Per scripts/bench_loop.py record (one process, one weight layout): the autoregressive step
  against the weight-streaming floor of the same process (bytes a step reads over the faster of
  its two bandwidth probes). The step is (t(N) - t(N/2)) / (N/2) where the record has it (no
  prefill); older records have only ms/token, prefill included, and their ratio says so."""
  head = ["record", "layout", "prompt tokens", "MiB read / step", "probe GB/s (used)", "floor ms",
          "AR step ms", "AR ms/token", "step / floor", "machine", "load", "commit"]
  from specdec_jax.metrics.compare import machine_label  # pylint: disable=import-outside-toplevel
  out = []
  for rec in records:
    m = rec["metrics"]
    floor, step = m["memory_bound_ms_per_token"], m.get("ar_step_ms")
    probes = m.get("bandwidth_probes_gb_s") or {}
    used = (", ".join(f"{k} {v:.1f}" for k, v in sorted(probes.items()))
            or f"{m['bandwidth_gb_s']:.1f}")
    out.append([rec["name"], m.get("layout", "-"), str(m.get("prompt_len", 16)),
                f"{m['decode_path_mb']:.0f}", f"{used} ({m['bandwidth_gb_s']:.1f})", f"{floor:.2f}",
                "-" if step is None else f"{step:.2f}", f"{m['ar_ms_per_token']:.2f}",
                f"{step / floor:.2f}x" if step is not None
                else f"{m['ar_ms_per_token'] / floor:.2f}x (ms/token)",
                machine_label(rec), f"{rec['load_average'][0]:.1f}",
                str(rec.get("commit", ""))[:7]])
  return _table(head, out)
