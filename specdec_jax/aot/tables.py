"""The TPU roofline's docs tables, rendered from records holding AOT jobs' aot.json
(docs/roofline_tpu_v4.md, docs/aot_results.md): what `metrics.results.render` takes beside its
own tables (scripts/results.py passes them), so metrics/ never imports aot/.
"""
from __future__ import annotations

from specdec_jax.aot import feature_roofline, roofline, tree_roofline

TABLES = {
    "roofline": roofline.summary_table,          # one line per layout
    "roofline_table2": roofline.table2_table,    # one layout's Table-2 predictions
    "roofline_check": roofline.check_table,      # one layout's steps beside the compiler's
    "roofline_trees": tree_roofline.trees_table,  # one layout's Table-2 rows, trees beside chains
    "aot_trees": tree_roofline.compiled_trees_table,  # the tree programs an AOT job compiled
    "aot_feature": feature_roofline.compiled_table,  # a feature draft's programs and its c
    "chen_roofline": lambda records: chen_table(records),  # Chen's Table 1 on the roofline
    "aot_programs": lambda records: programs_table(records),  # every program of AOT jobs
    "aot_configs": lambda records: configs_table(records),    # per config and slice
}


def _row_cells(r) -> dict:
  b = r.get("per_chip_bytes") or {}
  mesh = r["mesh"]
  return {"slice": f"{r['topology']}, ({mesh['data']}, {mesh['model_outer']}, "
                   f"{mesh['model_inner']})",
          "total": b.get("total", r.get("needed_bytes")), "args": b.get("arguments"),
          "temps": b.get("temporaries"), "fits": r.get("fits"),
          "xfers": r.get("host_transfers_in_loop")}


def _gib(x) -> str:
  return "-" if x is None else f"{x / roofline.GiB:.2f}"


def _configs(r) -> str:
  return " ".join(c.split("configs/paper/", 1)[-1] for c in r.get("config") or [])


def programs_table(records) -> str:
  """Per program of each record's AOT job (experiments/aot_paper_jobs.py and the other aot_*
  records): per chip the compiler's arguments, temporaries and total (GiB, unread resident
  weights included), whether it fits the usable HBM, host transfers inside the loop, compile
  seconds on the 2-core host (they say nothing about the TPU)."""
  head = ["record", "config (gin files)", "slice, mesh (data, outer, inner)", "program", "args",
          "temps", "total", "fits", "host transfers in loop", "compile s"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for rec in records:
    for r in rec["metrics"]["aot"]:
      c = _row_cells(r)
      lines.append("| " + " | ".join([
          rec["name"], _configs(r), c["slice"], r["program"], _gib(c["args"]), _gib(c["temps"]),
          _gib(c["total"]), {True: "yes", False: "**no**"}.get(c["fits"], "-"),
          "-" if c["xfers"] is None else str(c["xfers"]),
          "-" if r.get("compile_seconds") is None else f"{r['compile_seconds']:.0f}"]) + " |")
  return "\n".join(lines)


def configs_table(records) -> str:
  """Per (config, slice) over the named records' programs: how many distinct programs compiled,
  the per-chip total's range, whether all fit, the host transfers inside loops, which records."""
  groups: dict = {}
  for rec in records:
    for r in rec["metrics"]["aot"]:
      key = (_configs(r), r["topology"])
      g = groups.setdefault(key, {"programs": {}, "records": []})
      g["programs"][r["program"]] = _row_cells(r)
      if rec["name"] not in g["records"]:
        g["records"].append(rec["name"])
  head = ["config (gin files)", "slice", "distinct programs", "per-chip total GiB (min-max)",
          "all fit", "host transfers in loops", "records"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for (configs, topology), g in groups.items():
    cells = list(g["programs"].values())
    totals = [c["total"] for c in cells if c["total"] is not None]
    span = f"{_gib(min(totals))}-{_gib(max(totals))}" if totals else "-"
    fits = "yes" if all(c["fits"] for c in cells) else "**no**"
    xfers = sum(c["xfers"] or 0 for c in cells)
    lines.append("| " + " | ".join([configs, topology, str(len(cells)), span, fits, str(xfers),
                                    ", ".join(g["records"])]) + " |")
  return "\n".join(lines)


def chen_table(records) -> str:
  """Chen et al.'s Table 1 rows predicted on the roofline (`scripts/chen_roofline.py`'s record:
  the predicted figures as computed at its commit), beside Chen's measurement."""
  rows = [r for rec in records for r in rec["metrics"]["rows"]]
  alphas = records[0]["metrics"]["alphas"]
  head = ["experiment", "target chips", "K", "AR ms/token (roofline)", "c", "v(K+1)",
          f"spec ms/token at alpha {' / '.join(alphas)}",
          "Chen (Chinchilla 70B, 16 chips, K = 4)", "alpha for Chen's speedup"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    chen = r["chen"]
    need = r["alpha_for_chen_speedup"]
    lines.append("| " + " | ".join([
        r["experiment"], str(r["target_chips"]), str(r["K"]), f"{r['ar_ms']:.2f}",
        f"{r['c']:.4f}", f"{r['v']:.3f}", " / ".join(f"{r['spec_ms'][a]:.2f}" for a in alphas),
        f"{chen['ar_ms']} -> {chen['spec_ms']} ({chen['speedup']}x)",
        "-" if need is None else f"{need:.2f}"]) + " |")
  return "\n".join(lines)
