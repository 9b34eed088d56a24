r"""Exactness check: does speculative decoding sample what the target alone samples?

  python -m specdec_jax.check_exactness --gin_file=configs/local/smoke.gin \
      --gin.TEMPERATURE=0.5 --num_samples=20000 --num_tokens=2

Why: speculative sampling is lossless only if every piece is right (the acceptance rule, the
residual, logits processing applied identically to p and q, cache rollback, sharding). A wrong
piece does not crash; it shifts the output law a little. This tool takes any run configuration
(the same gin files and `--gin.NAME=VALUE` bindings as `specdec_jax.run`, so the same target,
draft, sampler, rule and mesh), decodes the first `num_tokens` tokens of one prompt `num_samples`
times autoregressively and `num_samples` times speculatively, and compares the two samples:
- a chi-square two-sample (homogeneity) test over the observed continuations, cells with an
  expected count under 5 pooled; the p-value is uniform on [0, 1] when the method is exact;
- the total-variation distance between the two empirical laws with a bootstrap 95% interval, and
  the TV that two samples of this size show with NO difference (the null's 95th percentile): the
  plug-in TV is biased upwards when continuations are many, so read it against that floor.
It exits with status 1 when p < --significance (default 1e-3), 0 otherwise, and writes
OUTPUT_DIR/exactness.json when --output_dir is given.

`--fault` injects a known bug to show the check's power: `target_only_top_k` applies top-k
(`--fault_top_k`) to the target in the speculative run only (a sampler setting that reached one
model's path), `residual_from_p` samples the correction after a rejection from p instead of
norm(max(0, p - q)) (the classic implementation bug), `sibling_residual_from_p` (a tree run:
GAMMA='tree', e.g. with gin/decoding/tree.gin) tests the next sibling of a rejected one against
the node's p instead of the running residual.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Sequence

import numpy as np
from absl import flags, logging

from specdec_jax import configurables, gin_utils, logs, paths
from specdec_jax.seam import Delegate
from specdec_jax.metrics.exactness import (continuation_counts, pool_rare, tv_bootstrap,
                                           tv_distance, two_sample_chi2)

FAULTS = ("none", "target_only_top_k", "residual_from_p", "sibling_residual_from_p")

# The run's flags (--gin_file, --gin.NAME=VALUE, --gin_search_paths, --output_dir: optional here),
# adopted so `--help` lists them with this module's own and absl.logging's --verbosity.
gin_utils.define_entry_flags("Where exactness.json goes (optional).")
flags.adopt_module_key_flags(gin_utils)
flags.declare_key_flag("verbosity")

flags.DEFINE_integer("num_samples", 20000, "Samples per method (autoregressive, speculative).")
flags.DEFINE_integer("num_tokens", 2, "Length k of the compared continuations (first k tokens).")
flags.DEFINE_integer("example", 0, "Index of the prompt (in TASK) whose continuations are compared.")
flags.DEFINE_integer("chunk", 10000, "Samples decoded per batch.")
flags.DEFINE_integer("gamma", None, "Draft length (default: GAMMA if an int, the tree of "
                     "RunConfig.tree if GAMMA is 'tree', else 4).")
flags.DEFINE_integer("adaptive_gamma_max", 0, "If > 0, check the adaptive-gamma loop (HF schedule) "
                     "with this gamma_max instead of the fixed-gamma loop.")
flags.DEFINE_float("confidence_threshold", 0.0, "Adaptive loop: draft top-probability stop.")
flags.DEFINE_float("significance", 1e-3, "Flag the configuration when the p-value is below this.")
flags.DEFINE_integer("bootstrap", 300, "Bootstrap resamples for the TV interval and null floor.")
flags.DEFINE_enum("fault", "none", FAULTS, "Inject a known bug (to see the check fail).")
flags.DEFINE_integer("fault_top_k", 2, "k of the target_only_top_k fault.")


@dataclasses.dataclass(frozen=True)
class CheckOptions:
  num_samples: int = 20000
  num_tokens: int = 2
  example: int = 0
  chunk: int = 10000
  gamma: int | None = None
  adaptive_gamma_max: int = 0
  confidence_threshold: float = 0.0
  significance: float = 1e-3
  bootstrap: int = 300
  fault: str = "none"
  fault_top_k: int = 2
  seed: int = 0

  def __post_init__(self):
    positive = dict(num_samples=self.num_samples, num_tokens=self.num_tokens, chunk=self.chunk,
                    bootstrap=self.bootstrap, fault_top_k=self.fault_top_k)
    for name, value in positive.items():
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"--{name} must be an integer >= 1, got {value!r}")
    if not isinstance(self.example, int) or self.example < 0:
      raise ValueError(f"--example must be an integer >= 0, got {self.example!r}")
    if self.gamma is not None and self.gamma < 1:
      raise ValueError(f"--gamma must be >= 1, got {self.gamma}")
    if self.adaptive_gamma_max < 0:
      raise ValueError(f"--adaptive_gamma_max must be >= 0, got {self.adaptive_gamma_max}")
    if not 0.0 < self.significance < 1.0:
      raise ValueError(f"--significance must be in (0, 1), got {self.significance}")
    if not 0.0 <= self.confidence_threshold <= 1.0:
      raise ValueError(f"--confidence_threshold must be in [0, 1], got "
                       f"{self.confidence_threshold}")


# ---- decoding ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _TopKTarget(Delegate):
  """The target with its logits truncated to the top k (the `target_only_top_k` fault)."""

  k: int = 1

  def extend(self, params, cache, tokens_BxT):
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    logits, cache = self.base.extend(params, cache, tokens_BxT)
    kth = jnp.sort(logits, axis=-1)[..., -self.k][..., None]
    return jnp.where(logits >= kth, logits, -1e9), cache


def _residual_from_p(key, draft_tokens, draft_probs, target_probs):
  """Token-wise verification with the correction sampled from p (the `residual_from_p` fault)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from specdec_jax.decoding import acceptance  # pylint: disable=import-outside-toplevel
  from specdec_jax.decoding.sampling import sample  # pylint: disable=import-outside-toplevel
  n_B, _ = acceptance.tokenwise(key, draft_tokens, draft_probs, target_probs)
  p_n = jnp.take_along_axis(target_probs, n_B[:, None, None], axis=1)[:, 0]
  return n_B, sample(jax.random.fold_in(key, 1), p_n)


