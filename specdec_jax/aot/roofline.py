"""A roofline for speculative decoding on the slice: c and v(T) from the compiled steps.

Why: the speedup formula (DESIGN.md, "Public contract": (1 - alpha^(G+1)) / ((1 - alpha)(G c +
v(G+1)))) needs c (one draft step / one target step) and v(T) (a verify over T tokens / one target
step). On TPU those times are not measured here, but the TPU compiler reports each step's flops
and bytes accessed per chip (`cost_analysis`), and a batch-1 decode step is bound by whichever of
compute (flops / peak) and HBM traffic (bytes / bandwidth) takes longer. So each step is compiled
on the configured mesh, exactly as the loop calls it (`Model.extend` on a cache laid out as the
prefill leaves it), and timed by that bound.

What the roofline leaves out: collectives (the all-reduces of a model-parallel layer and the
vocabulary gather cost ICI latency, several microseconds each, per layer, which for a 77M draft can
exceed its whole HBM time), kernel launch and loop overhead per step, the sampling and acceptance
arithmetic between steps, imperfect overlap of compute and memory, and HBM bandwidth below its
peak. All of them weigh more on the small draft than on the target, so the roofline's c is a lower
bound and its speedups an upper bound.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import jax
import numpy as np

from specdec_jax.aot import abstract
from specdec_jax.aot.programs import Program
from specdec_jax.aot.topologies import Chip

TARGET_STEP, DRAFT_STEP, VERIFY = "target_step", "draft_step", "verify"

# Leviathan et al. (2023) Table 2: T5-XXL target, batch 1, one TPU v4 (reference/PAPERS.md).
# (task, draft preset, temperature, gamma, alpha, measured speedup)
PAPER_TABLE2 = (
    ("EnDe", "t5_1_1_small", 0, 7, 0.75, 3.4), ("EnDe", "t5_1_1_base", 0, 7, 0.80, 2.8),
    ("EnDe", "t5_1_1_large", 0, 7, 0.82, 1.7), ("EnDe", "t5_1_1_small", 1, 7, 0.62, 2.6),
    ("EnDe", "t5_1_1_base", 1, 5, 0.68, 2.4), ("EnDe", "t5_1_1_large", 1, 3, 0.71, 1.4),
    ("CNNDM", "t5_1_1_small", 0, 5, 0.65, 3.1), ("CNNDM", "t5_1_1_base", 0, 5, 0.73, 3.0),
    ("CNNDM", "t5_1_1_large", 0, 3, 0.74, 2.2), ("CNNDM", "t5_1_1_small", 1, 5, 0.53, 2.3),
    ("CNNDM", "t5_1_1_base", 1, 3, 0.55, 2.2), ("CNNDM", "t5_1_1_large", 1, 3, 0.56, 1.7),
)


@functools.partial(jax.jit, static_argnames=("model",))
def _extend(model, params, cache, tokens_BxT):
  """One `Model.extend` call as the loop makes it (draft step: T = 1; verify: T = gamma + 1)."""
  return model.extend(params, cache, tokens_BxT)


def abstract_cache(model, params, batch: int, prompt_len: int, cache_len: int, mesh):
  """The cache `model.prefill` leaves, as sharded ShapeDtypeStructs, without compiling a prefill:
  shapes from `jax.eval_shape`, shardings from the model's rules as `Model.prefill` constrains
  them (K/V [B, S, H, K] by batch and heads, the per-example index and encoder mask by batch)."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  from jax.sharding import PartitionSpec as P  # pylint: disable=import-outside-toplevel
  inputs = abstract.abstract_batch((batch, prompt_len), np.int32, mesh, model.axis_rules)
  shapes = jax.eval_shape(lambda p, x: model.prefill(p, x, cache_len), params, inputs)
  logical = {1: ("batch",), 2: ("batch", None), 4: ("batch", "length", "heads", "kv"),
             5: ("layers", "batch", "length", "heads", "kv")}

  def one(x):
    spec = P(*logical.get(x.ndim, (None,) * x.ndim))
    sharding = nn.logical_to_mesh_sharding(spec, mesh, list(model.axis_rules))
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  return jax.tree.map(one, shapes)


