"""The AOT builder's feature-level draft path, on this CPU's 8 forced devices (no libtpu).

Why: the paper-scale compile (configs/paper/feature/, docs/aot_results.md) takes minutes; these
check what it depends on in seconds: the gin macro pair naming a feature draft that cannot be
read, its config shaped for the target, and the runner's programs (a `Chain` with the feature
draft's `FeatureDrafter` or its parallel block, the draft on the draft rules) lowered and compiled
on a mesh with the state donated.
"""
import jax
import pytest

from specdec_jax import sharding as sh
from specdec_jax.aot import abstract, cli, job, programs
from specdec_jax.decoding.drafter import FeatureDrafter
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.feature_draft import FeatureDraft
from specdec_jax.models.feature_draft_config import FeatureDraftConfig
from specdec_jax.runner.run_config import RunConfig

XXL = "gs://b/t5_1_1_xxl/checkpoint_1000000"
FEATURE = "gs://b/specdec/a_long_path_so_that_gin_wraps_the_binding/ende_feature/export"


def test_a_wrapped_macro_pair_names_a_feature_draft():
  # gin's config_str wraps long bindings after `= \`; the pair must still be read.
  text = (f"ENDE_FEATURE_CHECKPOINT = \\\n    '{FEATURE}'\n"
          f"ENDE_FEATURE_PRESET = '{abstract.FEATURE_PRESET}'\nT5_CHECKPOINT = '{XXL}'\n")
  presets = cli.checkpoint_presets(text)
  assert presets == {FEATURE: "feature_draft"}
  target = get_preset("t5_1_1_xxl")
  got = abstract.resolve_feature(FEATURE, target, presets=presets, dtype="bfloat16")
  assert got.config == FeatureDraftConfig.for_target(target, dtype="bfloat16")
  assert (got.config.emb_dim, got.config.num_heads, got.config.feature_layers) == (
      4096, 64, (0, 12, 24))
  assert abstract.resolve_feature(XXL, target, presets=presets) is None  # a model checkpoint


def test_a_local_export_is_read_from_its_config(tmp_path):
  cfg = FeatureDraftConfig.for_target(get_preset("t5_test_target"), emb_dim=16, num_heads=2)
  (tmp_path / "feature_draft_config.json").write_text(cfg.to_json())
  got = abstract.resolve_feature(str(tmp_path), get_preset("t5_1_1_xxl"))
  assert got.config == cfg and "feature_draft_config.json" in got.source


@pytest.mark.parametrize("parallel", [False, True])
def test_feature_draft_programs_compile_on_a_mesh(parallel):
  mesh_config = sh.MeshConfig(data=2, model_outer=2, model_inner=2)
  mesh = sh.make_mesh(mesh_config)
  target_cfg = get_preset("t5_test_target")
  fcfg = FeatureDraftConfig.for_target(target_cfg, emb_dim=16, num_heads=2, mlp_dim=32)
  cfg = RunConfig(batch_size=2, max_input_length=8, max_decode_length=8, gamma=3,
                  temperature=0.0, feature_parallel=parallel)
  setup = programs.decode_setup(cfg, mesh, mesh_config, target_cfg, {"feat": fcfg})
  draft, dparams = setup.drafts["feat"]
  assert isinstance(draft, FeatureDraft) and draft.axis_rules == mesh_config.rules_for("draft")
  # The block's MLP kernel split over model_inner (2 chips) only, the fusion replicated.
  wi = jax.tree.leaves(dparams["layer"]["mlp"])[0]
  assert wi.sharding.shard_shape(wi.shape) != wi.shape
  assert set(wi.sharding.spec) <= {None, "model_inner"}
  fuse = jax.tree.leaves(dparams["fuse"])[0]
  assert fuse.sharding.shard_shape(fuse.shape) == fuse.shape
  progs = job.select(programs.decode_programs(setup, mesh), ["spec_loop"])
  assert [p.kind for p in progs] == ["spec_prefill", "spec_loop"]
  decoder = progs[0].call({})[1][0]
  assert decoder.scheme == Chain(3) and decoder.drafter == FeatureDrafter(parallel=parallel)
  with jax.set_mesh(mesh):
    results = job._compile_all(progs, None, lambda _: None)  # pylint: disable=protected-access
  assert [r.error for r in results] == [None, None]
  loop = results[1]
  assert loop.host_transfers == [] and loop.per_chip_bytes["aliased"] > 0  # donated state


def test_feature_draft_tree_programs_compile_on_a_mesh():
  """GAMMA='tree' with a feature-level draft: the builder's tree run is the `TreeScheme` with
  the draft's `FeatureDrafter` (its default), compiled with the state donated (the pending
  entries batch-sharded, the state's `draft_carry`) and no host transfer."""
  from specdec_jax.decoding.tree.scheme import TreeScheme  # pylint: disable=import-outside-toplevel
  mesh_config = sh.MeshConfig(data=2, model_outer=2, model_inner=2)
  mesh = sh.make_mesh(mesh_config)
  target_cfg = get_preset("t5_test_target")
  fcfg = FeatureDraftConfig.for_target(target_cfg, emb_dim=16, num_heads=2, mlp_dim=32)
  cfg = RunConfig(batch_size=2, max_input_length=8, max_decode_length=8, gamma="tree",
                  tree=TreeScheme((2, 2)), temperature=1.0)
  setup = programs.decode_setup(cfg, mesh, mesh_config, target_cfg, {"feat": fcfg})
  progs = job.select(programs.decode_programs(setup, mesh), ["spec_loop"])
  assert [p.kind for p in progs] == ["spec_prefill", "spec_loop"]
  decoder = progs[0].call({})[1][0]
  assert isinstance(decoder.scheme, TreeScheme) and decoder.scheme.tree.num_nodes == 7
  assert decoder.drafter == FeatureDrafter()
  with jax.set_mesh(mesh):
    results = job._compile_all(progs, None, lambda _: None)  # pylint: disable=protected-access
  assert [r.error for r in results] == [None, None]
  loop = results[1]
  assert loop.host_transfers == [] and loop.per_chip_bytes["aliased"] > 0  # donated state
