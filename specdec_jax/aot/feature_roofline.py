"""A feature-level draft's c on the TPU roofline (`aot.roofline`), beside a token draft's.

Why its own placement: a feature draft (models/feature_draft.py) is not a `ModelConfig`, but one
draft step is a one-layer T5 (or decoder-only) decoder step of its block (`block_config()`:
self-attention, cross-attention q/o over the target's encoder output, the gated MLP, the final
norm and the copied [D, V] head) plus its input projection ([target_dim + emb_dim] -> emb_dim,
the token embedding and the feature fused into the block's input) and, for a block narrower
than the target, the head projection. Counted that way, the roofline's byte and flop basis holds
unchanged. The fusion of the target's states (n x target_dim -> emb_dim) runs once per iteration,
on the verify side, over the G + 1 verified positions: it is reported beside c (`fuse_c`), not
in it, as the lone-extend timer leaves it out of the measured c (`feature_entries.LoneStep`).
"""
from __future__ import annotations

import dataclasses

from specdec_jax.aot import roofline
from specdec_jax.models.feature_draft_config import FeatureDraftConfig


def step_extra_params(cfg: FeatureDraftConfig) -> int:
  """Weights one draft step reads beyond its block as a one-layer decoder: the input
  projection; a block narrower than the target with the target's head adds the head
  projection and the head's (and final norm's) extra width, which `weight_params_read` counts
  at the block's width."""
  extra = (cfg.target_dim + cfg.emb_dim) * cfg.emb_dim
  wider = cfg.target_dim - cfg.emb_dim
  if cfg.head == "target" and wider:
    extra += cfg.emb_dim * cfg.target_dim + (cfg.vocab_size + 1) * wider
  return extra


def fuse_params(cfg: FeatureDraftConfig) -> int:
  """The fusion's weights, read once per iteration (n feature layers x target_dim -> emb_dim)."""
  return len(cfg.feature_layers) * cfg.target_dim * cfg.emb_dim


def placement(cfg: FeatureDraftConfig, *, batch: int, prompt_len: int, cache_len: int,
              chips: int) -> roofline.Placement:
  """The draft's step as the roofline places a model: its block, its cache (one layer, and the
  cross-attention K/V of the target's encoder output for T5) and the chips it is split over.
  Its weights read per step are every parameter but the token embedding (one row per token),
  the fusion (per iteration: `fuse_c`) and T5's cross-attention key / value (applied once, at
  prefill); tests/aot/test_feature_roofline.py holds the count to the draft's own params."""
  block = cfg.block_config()
  return roofline.Placement(block, batch=batch, prompt_len=prompt_len, cache_len=cache_len,
                            chips=chips, extra_params=step_extra_params(cfg))


def fuse_c(layout: roofline.Layout, cfg: FeatureDraftConfig, gamma: int) -> float:
  """One iteration's fusion of G + 1 target states over one target step: weights read once
  (replicated on every chip: its kernel's axes are not sharded), flops per position."""
  p = layout.target
  weights = fuse_params(cfg) * p.act_bytes
  flops = 2 * fuse_params(cfg) * (gamma + 1) * p.batch
  cost = roofline.Cost(bytes=weights, flops=flops)
  return cost.seconds(layout.chip) / layout.target_s()


def with_feature_draft(layout: roofline.Layout, name: str, cfg: FeatureDraftConfig, *,
                       chips: int) -> roofline.Layout:
  """`layout` with the feature draft beside its drafts, on the target's batch, prompt and cache
  lengths (the caches' slack is the layout's gamma, as its drafts')."""
  t = layout.target
  draft = placement(cfg, batch=t.batch, prompt_len=t.prompt_len, cache_len=t.cache_len,
                    chips=chips)
  return dataclasses.replace(layout, drafts={**layout.drafts, name: draft})


def c_table(layout: roofline.Layout, name: str, cfg: FeatureDraftConfig, gamma: int,
            chips: int) -> dict:
  """{draft: {c, iteration_us, chips}} for every draft of the layout with the feature draft
  among them, and the feature draft's per-iteration fusion as `fuse_c`."""
  lay = with_feature_draft(layout, name, cfg, chips=chips)
  out = {d: dict(c=lay.c(d), iteration_us=lay.draft_s(d) * 1e6, chips=p.chips,
                 params_read=p.params_read) for d, p in lay.drafts.items()}
  out[name]["fuse_c"] = fuse_c(lay, cfg, gamma)
  return dict(layout=lay.name, target_step_us=lay.target_s() * 1e6, drafts=out)


def layout_for_mesh(layout: roofline.Layout, name: str, target_chips: int,
                    draft_chips: int) -> roofline.Layout:
  """A recorded layout's models on another mesh: the target over `target_chips`, its drafts
  over `draft_chips` (the roofline divides weights and caches by them; shapes unchanged)."""
  drafts = {k: dataclasses.replace(p, chips=draft_chips) for k, p in layout.drafts.items()}
  return dataclasses.replace(layout, name=name, drafts=drafts,
                             target=dataclasses.replace(layout.target, chips=target_chips))


def compiled_table(records) -> str:
  """The programs an AOT job compiled for a feature-level draft (per chip the compiler's bytes
  against the usable HBM, host transfers inside the loop, compile seconds) and, per record,
  the roofline's c of its draft beside T5-small's (`c_table`, stored in the record)."""
  head = ("slice, mesh (data, outer, inner)", "program",
          "per chip: arguments / temporaries / total (GiB)", "usable HBM (GiB)", "fits",
          "host transfers in the loop", "compile (s, 2-core host)",
          "roofline c: feature draft (+ fusion per iteration) / T5-small")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for rec in records:
    m = rec["metrics"]
    drafts = m["roofline"]["drafts"]
    feature = drafts[m["feature_draft"]]
    c = (f"{feature['c']:.4f} (+ {feature['fuse_c']:.4f}) / "
         f"{drafts['t5_1_1_small']['c']:.4f}")
    for r in m["aot"]:
      b = r.get("per_chip_bytes") or {}
      mesh = r["mesh"]
      lines.append("| " + " | ".join((
          f"{r['topology']}, ({mesh['data']}, {mesh['model_outer']}, {mesh['model_inner']})",
          r["program"],
          " / ".join(f"{b.get(k, 0) / roofline.GiB:.2f}"
                     for k in ("arguments", "temporaries", "total")),
          f"{(r.get('hbm_bytes_per_chip') or 0) / roofline.GiB:.2f}",
          {True: "yes", False: "NO"}.get(r.get("fits"), "-"),
          str(r.get("host_transfers_in_loop", "-")), f"{r.get('compile_seconds') or 0:.0f}",
          c)) + " |")
  return "\n".join(lines)