def step_programs(setup, drafts: Mapping[str, tuple], *, gamma: int, max_tokens: int, mesh
                  ) -> list[Program]:
  """target_step (T = 1), verify[T] for T = 2..max_tokens and draft_step per model draft, each
  an `extend` on the cache its prefill leaves (slots for `max_decode_len` and gamma's slack).

  setup: the run's `programs.DecodeSetup` (target, its abstract params, batch and lengths).
  drafts: name -> (draft Model, its abstract params).
  """
  from specdec_jax.decoding import start  # pylint: disable=import-outside-toplevel
  target, target_params = setup.target, setup.target_params
  batch, prompt_len, max_decode_len = setup.batch, setup.prompt_len, setup.max_decode_len

  def lower_for(model, params, t):
    def call(_):
      cache_len = start.cache_len_needed(model, prompt_len, max_decode_len, gamma)
      cache = abstract_cache(model, params, batch, prompt_len, cache_len, mesh)
      tokens = abstract.abstract_batch((batch, t), np.int32, mesh, model.axis_rules)
      return _extend, (model, params, cache, tokens), {}
    return call

  progs = [Program(f"{TARGET_STEP}[T=1]", TARGET_STEP, lower_for(target, target_params, 1),
                   info=dict(tokens=1))]
  progs += [Program(f"{VERIFY}[T={t}]", VERIFY, lower_for(target, target_params, t),
                    info=dict(tokens=t)) for t in range(2, max_tokens + 1)]
  for name, (draft, dparams) in drafts.items():
    progs.append(Program(f"{DRAFT_STEP}[draft={name}]", DRAFT_STEP, lower_for(draft, dparams, 1),
                         info=dict(draft=name, tokens=1)))
  return progs


def step_seconds(flops: float, bytes_accessed: float, chip: Chip) -> float:
  """The roofline time of one chip's program: compute- or HBM-bound, whichever is slower."""
  return max(flops / chip.peak_flops_bf16, bytes_accessed / chip.hbm_bytes_per_s)


def predicted_speedup(alpha: float, gamma: int, c: float, v: float) -> float:
  """(1 - alpha^(G+1)) / ((1 - alpha)(G c + v)) (Leviathan et al. section 3, v = v(G + 1))."""
  return (1.0 - alpha ** (gamma + 1)) / ((1.0 - alpha) * (gamma * c + v))


@dataclasses.dataclass
class Roofline:
  """Per-step roofline times on one chip of the slice and what follows from them."""
  chip: Chip
  target_s: float
  verify_s: dict          # T -> seconds (T = 1 is the target step)
  draft_s: dict           # draft name -> seconds
  draft_presets: dict     # draft name -> preset name (matches PAPER_TABLE2), if known
  basis: str = "cost_analysis"

  @property
  def v(self) -> dict:
    return {t: s / self.target_s for t, s in sorted(self.verify_s.items())}

  def c(self, draft: str) -> float:
    return self.draft_s[draft] / self.target_s

  def table2(self) -> list[dict]:
    """Every paper Table-2 row whose draft was compiled: predicted vs measured speedup."""
    rows = []
    by_preset = {p: n for n, p in self.draft_presets.items()}
    for task, preset, temp, gamma, alpha, measured in PAPER_TABLE2:
      if preset not in by_preset or gamma + 1 not in self.verify_s:
        continue
      name = by_preset[preset]
      c, v = self.c(name), self.v[gamma + 1]
      rows.append(dict(task=task, draft=preset, temperature=temp, gamma=gamma, alpha=alpha,
                       c=c, v=v, predicted=predicted_speedup(alpha, gamma, c, v),
                       predicted_v1=predicted_speedup(alpha, gamma, c, 1.0), measured=measured))
    return rows

  def to_json(self) -> dict:
    return dict(chip=self.chip.name, basis=self.basis, target_step_us=self.target_s * 1e6,
                verify_us={str(t): s * 1e6 for t, s in sorted(self.verify_s.items())},
                v={str(t): x for t, x in self.v.items()},
                draft_step_us={k: s * 1e6 for k, s in self.draft_s.items()},
                c={k: self.c(k) for k in self.draft_s}, table2=self.table2())


