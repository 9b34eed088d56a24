r"""Where a speculative iteration's time goes, inside the decode loop: the draft model's calls,
the verify's growth with its width, and the loop's own glue.

Why: lone `extend` timings (the cost model's c and v) time a model call with its weights hot in
cache and nothing around it. Inside the loop each draft call comes after the target's, and each
drafted token also pays for sampling, its q row, acceptance and counting over the vocabulary.
Which of those a speedup is waiting on decides what to build next (a cheaper draft step, a
wider verify, a leaner loop); this script measures it instead of guessing.

How: on a run config's calibration prompts (held out: never the prompts a run reports), in one
process, interleaved (`timing.interleaved`, medians of `--repeats` rounds), it times
- the autoregressive loop;
- per gamma, the chain with the run's model draft;
- per gamma, the same chain with a FREE draft: the same model, whose `extend` returns one-hot
  logits computed from the fed tokens (no weights read), so the loop runs the same glue over the
  same shapes at no model cost.
Each program is timed uncapped and at 0 iterations (`Decoder.generate(max_iterations=...)`, as
`runner.costs.measure_loops` does), so the per-request fixed costs drop out: T = (uncapped -
capped) / iterations. Then per gamma:
  draft_ms  = T(model draft) - T(free draft)      the draft's calls inside the loop
  verify_ms = (v(gamma + 1) - 1) x target step    the verify's growth (lone extends)
  glue_ms   = T(free draft) - T(autoregressive) - verify_ms
beside the lone-extend draft step (`runner.costs.measure`, weights hot). The capped (0-iteration)
times are the per-request fixed costs F (encoder, prefills); with them and N (autoregressive
iterations per request) each row also gives the end-to-end speedup, `theory.loop_speedup`, for
the model draft and the free one, and with `--goal=S` the tokens per call a free draft would need
at that gamma to reach S end to end: N T_free / ((F_ar + N T_ar) / S - F_free). Where that
exceeds gamma + 1 no draft, however cheap and accurate, reaches S at that gamma on this machine.
With the model draft's own iteration instead (its calls as timed here), the tokens per call it
would need and the alpha that gives them with independent positions (`alpha_for_goal`,
`theory.alpha_for_tokens`; None: more than gamma + 1); docs/results.md's table adds, at the
model draft's own tokens per call, the most one draft call may cost for S
(`theory.draft_call_budget`). Token drafts only: a feature-level draft
has no free twin, and its rows carry no end-to-end figures.

  python experiments/loop_anatomy.py --gin_file=configs/local/default.gin --gammas=1,2,4 \
      --output=/tmp/loop_anatomy.json [--record=NAME]

`--general_path` also times each chain through the general path (q rows, draws, residuals)
beside the temperature-0 token-id path `speculative.Chain` takes, in the same rounds.
`--trees="2;2,1"` also times static trees (`TreeScheme`, branchings separated by ';'; with
`--general_path`, each beside its general path: the verifier passed as the function
`verify.greedy`). A feature-level draft's config (configs/local/feature.gin) times its
`FeatureDrafter` (chains and trees); it has no free twin, so its rows hold the iteration, the
tokens per call and the general path only.

`--record NAME` also writes docs/results/NAME.json (a results record; `--load` / `--commit` as
`scripts/results.py record` takes them).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specdec_jax import gin_utils, timing
from specdec_jax import run as run_lib
from specdec_jax.decoding import acceptance as acc
from specdec_jax.decoding.autoregressive import Autoregressive
from specdec_jax.decoding.drafter import is_feature_draft
from specdec_jax.decoding.speculative import Chain
from specdec_jax.decoding.tree import TreeScheme, verify
from specdec_jax.metrics import results as results_lib, theory
from specdec_jax.runner import costs as costs_lib, drafts as drafts_lib, pipeline

FLAGS = flags.FLAGS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def define_flags() -> None:
  """The script's flags, defined when it runs (not when a test imports `free_draft`: absl
  refuses a flag name another module defined, and `--output` is common)."""
  flags.DEFINE_string("output", None, "Where the JSON goes (refused if it exists).")
  flags.DEFINE_list("gammas", ["1", "2", "4"], "Chain gammas to take apart.")
  flags.DEFINE_integer("num_prompts", 24, "Calibration prompts decoded per timed call (the "
                       "first of the run's held-out calibration set; 0: all).")
  flags.DEFINE_integer("repeats", 5, "Timed rounds (medians).")
  flags.DEFINE_bool("general_path", False, "Also time each chain through its general path (the "
                    "run's rule registered under another name: at temperature 0 the chain's "
                    "token-id path is then not taken), side by side.")
  flags.DEFINE_list("trees", [], "Static tree branchings to time, ';'-separated (e.g. "
                    "'2;2,1'); none by default.")
  flags.DEFINE_float("goal", 0.0, "> 0: also the tokens per call a free draft would need at "
                     "each gamma for this end-to-end speedup (fixed costs included).")
  flags.DEFINE_string("record", None, "Also write docs/results/RECORD.json.")
  flags.DEFINE_string("load", None, "The load average for the record ('l1,l5,l15'; default: "
                      "read at the end).")
  flags.DEFINE_string("commit", None, "The commit for the record (default: HEAD).")


def parse_trees(text: str) -> list[tuple[int, ...]]:
  """'2;2,1' -> [(2,), (2, 1)] (the --trees flag, whose commas absl splits and we rejoin)."""
  trees = []
  for part in filter(None, (p.strip() for p in text.replace(" ", "").split(";"))):
    try:
      branching = tuple(int(x) for x in part.split(",") if x)
    except ValueError:
      branching = ()
    if not branching or min(branching) < 1:
      raise app.UsageError(f"--trees: each tree is a branching of positive integers such as "
                           f"'2,1', got {part!r}")
    trees.append(branching)
  return trees


def free_draft(draft):
  """`draft` whose `extend` reads no weights: logits one-hot at a token computed from the fed
  tokens and the cache index (data, so nothing downstream folds to a constant), the cache
  index moved as a real call moves it. Same type, same fields: the loop builds the same
  program around it."""
  cls = type(draft)

  def extend(self, params, cache, tokens_BxT):
    del params
    v = self.vocab_size
    hot_BxTx1 = (tokens_BxT[..., None] * 7 + cache.index_B[:, None, None] + 3) % v
    logits_BxTxV = jnp.where(jnp.arange(v) == hot_BxTx1, 1.0, -1.0).astype(jnp.float32)
    return logits_BxTxV, cache.replace(index_B=cache.index_B + tokens_BxT.shape[1])

  free_cls = type(f"Free{cls.__name__}", (cls,), {"extend": extend})
  return free_cls(**{f.name: getattr(draft, f.name) for f in dataclasses.fields(draft)})


def main(argv):
  del argv
  if FLAGS.output is None or os.path.exists(FLAGS.output):
    raise app.UsageError(f"--output must name a new file, got {FLAGS.output!r}")
  gammas = sorted({int(g) for g in FLAGS.gammas})
  if not gammas or gammas[0] < 1:
    raise app.UsageError(f"--gammas must be integers >= 1, got {FLAGS.gammas}")
  cfg = run_lib.parse(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths)
  loaded = pipeline.load(cfg)
  models = [s for s in loaded.drafts if s.kind in (drafts_lib.MODEL_DRAFT,
                                                    drafts_lib.FEATURE_DRAFT)]
  if not models:
    raise app.UsageError("the config has no model draft (DRAFT = 'model', or a feature-level "
                         "draft's checkpoint) to take apart")
  spec = models[0]
  draft, draft_params = loaded.drafts[spec]
  cal = loaded.calibration
  ids = list(range(len(cal.ids) if FLAGS.num_prompts <= 0 else min(FLAGS.num_prompts,
                                                                     len(cal.ids))))
  batches = [jax.device_put(cal.batch(ids[i:i + cfg.batch_size]))
             for i in range(0, len(ids), cfg.batch_size)]
  temperature = float(np.atleast_1d(cfg.temperature)[0])
  rng = jax.random.key(cfg.seed)
  full, zero = jnp.int32(cfg.max_decode_length + 1), jnp.int32(0)

  programs = {}

  def add(name, spec_, scheme, swap=None, rule=None):
    decoder, params = pipeline.decoder_for(cfg, loaded, temperature, spec_, scheme)
    if swap is not None:
      decoder = dataclasses.replace(decoder, draft=swap(decoder.draft))
    if rule is not None:
      decoder = dataclasses.replace(decoder, rule=rule)
    for cap_name, cap in (("full", full), ("zero", zero)):
      programs[(name, cap_name)] = (lambda d=decoder, p=params, c=cap:
                                    [d.generate(p, x, rng, max_iterations=c) for x in batches])

  add("autoregressive", None, Autoregressive())
  general = f"_{cfg.rule}_general_path"
  feature = is_feature_draft(draft)
  trees = parse_trees(",".join(FLAGS.trees))
  with contextlib.ExitStack() as stack:
    if FLAGS.general_path:
      stack.enter_context(acc.registered_rule(general, acc.get_rule(cfg.rule)))
    for g in gammas:
      add(f"g{g} model", spec, Chain(g))
      if not feature:
        add(f"g{g} free", spec, Chain(g), swap=free_draft)
      if FLAGS.general_path:
        add(f"g{g} general", spec, Chain(g), rule=general)
    for b in trees:
      add(f"tree{b} model", spec, TreeScheme(b))
      if FLAGS.general_path:
        add(f"tree{b} general", spec, TreeScheme(b, verify.greedy))
    t0 = time.time()
    outs, seconds = timing.interleaved(programs, FLAGS.repeats)
  lone = costs_lib.measure(loaded.target, loaded.target_params, {spec: (draft, draft_params)},
                           batches[0], list(range(1, max(gammas) + 2)), repeats=10,
                           max_decode_len=cfg.max_decode_length)[spec]

  def per_iteration(name):
    iters = sum(int(r.counters.target_calls_B.sum()) for r in outs[(name, "full")])
    emitted = sum(int(r.counters.emitted_B.sum()) for r in outs[(name, "full")])
    ms = 1e3 * max(seconds[(name, "full")] - seconds[(name, "zero")], 0.0)  # all batches
    return ms / max(iters, 1), emitted / max(iters, 1)

  def end_to_end(row, g, name, model_ms, free_ms, tokens):
    """The same with the per-request fixed costs (theory.loop_speedup with N), for the model
    draft and the free one, and with --goal the tokens per call a free draft would need."""
    free_fixed = fixed_ms(f"{name} free")
    total_ar = ar_fixed + n * ar_ms
    row.update(autoregressive_fixed_ms=ar_fixed, fixed_ms=fixed_ms(f"{name} model"),
               fixed_ms_free_draft=free_fixed, tokens_per_request=n,
               speedup_end_to_end=theory.loop_speedup(tokens, ar_ms, model_ms, tokens=n,
                                                      ar_fixed=ar_fixed,
                                                      spec_fixed=fixed_ms(f"{name} model")),
               speedup_end_to_end_with_free_draft=theory.loop_speedup(
                   tokens, ar_ms, free_ms, tokens=n, ar_fixed=ar_fixed, spec_fixed=free_fixed))
    line = (f"  end to end {row['speedup_end_to_end']:.2f}x, with a free draft "
            f"{row['speedup_end_to_end_with_free_draft']:.2f}x")
    if FLAGS.goal > 0:
      def needed(iteration_ms, fixed):  # tokens per call for the goal: N T / (ms left for N)
        room = total_ar / FLAGS.goal - fixed
        return n * iteration_ms / room if room > 0 else float("inf")
      need, model_need = needed(free_ms, free_fixed), needed(model_ms, row["fixed_ms"])
      row.update(goal=FLAGS.goal, free_draft_tokens_per_call_for_goal=need,
                 goal_reachable_with_free_draft=bool(need <= g + 1),
                 tokens_per_call_for_goal=model_need,
                 alpha_for_goal=theory.alpha_for_tokens(model_need, g))
      line += (f"; a free draft needs {need:.2f} tokens per call (at most {g + 1}) for "
               f"{FLAGS.goal:g}x, this draft's calls {model_need:.2f}")
    print(line)

  def add_general(row, name, model_ms, tokens):
    """The general path's iteration beside this path's (the same decode, bit for bit)."""
    if not FLAGS.general_path:
      return
    general_ms, general_tokens = per_iteration(f"{name} general")
    assert general_tokens == tokens, (general_tokens, tokens)
    row.update(iteration_ms_general_path=general_ms, general_over_this_path=general_ms / model_ms)
    print(f"  general path {general_ms:.3f} ms per iteration ({general_ms / model_ms:.3f}x "
          f"this path's)")

  def fixed_ms(name):  # a request's cost with no iteration (encoder, prefills), per batch
    return 1e3 * seconds[(name, "zero")] / len(batches)

  ar_ms, _ = per_iteration("autoregressive")
  ar_fixed = fixed_ms("autoregressive")
  n = sum(int(r.counters.target_calls_B.sum()) for r in outs[("autoregressive", "full")]
          ) / len(batches)  # autoregressive iterations per batch: N of theory.loop_speedup
  rows = {}
  print(f"autoregressive iteration {ar_ms:.3f} ms; lone extends: target {lone.target_ms:.3f} ms, "
        f"draft {lone.draft_ms:.3f} ms (c {lone.c:.3f})")
  for g in gammas:
    model_ms, tokens = per_iteration(f"g{g} model")
    if feature:
      rows[f"gamma{g}"] = {"gamma": g, "iteration_ms": model_ms, "tokens_per_target_call": tokens,
                           "speedup_without_fixed_costs": tokens * ar_ms / model_ms}
      print(f"gamma {g}: iteration {model_ms:.3f} ms, {tokens:.2f} tokens/call, "
            f"{tokens * ar_ms / model_ms:.2f}x")
      add_general(rows[f"gamma{g}"], f"g{g}", model_ms, tokens)
      continue
    free_ms, _ = per_iteration(f"g{g} free")
    verify_ms = (lone.v[g + 1] - 1.0) * lone.target_ms
    draft_ms = model_ms - free_ms
    glue_ms = free_ms - ar_ms - verify_ms
    rows[f"gamma{g}"] = {
        "gamma": g, "iteration_ms": model_ms, "iteration_ms_free_draft": free_ms,
        "tokens_per_target_call": tokens, "draft_ms_per_iteration": draft_ms,
        "draft_ms_per_call": draft_ms / g, "verify_growth_ms": verify_ms, "glue_ms": glue_ms,
        "glue_ms_per_drafted_token": glue_ms / g, "v": lone.v[g + 1],
        "speedup_without_fixed_costs": tokens * ar_ms / model_ms,
        "speedup_with_free_draft": tokens * ar_ms / free_ms}
    print(f"gamma {g}: iteration {model_ms:.3f} ms (free draft {free_ms:.3f}), {tokens:.2f} "
          f"tokens/call; draft {draft_ms:.3f} ms/iteration ({draft_ms / g:.3f} per call); "
          f"verify growth {verify_ms:.3f}; glue {glue_ms:.3f} ({glue_ms / g:.3f} per drafted "
          f"token); {rows[f'gamma{g}']['speedup_without_fixed_costs']:.2f}x, with a free draft "
          f"{rows[f'gamma{g}']['speedup_with_free_draft']:.2f}x")
    end_to_end(rows[f"gamma{g}"], g, f"g{g}", model_ms, free_ms, tokens)
    add_general(rows[f"gamma{g}"], f"g{g}", model_ms, tokens)
  for b in trees:
    model_ms, tokens = per_iteration(f"tree{b} model")
    row = rows[f"tree{b}"] = {"tree": list(b), "iteration_ms": model_ms,
                              "tokens_per_target_call": tokens,
                              "speedup_without_fixed_costs": tokens * ar_ms / model_ms}
    print(f"tree {b}: iteration {model_ms:.3f} ms, {tokens:.2f} tokens/call, "
          f"{row['speedup_without_fixed_costs']:.2f}x")
    add_general(row, f"tree{b}", model_ms, tokens)
  metrics = {"gin_files": FLAGS.gin_file, "bindings": FLAGS.gin_bindings, "draft": spec.name,
             "temperature": temperature, "prompts": len(ids), "held_out": loaded.held_out,
             "repeats": FLAGS.repeats, "seconds": time.time() - t0,
             "autoregressive_iteration_ms": ar_ms, "autoregressive_fixed_ms": ar_fixed,
             "tokens_per_request": n, "lone_target_ms": lone.target_ms,
             "lone_draft_ms": lone.draft_ms, "lone_c": lone.c,
             "lone_v": {str(k): v for k, v in sorted(lone.v.items())}, "rows": rows}
  with open(FLAGS.output, "x") as f:
    json.dump(metrics, f, indent=1)
  if FLAGS.record:
    path = results_lib.save_record(os.path.join(ROOT, "docs", "results"), FLAGS.record, metrics,
                                   command=" ".join(["python", "experiments/loop_anatomy.py"]
                                                    + sys.argv[1:]),
                                   commit=FLAGS.commit, load=FLAGS.load)
    print(f"wrote {path}")


if __name__ == "__main__":
  define_flags()
  gin_utils.run(main)
