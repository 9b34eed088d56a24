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
}