def _sibling_residual_from_p_verifier(key, tree, node_tokens_BxN, draft_probs_BxNxV,
                                      target_probs_BxNxV):
  """`recursive_rejection` whose next sibling after a rejected one is tested against the node's
  p instead of the running residual (the `sibling_residual_from_p` fault; the same rule as
  `testing.sibling_residual_from_p`, which an entry point does not import)."""
  # pylint: disable=import-outside-toplevel
  import jax
  import jax.numpy as jnp
  from specdec_jax.decoding import acceptance
  from specdec_jax.decoding.sampling import sample
  from specdec_jax.decoding.tree import verify

  def sibling(u_B, x_B, p_node_BxV, p_cur_BxV, q_left_BxV):
    accept_B, valid_B, _, q_next_BxV = verify.rejection_sibling(u_B, x_B, p_node_BxV,
                                                                p_node_BxV, q_left_BxV)
    q_i_BxV = q_left_BxV / jnp.maximum(jnp.sum(q_left_BxV, axis=-1), 1e-30)[:, None]
    reject_B = valid_B & ~accept_B
    p_next_BxV = jnp.where(reject_B[:, None], acceptance.residual(p_cur_BxV, q_i_BxV),
                           p_cur_BxV)
    return accept_B, valid_B, p_next_BxV, q_next_BxV

  k_walk, k_next = jax.random.split(key)
  verdict, final_BxV = verify.descend(k_walk, tree, node_tokens_BxN, draft_probs_BxNxV,
                                      target_probs_BxNxV, sibling)
  return verdict.replace(next_token_B=sample(k_next, final_BxV))


def _first_tokens(result, k: int) -> np.ndarray:
  toks = np.asarray(result.tokens_BxN)[:, :k].astype(np.int64)
  lengths = np.asarray(result.lengths_B)
  return np.where(np.arange(k)[None, :] < lengths[:, None], toks, -1)


