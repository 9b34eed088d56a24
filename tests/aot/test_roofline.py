"""The TPU roofline's arithmetic (specdec_jax/aot/roofline.py) and its committed records.

Why: the roofline printed v(2) = 0.955 (XLA's byte count charged a one-token step more than a
two-token one) and left the draft's sampling out of c. These pin the byte basis on a case small
enough to count by hand, v(T) >= 1 and monotone, c with sampling, the formula the Table-2 rows
use, and that the committed records (docs/results/roofline_tpu_v4_*.json) agree with what the
compiler said about the same programs. Pure Python: no jax, no libtpu.
"""
import dataclasses
import json
import os
import re

import pytest

from specdec_jax.aot import roofline as R
from specdec_jax.aot import topologies
from specdec_jax.metrics import theory
from specdec_jax.models.model_config import ModelConfig, get_preset

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDS = {k: os.path.join(ROOT, "docs", "results", f"roofline_tpu_v4_{k}.json")
           for k in ("one_chip", "mesh")}
V4 = topologies.CHIPS["v4"]
# e 2, inner 2, mlp 3, one decoder layer, one head, 4 position buckets, vocabulary 10, float32
TINY = ModelConfig(kind="t5", vocab_size=10, emb_dim=2, num_heads=1, head_dim=2, mlp_dim=3,
                   num_encoder_layers=1, num_decoder_layers=1, relative_attention_num_buckets=4)


def _record(kind):
  with open(RECORDS[kind], encoding="utf-8") as f:
    return json.load(f)


def _xxl_layout(target_chips, draft_chips):
  p = lambda name, chips: R.Placement(get_preset(name, dtype="bfloat16"), batch=1,  # noqa: E731
                                      prompt_len=512, cache_len=137, chips=chips)
  return R.Layout("test", V4, p("t5_1_1_xxl", target_chips),
                  {d: p(d, draft_chips) for d in ("t5_1_1_small", "t5_1_1_base", "t5_1_1_large")})


def test_a_tiny_step_counted_by_hand():
  # Weights a step reads: self-attention 4*2*2 + MLP 3*2*3 + two norms 2*2 + cross q, o 2*2*2
  # + its norm 2 = 48 per layer; + position table 1*4 + final norm 2 + logits 10*2 = 74.
  assert R.weight_params_read(TINY) == 74
  # K/V: 2 (k, v) * 2 (inner) * 4 bytes per slot, over 5 cache slots and 3 prompt positions.
  p = R.Placement(TINY, batch=1, prompt_len=3, cache_len=5, chips=1)
  assert R.cache_bytes(p) == 16 * 8
  # One token: weights 74*4 + caches 128 + its K/V written (2*2*4) and embedding row (2*4), plus
  # sampling: 4 passes over 10 float32 logits. Flops: 2 per weight + attention 4*2*(5+3).
  assert R.step_cost(p, 1) == R.Cost(bytes=296 + 128 + 24 + 160, flops=2 * 74 + 64)
  assert R.step_cost(p, 1, sampling=False) == R.Cost(bytes=448, flops=212)
  # Three tokens read the weights and caches once: only the per-token terms grow.
  assert R.step_cost(p, 3) == R.Cost(bytes=296 + 128 + 3 * 24 + 3 * 160, flops=3 * 212)
  # Over two chips the weights, caches and flops split; the sampling (gathered logits) does not.
  two = R.Placement(TINY, batch=1, prompt_len=3, cache_len=5, chips=2)
  assert R.step_cost(two, 1) == R.Cost(bytes=448 / 2 + 160, flops=106)
  chip = topologies.Chip("toy", peak_flops_bf16=100.0, hbm_bytes=1 << 30, hbm_bytes_per_s=1000.0,
                         ici_links=0)
  assert R.step_cost(p, 1).seconds(chip) == pytest.approx(2.12)   # compute-bound: 212 / 100
  fast = dataclasses.replace(chip, peak_flops_bf16=1e6)
  assert R.step_cost(p, 1).seconds(fast) == pytest.approx(0.608)  # HBM-bound: 608 / 1000


@pytest.mark.parametrize("name", ["t5_1_1_xxl", "t5_1_1_small", "t5_test_shared_draft",
                                  "decoder_97m", "llama3_1_70b"])