BASES = ("cost_analysis", "arguments")


def from_results(results: Sequence[Any], chip: Chip, draft_presets: Mapping[str, str],
                 basis: str = "cost_analysis") -> Optional[Roofline]:
  """A Roofline from compiled step programs (`memory.Result`s); None if the target step is missing.

  basis: which HBM traffic a step is charged: 'cost_analysis' (XLA's bytes accessed, every
  fusion's operands and results: several times the weights) or 'arguments' (the program's
  arguments, i.e. the weights and caches it reads once: the least traffic a step can have).
  """
  if basis not in BASES:
    raise ValueError(f"basis must be one of {BASES}, got {basis!r}")
  verify, drafts = {}, {}
  for r in results:
    if r.flops is None:
      continue
    traffic = r.bytes_accessed if basis == "cost_analysis" else r.per_chip_bytes["arguments"]
    s = step_seconds(r.flops, traffic, chip)
    if r.kind in (TARGET_STEP, VERIFY):
      verify[r.info["tokens"]] = s
    elif r.kind == DRAFT_STEP:
      drafts[r.info["draft"]] = s
  if 1 not in verify:
    return None
  return Roofline(chip, verify[1], verify, drafts, dict(draft_presets), basis)


def from_records(records: Sequence[Mapping[str, Any]], chip: Chip,
                 basis: str = "cost_analysis") -> Optional[Roofline]:
  """The same from aot.json records (several jobs' records may be merged: the target's steps
  from one, the drafts' from another, on the same slice and mesh)."""
  results = [dataclasses.make_dataclass(
      "R", ["kind", "flops", "bytes_accessed", "per_chip_bytes", "info"])(
          r["kind"], r.get("flops"), r.get("bytes_accessed"), r.get("per_chip_bytes") or {},
          {k: r[k] for k in ("tokens", "draft") if k in r}) for r in records]
  from specdec_jax.models.config import PRESETS  # pylint: disable=import-outside-toplevel
  presets = {r["draft"]: r["draft"] for r in records
             if r.get("kind") == DRAFT_STEP and r.get("draft") in PRESETS}
  return from_results(results, chip, presets, basis)


def markdown(roof: Roofline, where: str) -> str:
  """The roofline table (docs/roofline_tpu_v4.md): per Table-2 row, c, v(G+1), predicted speedups and the paper's."""
  lines = [f"Roofline ({roof.basis}) on {where} ({roof.chip.name}: {roof.chip.peak_flops_bf16 / 1e12:g} TFLOP/s "
           f"bf16, {roof.chip.hbm_bytes_per_s / 1e12:g} TB/s HBM per chip): target step "
           f"{roof.target_s * 1e6:.0f} us; v(T) = " +
           ", ".join(f"{x:.3f}" for _, x in sorted(roof.v.items())) + " for T = 1.." +
           f"{max(roof.v)}; " + ", ".join(f"{k} step {s * 1e6:.1f} us (c = {roof.c(k):.3f})"
                                         for k, s in roof.draft_s.items()) + ".",
           "",
           "| task | draft | temp | gamma | paper alpha | c | v(gamma+1) | predicted | "
           "predicted, v = 1 | paper measured |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in roof.table2():
    lines.append(f"| {r['task']} | {r['draft'].replace('t5_1_1_', 'T5-')} | {r['temperature']} | "
                 f"{r['gamma']} | {r['alpha']:.2f} | {r['c']:.3f} | {r['v']:.3f} | "
                 f"{r['predicted']:.2f}x | {r['predicted_v1']:.2f}x | {r['measured']:.1f}x |")
  return "\n".join(lines)
