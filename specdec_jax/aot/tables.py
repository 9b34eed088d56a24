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
}


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