def sample_both(cfg, opts: CheckOptions, log=logging.info):
  """(autoregressive [N, k], speculative [N, k], info) for the configuration's first point."""
  from specdec_jax.decoding import acceptance  # pylint: disable=import-outside-toplevel
  from specdec_jax.runner import run_config as config_lib, pipeline  # pylint: disable=import-outside-toplevel

  if opts.fault not in FAULTS:
    raise ValueError(f"fault must be one of {FAULTS}, got {opts.fault!r}")
  if cfg.mode == "autoregressive":
    raise ValueError("MODE='autoregressive' has no speculative run to check")
  # in_sample: positions are the task's own (nothing calibrates here, nothing is held out)
  cfg = dataclasses.replace(cfg, num_examples=max(opts.example + 1, 1), mode="speculative",
                            calibration="in_sample", sample_examples=False)
  gammas = config_lib.as_list(cfg.gamma)
  gamma = opts.gamma or next((g for g in gammas if isinstance(g, int) and g > 0), 4)
  if opts.fault == "sibling_residual_from_p" and (
      opts.gamma is not None or config_lib.TREE not in config_lib.as_list(cfg.gamma)):
    raise ValueError("the sibling_residual_from_p fault is a tree verifier's: check a tree run "
                     "(GAMMA='tree', e.g. --gin_file=gin/decoding/tree.gin) without --gamma")
  loaded = pipeline.load(cfg)
  if opts.example >= len(loaded.prompts.examples):
    raise ValueError(f"--example {opts.example} is past the task's last example (it has "
                     f"{len(loaded.prompts.examples)})")
  temperature = config_lib.temperatures(cfg)[0]
  spec = config_lib.draft_specs(cfg)[0]
  draft, dparams = loaded.drafts[spec]
  scheme, drafter, label = _scheme(cfg, opts, gamma, draft)
  sampling = pipeline.sampling_of(cfg, temperature)
  rule = cfg.rule
  target = loaded.target
  if opts.fault == "target_only_top_k":
    target = _TopKTarget(loaded.target, opts.fault_top_k)
  faulty_rule = (acceptance.registered_rule("_check_exactness_residual_from_p", _residual_from_p)
                 if opts.fault == "residual_from_p" else contextlib.nullcontext(rule))
  with faulty_rule as rule:
    ar_rows, sp_rows, rates, seconds = _decode_samples(
        cfg, opts, loaded, _decoders(opts, loaded, target, draft, sampling, (scheme, drafter),
                                     rule), dparams)
  info = dict(target=loaded.target_name, draft=spec.name, temperature=temperature,
              top_k=cfg.top_k, top_p=cfg.top_p, rule=cfg.rule, fault=opts.fault, gamma=label,
              example=opts.example, acceptance_rate=rates[0] / max(rates[1], 1),
              decode_seconds=seconds)
  log(f"decoded {opts.num_samples} x 2 continuations in {info['decode_seconds']:.1f}s")
  return ar_rows, sp_rows, info


def _scheme(cfg, opts: CheckOptions, gamma: int, draft):
  """(the speculative scheme checked, its drafter, its label), built as the run builds it
  (`runner.schedule.decoding_scheme`, with the run's feature-draft chain options): the adaptive
  loop with --adaptive_gamma_max, the run's tree where GAMMA is 'tree' and no --gamma is given
  (with the sibling fault, its faulty verifier), else the chain of `gamma`."""
  # pylint: disable=import-outside-toplevel
  from specdec_jax.decoding import adaptive
  from specdec_jax.runner import drafts as drafts_lib, schedule
  if opts.adaptive_gamma_max > 0:
    value = adaptive.AdaptiveConfig(gamma_max=opts.adaptive_gamma_max,
                                    confidence_threshold=opts.confidence_threshold)
    label = f"adaptive<={opts.adaptive_gamma_max}"
  elif opts.gamma is None and schedule.TREE in schedule.as_list(cfg.gamma):
    value = cfg.tree_scheme()
    if opts.fault == "sibling_residual_from_p":
      value = dataclasses.replace(value, verifier=_sibling_residual_from_p_verifier)
    label = f"tree({value.tree.num_nodes} nodes, depth {value.tree.max_depth})"
  else:
    value, label = gamma, gamma
  options = drafts_lib.chain_options(cfg)
  word = schedule.lower(value)[0]  # the run's refusals, asked of the program checked here
  schedule.check_pair(word, draft, parallel=options["parallel"],
                      lookup_gamma=options["lookup_gamma"],
                      trees=[value] if word == schedule.TREE else [])
  scheme, drafter = schedule.decoding_scheme(value, draft, **options)
  if options["lookup_gamma"] and isinstance(value, int):
    label = f"lookup {options['lookup_gamma']} / feature draft {gamma}"
  return scheme, drafter, label


def _decoders(opts: CheckOptions, loaded, target, draft, sampling, scheme_drafter, rule):
  """(the autoregressive Decoder, the speculative one) of `opts.num_tokens` tokens each."""
  from specdec_jax.decoding.decoder import Decoder  # pylint: disable=import-outside-toplevel
  k, (scheme, drafter) = opts.num_tokens, scheme_drafter
  return (Decoder(loaded.target, sampling=sampling, max_decode_len=k),
          Decoder(target, draft, scheme, sampling, rule=rule, max_decode_len=k, drafter=drafter))


