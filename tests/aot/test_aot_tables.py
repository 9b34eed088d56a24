"""The AOT job tables render from records (docs/aot_results.md's job tables were pasted reports).

Why: a compile job's figures belong in a record (experiments/aot_paper_jobs.py writes them) and the
docs' tables are generated from it; the renderers must show each program's cells as recorded and
summarise a config's programs (their total's range, whether all fit, any host transfer).
"""
from specdec_jax.aot import tables
from specdec_jax.metrics import results

GiB = 2 ** 30


def _program(name, total_gib, fits=True, xfers=0):
  return {"program": name, "topology": "v4-8", "mesh": {"data": 1, "model_outer": 2,
                                                         "model_inner": 2},
          "config": ["configs/paper/table2/ende_t5_small_t0.gin",
                     "configs/paper/mesh_tpu_v4_8.gin"],
          "per_chip_bytes": {"arguments": 2 * GiB, "temporaries": GiB // 4,
                             "total": int(total_gib * GiB)},
          "fits": fits, "host_transfers_in_loop": xfers, "compile_seconds": 93.4}


def test_the_program_and_config_tables_render_an_aot_records_rows():
  rec = {"name": "aot_paper_job", "metrics": {"aot": [_program("spec_loop[T=0]", 6.28),
                                                      _program("ar_loop[T=0]", 5.37)]}}
  text = "<!-- results:aot_programs aot_paper_job -->\n<!-- /results:aot_programs -->"
  out = results.render(text, {"aot_paper_job": rec}, tables.TABLES)
  assert ("| aot_paper_job | table2/ende_t5_small_t0.gin mesh_tpu_v4_8.gin | v4-8, (1, 2, 2) | "
          "spec_loop[T=0] | 2.00 | 0.25 | 6.28 | yes | 0 | 93 |") in out
  bad = {"name": "b", "metrics": {"aot": [_program("train_step", 39.86, fits=False, xfers=1)]}}
  summary = tables.configs_table([rec, bad])
  assert ("| table2/ende_t5_small_t0.gin mesh_tpu_v4_8.gin | v4-8 | 3 | 5.37-39.86 | **no** | 1 | "
          "aot_paper_job, b |") in summary