def test_what_a_step_does_not_read_is_the_rest_of_the_model(name):
  # read + the token embedding + cross-attention k, v + the encoder (or the shared draft's
  # projection) is every parameter: nothing counted twice or forgotten.
  cfg = get_preset(name)
  e, i, m = cfg.emb_dim, cfg.num_heads * cfg.head_dim, cfg.mlp_dim
  rest = cfg.vocab_size * e
  if cfg.is_encoder_decoder:
    rest += cfg.num_decoder_layers * 2 * e * i
    if cfg.shares_encoder:
      rest += 0 if cfg.source_dim == e else cfg.source_dim * e
    else:
      rest += (cfg.num_encoder_layers * (4 * e * i + 3 * e * m + 2 * e)
               + cfg.num_heads * cfg.relative_attention_num_buckets + e)
  assert R.weight_params_read(cfg) + rest == cfg.num_params()


@pytest.mark.parametrize("chips", [(1, 1), (4, 2)])
def test_v_is_at_least_one_and_never_falls(chips):
  lay = _xxl_layout(*chips)
  vs = [lay.v(t) for t in range(1, 65)]
  assert vs[0] == 1.0
  assert all(b >= a for a, b in zip(vs, vs[1:])) and min(vs) >= 1.0
  # Memory-bound at batch 1: 64 tokens cost a few percent more than one, not 64 times.
  assert vs[-1] < 1.1


def test_the_draft_iteration_includes_its_sampling():
  lay = _xxl_layout(1, 1)
  small = lay.drafts["t5_1_1_small"]
  bare = R.step_cost(small, 1, sampling=False).seconds(V4)
  sampling = R.SAMPLING_PASSES * small.config.vocab_size * R.LOGITS_BYTES / V4.hbm_bytes_per_s
  assert lay.draft_s("t5_1_1_small") == pytest.approx(bare + sampling)
  assert lay.c("t5_1_1_small") == pytest.approx((bare + sampling) / lay.target_s())
  # The target step, the unit of c and v, samples too.
  assert lay.target_s() > R.step_cost(lay.target, 1, sampling=False).seconds(V4)


def test_t5_xxl_on_four_chips_reads_a_quarter_of_its_weights_per_chip():
  # The floor the old table missed by 4x (10.46 ms): about 2.6 GiB of weights per chip.
  lay = _xxl_layout(4, 2)
  weights = R.weight_params_read(lay.target.config) * 2 / 4
  assert 2.5 * 2 ** 30 < weights < 2.7 * 2 ** 30
  assert 2.2e-3 < lay.target_s() < 2.5e-3
  assert lay.target_s() == pytest.approx(_xxl_layout(1, 1).target_s() / 4, rel=0.01)


def test_the_speedup_formula_gives_the_papers_expected_speedups_from_its_c():
  # Leviathan Table 4: its expected speedup is this formula at its measured c and v = 1.
  for _, draft, _, gamma, alpha, expected, _ in R.PAPER_TABLE2:
    assert theory.predicted_speedup(alpha, gamma, R.PAPER_C[draft], 1.0) == pytest.approx(
        expected, abs=0.1)


def _table_rows(markdown):
  lines = [line for line in markdown.splitlines() if line.startswith("|")]
  return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_the_paper_layout_table_is_the_formula_on_its_c_and_v():
  rec = _record("one_chip")
  lay = R.layout_of_record(rec)
  assert lay.target.chips == 1 and {p.chips for p in lay.drafts.values()} == {1}
  rows = lay.table2()
  assert len(rows) == 12
  for row, cells in zip(rows, _table_rows(R.table2_table([rec]))):
    c, v = lay.c(row["draft"]), lay.v(row["gamma"] + 1)
    predicted = theory.predicted_speedup(row["alpha"], row["gamma"], c, v)
    assert row["predicted"] == predicted and v >= 1.0
    assert cells[5:8] == [f"{c:.4f}", f"{v:.4f}", f"{predicted:.2f}x"]
  assert "predicted from the paper's alpha (not measured)" in R.table2_table([rec])