def _decode_samples(cfg, opts: CheckOptions, loaded, decoders, dparams):
  """(autoregressive [N, k], speculative [N, k], (accepted, drafted), seconds), in chunks."""
  import jax  # pylint: disable=import-outside-toplevel
  from specdec_jax.decoding.decoder import Params  # pylint: disable=import-outside-toplevel
  from specdec_jax.metrics import acceptance_stats  # pylint: disable=import-outside-toplevel
  prompt = loaded.prompts.batch([opts.example])
  k = opts.num_tokens
  ar_decoder, sp_decoder = decoders
  key = jax.random.key(cfg.seed)
  ar_rows, sp_rows, accepted, drafted = [], [], 0, 0
  t0 = time.perf_counter()
  # Both methods' samples count: the bar moves after each chunk of either (minutes on a CPU).
  progress = logs.bar("exactness: samples (AR + spec)", total=2 * opts.num_samples,
                      unit="sample")
  for start in range(0, opts.num_samples, opts.chunk):
    n = min(opts.chunk, opts.num_samples - start)
    inputs = jax.device_put(np.repeat(prompt, n, axis=0))
    k_ar, k_sp = jax.random.split(jax.random.fold_in(key, start))
    ar = ar_decoder.generate(Params(loaded.target_params), inputs, k_ar)
    ar_rows.append(_first_tokens(ar, k))
    progress.update(n)
    sp = sp_decoder.generate(Params(loaded.target_params, dparams), inputs, k_sp)
    sp_rows.append(_first_tokens(sp, k))
    progress.update(n)
    totals = acceptance_stats.counters_to_dict(sp.counters)
    accepted, drafted = accepted + totals["accepted"], drafted + totals["drafted"]
  progress.close()
  return (np.concatenate(ar_rows), np.concatenate(sp_rows), (accepted, drafted),
          time.perf_counter() - t0)


def check(cfg, opts: CheckOptions, log=logging.info) -> dict:
  """Runs the check for a `RunConfig`; returns the report (also the JSON written to disk)."""
  ar, sp, info = sample_both(cfg, opts, log)
  _, ca, cb = continuation_counts(ar, sp)
  stat, dof, pvalue = two_sample_chi2(ca, cb)
  pa, pb = pool_rare(ca, cb)
  (lo, hi), floor = tv_bootstrap(pa, pb, opts.bootstrap, seed=opts.seed)
  report = dict(info, num_samples=opts.num_samples, num_tokens=opts.num_tokens,
                distinct_continuations=int(len(ca)), chi2=stat, dof=dof, p_value=pvalue,
                tv=tv_distance(pa, pb), tv_ci95=[lo, hi], tv_null95=floor,
                tv_unpooled=tv_distance(ca, cb),
                significance=opts.significance, exact=bool(pvalue >= opts.significance))
  return report


def format_report(r: dict) -> str:
  verdict = ("PASS: no evidence that speculation changes the output distribution"
             if r["exact"] else "FAIL: speculative and autoregressive samples differ")
  return "\n".join([
      f"exactness check: target={r['target']} draft={r['draft']} rule={r['rule']} "
      f"gamma={r['gamma']} temperature={r['temperature']:g} top_k={r['top_k']} "
      f"top_p={r['top_p']:g}" + (f" fault={r['fault']}" if r["fault"] != "none" else ""),
      f"  {r['num_samples']} samples per method, first {r['num_tokens']} tokens of example "
      f"{r['example']}, {r['distinct_continuations']} distinct continuations, "
      f"acceptance rate {r['acceptance_rate']:.3f}",
      f"  two-sample chi-square: {r['chi2']:.1f} on {r['dof']} dof, p = {r['p_value']:.3g}",
      f"  TV distance (rare continuations pooled): {r['tv']:.4f} (95% CI {r['tv_ci95'][0]:.4f}-{r['tv_ci95'][1]:.4f}; "
      f"two samples of this size with no difference: <= {r['tv_null95']:.4f} in 95%)",
      f"  {verdict} (p {'<' if not r['exact'] else '>='} {r['significance']:g})"])


def run_check(gin_files: Sequence[str], gin_bindings: Sequence[str] = (),
              search_paths: Sequence[str] = (), opts: CheckOptions = CheckOptions(),
              output_dir: str | None = None) -> dict:
  configurables.parse(gin_files, gin_bindings, search_paths)
  cfg = configurables.run_config()
  if output_dir:  # refused before the check's minutes of sampling, not after
    paths.check_writable(output_dir, "the exactness report")
  report = check(cfg, dataclasses.replace(opts, seed=cfg.seed))
  if output_dir:
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "exactness.json"), "w") as f:
      json.dump(report, f, indent=2)
  return report


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected positional arguments: {list(argv[1:])}")
  f = flags.FLAGS
  opts = CheckOptions(num_samples=f.num_samples, num_tokens=f.num_tokens, example=f.example,
                      chunk=f.chunk, gamma=f.gamma, adaptive_gamma_max=f.adaptive_gamma_max,
                      confidence_threshold=f.confidence_threshold, significance=f.significance,
                      bootstrap=f.bootstrap, fault=f.fault, fault_top_k=f.fault_top_k)
  report = run_check(f.gin_file, f.gin_bindings, f.gin_search_paths, opts, f.output_dir)
  print(format_report(report), flush=True)
  if not report["exact"]:
    raise SystemExit(1)


def console_entry() -> None:
  logs.setup()  # library INFO filtered; --verbosity=1 shows it
  gin_utils.run(main)


if __name__ == "__main__":
  console_entry()
