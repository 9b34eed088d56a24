"""Ahead-of-time compilation for TPU on this CPU host (issue 18).

The compile tests need libtpu (the `tpu` extra) and are skipped without it; the HLO reader and the
slice names are checked everywhere. The smoke config compiles for a v4-8 (v4:2x2x1) in well under
a minute; the paper configs' XXL compiles are not tests (README, "Ahead-of-time compilation").
"""
import json
import os

import pytest

from specdec_jax.aot import hlo, topologies

needs_libtpu = pytest.mark.skipif(not topologies.libtpu_available(),
                                  reason="libtpu is not installed (pip install -e '.[tpu]')")

LOOP_WITH_CALLBACK = """HloModule m

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]) parameter(0)
  %f = f32[8] fusion(%p), kind=kLoop, calls=%fused
  %s = (f32[8], u32[], token[]) send(%f, %t), channel_id=1, is_host_transfer=true
  ROOT %r = (s32[], f32[8]) tuple(%i, %f)
}

%fused (a: f32[8]) -> f32[8] {
  ROOT %m = f32[8] multiply(%a, %a)
}

%cond (p: (s32[], f32[8])) -> pred[] {
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (x: f32[8]) -> f32[8] {
  %o = token[] outfeed(%x, %tok)
  %w = (s32[], f32[8]) while(%init), condition=%cond, body=%body
  ROOT %g = f32[8] get-tuple-element(%w), index=1
}
"""


def test_host_transfers_are_found_only_inside_loops():
  comps = hlo.computations(LOOP_WITH_CALLBACK)
  assert set(comps) == {"body", "fused", "cond", "main"}
  assert hlo.loop_computations(comps) == {"body", "fused", "cond"}
  found = hlo.host_transfers_in_loops(LOOP_WITH_CALLBACK)
  assert len(found) == 1 and found[0].startswith("host transfer: body:")  # not the entry outfeed
  assert hlo.host_transfers_in_loops(LOOP_WITH_CALLBACK.replace(
      ", channel_id=1, is_host_transfer=true", "").replace("send(", "add(")) == []


def test_slice_names():
  t = topologies.parse("v4-32")
  assert (t.topology_name, t.num_chips, t.num_hosts) == ("v4:2x2x4", 16, 4)
  assert topologies.parse("v4-8").topology_name == "v4:2x2x1"
  assert topologies.parse("v5e-8").num_chips == 8
  assert topologies.parse("v4:2x2x1").num_chips == 4
  with pytest.raises(ValueError, match="unknown TPU slice 'v4-6'"):
    topologies.parse("v4-6")