def test_the_mesh_record_splits_the_target_over_four_chips_and_the_drafts_over_two():
  lay = R.layout_of_record(_record("mesh"))
  assert lay.target.chips == 4 and {p.chips for p in lay.drafts.values()} == {2}
  one = R.layout_of_record(_record("one_chip"))
  for d in lay.drafts:  # a draft split over 2 chips costs less per chip, so c rises less than 4x
    assert one.c(d) < lay.c(d) < 4 * one.c(d)


@pytest.mark.parametrize("kind", ["one_chip", "mesh"])
def test_the_count_agrees_with_what_the_compiler_passes_each_step(kind):
  # The analytic arguments (weights read, the embedding table, caches) against memory_analysis.
  for rec in R.step_records(_record(kind)["metrics"]["aot"]):
    p = R.placement_of(rec)
    assert R.argument_bytes(p) == pytest.approx(rec["per_chip_bytes"]["arguments"], rel=0.015)
    assert rec["fits"] is True


def test_the_summary_line_per_layout():
  text = R.summary_table([_record("one_chip"), _record("mesh")])
  rows = _table_rows(text)
  assert len(rows) == 2 and "fits" in rows[0][-1] and "fits" in rows[1][-1]
  assert re.fullmatch(r"\d+", rows[0][3]) and int(rows[0][3]) > 3 * int(rows[1][3])


def test_a_layout_needs_a_target_step_on_one_slice():
  with pytest.raises(ValueError, match="no target_step"):
    R.layout_from_aot([{"kind": "draft_step"}], "x")
  rec = _record("one_chip")["metrics"]["aot"][0]
  with pytest.raises(ValueError, match="one slice"):
    R.layout_from_aot([rec, dict(rec, topology="v4-32")], "x")


def test_tied_gqa_model_reads_its_embedding_as_the_head_and_caches_kv_heads():
  """Llama-3.2 1B: the tied embedding is read whole once (as the head) and is every parameter
  a step reads beside the layers; its cache holds 8 key/value heads, not 32."""
  cfg = get_preset("llama3_2_1b")
  assert R.weight_params_read(cfg) == cfg.num_params()
  p = R.Placement(cfg, batch=1, cache_len=1)
  assert R.cache_bytes(p) == 2 * 8 * 64 * 4 * 16
  assert R.argument_bytes(p) == cfg.num_params() * 4 + R.cache_bytes(p)


def test_chens_layout_on_the_roofline():
  """scripts/chen_roofline.py (docs/aot_results.md, "Chen et al."): Llama 3.1 70B over 8 v4
  chips reads ~17.6 GB of bf16 weights a step, ~14.5 ms at 1.2 TB/s (Chen: 14.1 on 16 chips);
  the 1B draft over 2 chips costs c ~0.07, and verifying K + 1 tokens costs one step (v ~1)."""
  import importlib.util
  spec = importlib.util.spec_from_file_location(
      "chen_roofline", os.path.join(os.path.dirname(__file__), "..", "..", "scripts",
                                    "chen_roofline.py"))
  chen = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(chen)
  lay = chen.layout(gamma=3, prompt=1024, decode=128,
                    mesh_file="configs/paper/chen/mesh_tpu_v4_16.gin")
  assert 14.0 < lay.target_s() * 1e3 < 15.0
  assert 0.06 < lay.c("llama3_2_1b") < 0.08 and 1.0 <= lay.v(4) < 1.01
  from specdec_jax.metrics import theory
  c, v = lay.c("llama3_2_1b"), lay.v(4)
  alpha = chen.alpha_for(2.01, 3, c, v)  # the alpha at which the roofline reaches Chen's 2.01x
  assert theory.predicted_speedup(alpha, 3, c, v) == pytest.approx(2.01, abs=1e-6)
  # Over all 16 chips (kv heads held twice): about half the bytes per chip, the draft's c doubles.
  wide = chen.layout(gamma=3, prompt=1024, decode=128,
                     mesh_file="configs/paper/chen/mesh_tpu_v4_32_tp16.gin")
  assert wide.target.config.kv_heads == 16
  assert 0.49 < wide.target_s() / lay.target_s() < 0.53
  assert wide.c("llama3_2_1b") == pytest.approx(2 * c, rel=0.05)
