"""A roofline for speculative decoding on TPU: c and v(T) from the models' shapes, per layout.

Why: the speedup formula (`metrics.theory.predicted_speedup`, Leviathan et al. section 3:
(1 - alpha^(G+1)) / ((1 - alpha)(G c + v(G+1)))) needs c (a draft iteration / a target step) and
v(T) (a verify over T tokens / a target step). No TPU is attached here, so they are predicted: a
batch-1 decode step is bound by whichever of compute (flops / peak) and HBM traffic (bytes /
bandwidth) takes longer on a chip.

The byte basis, one a reader can check by hand: per step, each chip reads its share of the
weights the step uses once, its share of the caches once (self-attention K/V over every slot of
the buffer, which attention reads whole and masks; cross-attention K/V over the prompt), and per
token writes its K/V and samples from float32 logits over the whole vocabulary. Activations are
left out (a few vectors of the model width per token). A verify of T tokens therefore reads the
weights and caches once and adds T tokens' flops, writes and sampling: v(T) >= 1 and
non-decreasing by construction. XLA's `cost_analysis` byte count is not the basis: it charges
every fusion's operands and results (4x the weights for a T5-XXL step) and charged a one-token
step more than a two-token one (v(2) = 0.955); it is printed beside this count as a cross-check,
with the compiled programs' arguments (`memory_analysis`), which should agree with it.

What the roofline leaves out: collectives (a model-parallel layer all-reduces twice and the
vocabulary is gathered; several microseconds each, per layer), kernel launch and loop overhead,
the acceptance arithmetic between calls, imperfect overlap of compute and memory, HBM below its
peak, and on-chip memory (a TPU v4 chip's CMEM can hold a small draft's weights, which would then
not stream from HBM). All but the last make real steps slower than these; the small draft
suffers most, so a measured c is expected above the roofline's.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from specdec_jax.aot import topologies
from specdec_jax.metrics import theory
from specdec_jax.models.model_config import ModelConfig

TARGET_STEP, DRAFT_STEP, VERIFY = "target_step", "draft_step", "verify"
STEP_KINDS = (TARGET_STEP, VERIFY, DRAFT_STEP)

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
LOGITS_BYTES = 4  # the head's logits are float32 (models/transformer.py), as is sampling
# float32 [V] vectors one sampled token moves: the logits written by the head and read by
# `sampling.process_logits`, the probabilities it writes and the sampler (and, for the draft,
# the acceptance test) reads.
SAMPLING_PASSES = 4
V_TOKENS = (1, 2, 4, 8, 16, 32, 64)  # the v(T) a layout's summary prints

# Leviathan et al. (2023) Tables 2 and 4: T5-XXL target, batch 1, one TPU v4 (reference/PAPERS.md).
# (task, draft preset, temperature, gamma, alpha, expected speedup from its measured c (Table 4),
# measured speedup)
PAPER_TABLE2 = (
    ("EnDe", "t5_1_1_small", 0, 7, 0.75, 3.2, 3.4),
    ("EnDe", "t5_1_1_base", 0, 7, 0.80, 3.3, 2.8),
    ("EnDe", "t5_1_1_large", 0, 7, 0.82, 2.5, 1.7),
    ("EnDe", "t5_1_1_small", 1, 7, 0.62, 2.3, 2.6),
    ("EnDe", "t5_1_1_base", 1, 5, 0.68, 2.4, 2.4),
    ("EnDe", "t5_1_1_large", 1, 3, 0.71, 2.0, 1.4),
    ("CNNDM", "t5_1_1_small", 0, 5, 0.65, 2.4, 3.1),
    ("CNNDM", "t5_1_1_base", 0, 5, 0.73, 2.6, 3.0),
    ("CNNDM", "t5_1_1_large", 0, 3, 0.74, 2.0, 2.2),
    ("CNNDM", "t5_1_1_small", 1, 5, 0.53, 1.9, 2.3),
    ("CNNDM", "t5_1_1_base", 1, 3, 0.55, 1.8, 2.2),
    ("CNNDM", "t5_1_1_large", 1, 3, 0.56, 1.6, 1.7),
)
PAPER_C = {"t5_1_1_small": 0.02, "t5_1_1_base": 0.04, "t5_1_1_large": 0.11}  # its Table 4


# ---- the arithmetic ------------------------------------------------------------------------------
def weight_params_read(cfg: ModelConfig) -> int:
  """Parameters one decode step reads whole: the decoder's layers (self-attention q, k, v, o; the
  gated MLP's wi_0, wi_1, wo; the norms), cross-attention q and o (its k and v were applied to the
  encoder output once, at prefill, and are cached), the relative-position table, the final norm
  and the logits matrix (a tied head's is the embedding, read whole as the head). Not the
  encoder, not an untied token embedding (one row per token). Grouped-query attention: k and v
  are kv_heads wide; rotary models have no relative-position table."""
  e, i, m = cfg.emb_dim, cfg.num_heads * cfg.head_dim, cfg.mlp_dim
  kv = cfg.kv_heads * cfg.head_dim
  layer = 2 * e * i + 2 * e * kv + 3 * e * m + 2 * e + ((i + 2 * kv) if cfg.qkv_bias else 0)
  if cfg.is_encoder_decoder:
    layer += 2 * e * i + e
  table = 0 if cfg.uses_rope else cfg.num_heads * cfg.relative_attention_num_buckets
  return cfg.num_decoder_layers * layer + table + e + cfg.vocab_size * e


@dataclasses.dataclass(frozen=True)
class Placement:
  """One model as a step runs it: its config (dtype included), the cache the step reads and the
  chips its weights, heads and caches are split over (model parallelism)."""
  config: ModelConfig
  batch: int = 1
  prompt_len: int = 0    # encoder positions the cross-attention cache holds (T5 only)
  cache_len: int = 1     # self-attention slots
  chips: int = 1
  # Weights a step reads beyond `weight_params_read(config)`: a feature-level draft's input
  # projection (`aot.feature_roofline`); 0 for a token model.
  extra_params: int = 0

  @property
  def params_read(self) -> int:
    return weight_params_read(self.config) + self.extra_params

  @property
  def act_bytes(self) -> int:
    return DTYPE_BYTES[self.config.dtype]

  @property
  def cross_len(self) -> int:
    return self.prompt_len if self.config.is_encoder_decoder else 0


def cache_bytes(p: Placement) -> int:
  """K/V bytes one step reads, over all chips: every self-attention slot and every prompt slot."""
  cfg = p.config
  per_slot = 2 * cfg.kv_heads * cfg.head_dim * p.act_bytes * cfg.num_decoder_layers * p.batch
  return per_slot * (p.cache_len + p.cross_len)


@dataclasses.dataclass(frozen=True)
class Cost:
  """One chip's share of a program: HBM bytes moved and flops."""
  bytes: float
  flops: float

  def seconds(self, chip: topologies.Chip) -> float:
    """Compute- or HBM-bound, whichever is slower."""
    return max(self.flops / chip.peak_flops_bf16, self.bytes / chip.hbm_bytes_per_s)


def step_cost(p: Placement, tokens: int, sampling: bool = True) -> Cost:
  """One `extend` over `tokens` positions per example, per chip; with `sampling`, the tokens'
  sampling too (on the whole vocabulary on every chip: the logits are gathered for it).

  Bytes: weights and caches once, split over the chips; per token the new K/V written, the
  embedding row read and (sampling) SAMPLING_PASSES float32 vocabulary vectors. Flops: 2 per
  weight read per token, and attention's two products over the cache and the prompt."""
  cfg = p.config
  if tokens < 1:
    raise ValueError(f"a step feeds at least one token, got {tokens}")
  inner = cfg.num_heads * cfg.head_dim
  kv = cfg.kv_heads * cfg.head_dim
  per_token = p.batch * (2 * kv * cfg.num_decoder_layers + cfg.emb_dim) * p.act_bytes
  shared = p.params_read * p.act_bytes + cache_bytes(p) + tokens * per_token
  sample = tokens * p.batch * SAMPLING_PASSES * cfg.vocab_size * LOGITS_BYTES if sampling else 0
  attention = 4 * cfg.num_decoder_layers * inner * (p.cache_len + p.cross_len)
  flops = tokens * p.batch * (2 * p.params_read + attention)
  return Cost(bytes=shared / p.chips + sample, flops=flops / p.chips)


def argument_bytes(p: Placement) -> int:
  """Per chip, what a compiled step is passed: the weights it reads, the whole embedding table
  and the caches (compare with `memory_analysis`'s arguments)."""
  cfg = p.config
  embedding = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.emb_dim  # tied: the head itself
  weights = (p.params_read + embedding) * p.act_bytes
  return (weights + cache_bytes(p)) // p.chips


def resident_bytes(p: Placement) -> int:
  """Per chip, the model's whole weights (encoder included) and its caches: what stays on HBM."""
  return ((p.config.num_params() + p.extra_params) * p.act_bytes + cache_bytes(p)) // p.chips


@dataclasses.dataclass(frozen=True)
class Layout:
  """The target and its drafts on a slice: step times, c and v(T) on one chip's roofline.

  Attributes:
    name: what the layout is (e.g. the paper's single chip, or a mesh file).
    chip: the chip's published figures (`topologies.CHIPS`, the one place they are stated).
    target: the target's placement; drafts: draft name (a preset name where known) -> placement.
  """
  name: str
  chip: topologies.Chip
  target: Placement
  drafts: Mapping[str, Placement]

  def target_s(self) -> float:
    """One target step with its sampling: the autoregressive iteration, the unit of c and v."""
    return step_cost(self.target, 1).seconds(self.chip)

  def verify_s(self, tokens: int) -> float:
    return step_cost(self.target, tokens).seconds(self.chip)

  def v(self, tokens: int) -> float:
    return self.verify_s(tokens) / self.target_s()

  def draft_s(self, name: str) -> float:
    """One draft iteration: a step and the sampling of its token."""
    return step_cost(self.drafts[name], 1).seconds(self.chip)

  def c(self, name: str) -> float:
    return self.draft_s(name) / self.target_s()

  def table2(self) -> list[dict[str, Any]]:
    """Every paper Table-2 row whose draft this layout holds, predicted from the paper's alpha
    with this layout's c and v (`theory.predicted_speedup`), beside the paper's figures."""
    rows = []
    for task, preset, temp, gamma, alpha, expected, measured in PAPER_TABLE2:
      if preset not in self.drafts:
        continue
      c, v = self.c(preset), self.v(gamma + 1)
      rows.append(dict(task=task, draft=preset, temperature=temp, gamma=gamma, alpha=alpha, c=c,
                       v=v, predicted=theory.predicted_speedup(alpha, gamma, c, v),
                       paper_expected=expected, paper_measured=measured))
    return rows

  def to_json(self) -> dict[str, Any]:
    return dict(layout=self.name, chip=self.chip.name, target_step_us=self.target_s() * 1e6,
                v={str(t): self.v(t) for t in V_TOKENS},
                draft_iteration_us={k: self.draft_s(k) * 1e6 for k in self.drafts},
                c={k: self.c(k) for k in self.drafts}, table2=self.table2())


# ---- from the compiled steps' records (aot.json) -------------------------------------------------
def step_records(aot: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
  """The roofline's steps among a job's aot.json objects, in order."""
  return [r for r in aot if r.get("kind") in STEP_KINDS]


def placement_of(rec: Mapping[str, Any]) -> Placement:
  """A step record's model and shapes (the `steps.step_programs` info every record carries)."""
  return Placement(ModelConfig.from_dict(rec["model_config"]), batch=rec["batch"],
                   prompt_len=rec["prompt_len"], cache_len=rec["cache_len"],
                   chips=rec["model_chips"])


def layout_from_aot(aot: Sequence[Mapping[str, Any]], name: str) -> Layout:
  """The layout a roofline job compiled: its target step's and its draft steps' placements."""
  steps = step_records(aot)
  target = [r for r in steps if r["kind"] == TARGET_STEP]
  if not target:
    raise ValueError("no target_step record (run the aot job with --roofline)")
  topologies_seen = {r["topology"] for r in steps}
  if len(topologies_seen) != 1:
    raise ValueError(f"a roofline is one slice; the records hold {sorted(topologies_seen)}")
  chip = topologies.parse(topologies_seen.pop()).chip
  drafts = {r["draft"]: placement_of(r) for r in steps if r["kind"] == DRAFT_STEP}
  return Layout(name, chip, placement_of(target[0]), drafts)


# ---- tables (docs/roofline_tpu_v4.md, rendered from results records by metrics.results) ---------
GiB, MiB = 2 ** 30, 2 ** 20


def _short(name: str) -> str:
  return name.replace("t5_1_1_", "T5-")


def layout_of_record(rec: Mapping[str, Any]) -> Layout:
  """A results record of a roofline job (metrics: its `layout` name and its `aot` objects)."""
  return layout_from_aot(rec["metrics"]["aot"], rec["metrics"]["layout"])


def _fits_cell(layout: Layout, aot: Sequence[Mapping[str, Any]]) -> str:
  """Per chip, the target's and the largest draft's weights and caches: analytic, and the
  compiled steps' totals (temporaries of both counted), against the compiler's usable HBM."""
  steps = step_records(aot)
  usable = steps[0].get("hbm_bytes_per_chip") or layout.chip.hbm_bytes
  analytic = resident_bytes(layout.target) + max(
      (resident_bytes(p) for p in layout.drafts.values()), default=0)
  totals = {r["kind"]: 0 for r in steps}
  for r in steps:
    totals[r["kind"]] = max(totals[r["kind"]], (r.get("per_chip_bytes") or {}).get("total", 0))
  compiled = totals.get(TARGET_STEP, 0) + totals.get(DRAFT_STEP, 0)
  verdict = "fits" if max(analytic, compiled) <= usable else "DOES NOT FIT"
  return (f"{analytic / GiB:.2f} ({compiled / GiB:.2f} compiled) of {usable / GiB:.2f}: "
          f"{verdict}")


def summary_table(records: Sequence[Mapping[str, Any]]) -> str:
  """One line per layout: the target step, v(T), each draft iteration with its c, and whether
  the target and its largest draft fit one chip's HBM together."""
  layouts = [layout_of_record(r) for r in records]
  drafts = sorted({d for lay in layouts for d in lay.drafts}, key=lambda d: (
      min((lay.drafts[d].config.num_params() for lay in layouts if d in lay.drafts)), d))
  head = (["layout", "compiled on", "chips: target / draft", "target step (us)"]
          + [f"v({t})" for t in V_TOKENS[1:]] + [f"{_short(d)} iteration (us), c" for d in drafts]
          + ["per chip, target + largest draft (GiB)"])
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for rec, lay in zip(records, layouts):
    step = step_records(rec["metrics"]["aot"])[0]
    draft_chips = sorted({p.chips for p in lay.drafts.values()})
    cells = [lay.name, _where(step),
             f"{lay.target.chips} / {', '.join(map(str, draft_chips))}",
             f"{lay.target_s() * 1e6:.0f}"]
    cells += [f"{lay.v(t):.4f}" for t in V_TOKENS[1:]]
    cells += [f"{lay.draft_s(d) * 1e6:.1f}, {lay.c(d):.4f}" if d in lay.drafts else "-"
              for d in drafts]
    cells.append(_fits_cell(lay, rec["metrics"]["aot"]))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _where(step: Mapping[str, Any]) -> str:
  """'v4-8: 4 of 4 chips, mesh data 1 x model_inner 2 x model_outer 2'."""
  mesh = step["mesh"]
  used = math.prod(mesh.values())
  axes = " x ".join(f"{k} {v}" for k, v in mesh.items())
  return f"{step['topology']}: {used} of {step['num_chips']} chips, mesh {axes}"


def _one(records: Sequence[Mapping[str, Any]], what: str) -> Mapping[str, Any]:
  if len(records) != 1:
    raise ValueError(f"a {what} table is one layout's: name one record, got {len(records)}")
  return records[0]


def table2_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Leviathan's Table-2 rows on one layout: the speedup predicted from the paper's alpha with
  this roofline's c and v (not measured), beside the paper's expected (its measured c, v = 1) and
  measured speedups."""
  lay = layout_of_record(_one(records, "roofline_table2"))
  head = ("task", "draft", "T", "gamma", "paper alpha", "c", "v(gamma+1)",
          "predicted from the paper's alpha (not measured)", "paper: expected from its c",
          "paper: measured")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in lay.table2():
    lines.append("| " + " | ".join((
        r["task"], _short(r["draft"]), str(r["temperature"]), str(r["gamma"]),
        f"{r['alpha']:.2f}", f"{r['c']:.4f}", f"{r['v']:.4f}", f"{r['predicted']:.2f}x",
        f"{r['paper_expected']:.1f}x", f"{r['paper_measured']:.1f}x")) + " |")
  return "\n".join(lines) + "\n\n" + _against_measured(lay.table2())


def _against_measured(rows: Sequence[Mapping[str, Any]]) -> str:
  """How the predictions fall against the paper's measured speedups, and how the paper's own did:
  the formula is no bound either way, and the table should not read as one. Within 0.05 (the
  paper's rounding to one decimal) counts as level."""
  def count(key):
    up = sum(r[key] > r["paper_measured"] + 0.05 for r in rows)
    down = sum(r[key] < r["paper_measured"] - 0.05 for r in rows)
    return f"above in {up}, below in {down} and level (within 0.05) in {len(rows) - up - down}"
  return (f"Against the paper's measured speedup, the predictions of these {len(rows)} rows are "
          f"{count('predicted')}; the paper's own expected speedups are {count('paper_expected')}.")


def check_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Per compiled step of one layout, the roofline's count beside the compiler's: bytes read and
  passed (`memory_analysis` arguments), XLA's `cost_analysis` bytes and flops (a cross-check,
  never the basis), and the roofline time each byte count gives. Steps without sampling: the
  compiled programs are the `extend` calls alone."""
  rec = _one(records, "roofline_check")
  lay = layout_of_record(rec)
  head = ("program", "read (MiB)", "passed (MiB)", "compiled arguments (MiB)",
          "XLA bytes accessed (MiB)", "GFLOP", "XLA GFLOP", "roofline (us)",
          "by XLA's bytes (us)", "compiled total (GiB)")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in step_records(rec["metrics"]["aot"]):
    p = placement_of(r)
    cost = step_cost(p, r["tokens"], sampling=False)
    xla = Cost(r.get("bytes_accessed") or 0.0, r.get("flops") or 0.0)
    b = r.get("per_chip_bytes") or {}
    lines.append("| " + " | ".join((
        r["program"], f"{cost.bytes / MiB:.1f}", f"{argument_bytes(p) / MiB:.1f}",
        f"{b.get('arguments', 0) / MiB:.1f}", f"{xla.bytes / MiB:.1f}", f"{cost.flops / 1e9:.3f}",
        f"{xla.flops / 1e9:.3f}", f"{cost.seconds(lay.chip) * 1e6:.1f}",
        f"{xla.seconds(lay.chip) * 1e6:.1f}", f"{b.get('total', 0) / GiB:.2f}")) + " |")
  return "\n".join(lines)


def markdown(layout: Layout, aot: Sequence[Mapping[str, Any]]) -> str:
  """A job's roofline.md: the three tables for the layout it compiled."""
  rec = {"metrics": {"layout": layout.name, "aot": list(aot)}}
  return "\n\n".join((summary_table([rec]), table2_table([rec]), check_table([rec])))