@needs_libtpu
def test_a_program_over_the_hbm_budget_is_reported_not_raised():
  import jax
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  from specdec_jax.aot import memory
  devices = topologies.devices(topologies.parse("v4:2x2x1"))
  available = memory.usable_hbm_bytes(devices)
  assert 28 * 2 ** 30 < available <= 32 * 2 ** 30  # a v4 chip: 32 GiB less the runtime's share
  mesh = Mesh(np.asarray(devices), ("x",))
  big = jax.ShapeDtypeStruct((40 * 2 ** 30 // 4,), np.float32, sharding=NamedSharding(mesh, P()))
  res = memory.compile_program("big", "test", (jax.jit(lambda x: x[:8]), (big,), {}),
                               available, has_loop=False)
  assert res.fits is False and res.needed_bytes >= 40 * 2 ** 30
  assert res.available_bytes == available


@needs_libtpu
def test_smoke_config_compiles_for_a_v4_8(tmp_path):
  from specdec_jax.aot import cli
  lines = []
  status = cli.run(["configs/local/smoke.gin"], str(tmp_path), "v4:2x2x1",
                   gin_bindings=["RunConfig.mesh = @MeshConfig()", "MeshConfig.data = 2",
                                 "MeshConfig.model_outer = 1", "MeshConfig.model_inner = 2"],
                   log=lines.append)
  assert status == 0, "\n".join(lines)
  recs = json.loads((tmp_path / "aot.json").read_text())
  by_kind = {r["kind"]: r for r in recs}
  assert set(by_kind) == {"spec_prefill", "spec_loop", "ar_prefill", "ar_loop"}
  for r in recs:
    assert r["topology"] == "v4:2x2x1" and r["num_chips"] == 4
    assert r["mesh"] == {"data": 2, "model_outer": 1, "model_inner": 2}
    assert r["fits"] is True and r["host_transfers_in_loop"] == 0
    b = r["per_chip_bytes"]
    assert b["total"] == (b["arguments"] + b["unused_arguments"] + b["outputs"] - b["aliased"] +
                          b["temporaries"] + b["code"])
    assert 0 < b["total"] < r["hbm_bytes_per_chip"]
  # The loop receives the prefill's state donated: XLA aliases it to the loop's output.
  assert by_kind["spec_loop"]["per_chip_bytes"]["aliased"] > 0
  # The loops read no encoder weights (cross-attention K/V are cached); those stay on the chip.
  assert by_kind["ar_loop"]["per_chip_bytes"]["unused_arguments"] > 0
  assert os.path.exists(tmp_path / "aot.json") and any("spec_loop" in l for l in lines)


def test_each_compiled_program_is_reported_as_it_finishes():
  # The CLI rewrites aot.json from these calls, so a job stopped part-way keeps what it compiled.
  import jax
  import numpy as np
  from specdec_jax.aot import job, programs
  x = jax.ShapeDtypeStruct((8,), np.float32)
  progs = [programs.Program("double", "test", lambda _: (jax.jit(lambda a: a * 2), (x,), {})),
           programs.Program("square", "test", lambda _: (jax.jit(lambda a: a * a), (x,), {}))]
  seen = []
  results = job._compile_all(progs, None, lambda _: None, lambda so_far: seen.append(
      [r.program for r in so_far]))
  assert seen == [["double"], ["double", "square"]]
  assert [r.fits for r in results] == [True, True] and all(r.compiled is None for r in results)


def test_a_step_record_names_the_chips_its_model_is_split_over():
  # The roofline divides weights and caches by this: the mesh axes the model's 'heads' rule names.
  from types import SimpleNamespace
  from specdec_jax.aot import steps
  mesh = SimpleNamespace(shape={"data": 1, "model_outer": 2, "model_inner": 2})
  def rules(heads):
    return SimpleNamespace(axis_rules=(("batch", "data"), ("heads", heads)))
  assert steps.model_chips(rules(("model_outer", "model_inner")), mesh) == 4
  assert steps.model_chips(rules("model_inner"), mesh) == 2
  assert steps.model_chips(rules(None), mesh) == 1
  assert steps.model_chips(SimpleNamespace(axis_rules=None), mesh) == 1


@needs_libtpu
def test_the_roofline_steps_compile_and_carry_what_the_roofline_needs(tmp_path):
  # --roofline on a v4-8 mesh (target over 4 chips, draft over 2): every step compiles with the
  # cache laid out as prefill leaves it, and its record recomputes the layout it ran on.
  from specdec_jax.aot import cli, roofline
  lines = []
  status = cli.run(["configs/local/smoke.gin"], str(tmp_path), "v4:2x2x1", roofline_tokens=3,
                   only=["target_step", "verify", "draft_step"],
                   gin_bindings=["RunConfig.mesh = @MeshConfig()", "MeshConfig.data = 1",
                                 "MeshConfig.model_outer = 2", "MeshConfig.model_inner = 2"],
                   log=lines.append)
  assert status == 0, "\n".join(lines)
  recs = json.loads((tmp_path / "aot.json").read_text())
  assert [r["program"] for r in recs] == ["target_step[T=1]", "verify[T=2]", "verify[T=3]",
                                          "draft_step[draft=t5_test_draft]"]
  layout = roofline.layout_from_aot(recs, "smoke")
  assert layout.target.chips == 4 and layout.drafts["t5_test_draft"].chips == 2
  assert layout.target.cache_len == 16 + 2 + 2  # max_decode_len + gamma (2) + 2 slack slots
  assert json.loads((tmp_path / "roofline.json").read_text())["layout"].startswith("v4:2x2x1")
  assert "| target_step[T=1] |" in (tmp_path / "roofline.md").read_text()


@needs_libtpu
@pytest.mark.slow  # ~3 min: Llama 3.1 70B's 80 layers, unrolled, compiled for 8 TPU v4 chips
def test_chen_xsum_compiles_on_a_v4_16(tmp_path):
  # Chen et al.'s setup (configs/paper/chen): the 70B-class target over all 8 chips, the 1B
  # draft over 2; the speculative loop fits with no host transfer (figures: docs/aot_results.md).
  from specdec_jax.aot import cli
  lines = []
  status = cli.run(["configs/paper/chen/xsum_greedy.gin", "configs/paper/chen/mesh_tpu_v4_16.gin"],
                   str(tmp_path), "v4-16", only=["spec_loop"], log=lines.append)
  assert status == 0, "\n".join(lines)
  recs = json.loads((tmp_path / "aot.json").read_text())
  assert [r["kind"] for r in recs] == ["spec_prefill", "spec_loop"]
  for r in recs:
    assert r["num_chips"] == 8 and r["fits"] is True and r["host_transfers_in_loop"] == 0
    assert r["mesh"] == {"data": 1, "model_outer": 4, "model_inner": 2}
    # 70.6B bfloat16 parameters over 8 chips: about 16.4 GiB of weights on each.
    assert 16 * 2 ** 30 < r["per_chip_bytes"]["total"] < r["hbm_bytes_per_chip"]
