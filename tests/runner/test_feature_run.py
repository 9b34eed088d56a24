"""A feature-level draft through the run: selected by its checkpoint in a gin config.

Why: the feature draft (models/feature_draft.py, decoding/drafter.py) must decode from
`python -m specdec_jax.run` like any model draft: its checkpoint selects the FeatureDrafter
for the decode, the calibration decode, the timed loops ('auto') and the lone cost c; its
pairing record refuses any other target; metrics.json keeps its keys (one added: draft_kind).
The draft here is random and tiny, trained for nothing: greedy outputs must still equal the
target's own (verification keeps them exact).
"""
import jax
import numpy as np
import pytest

from specdec_jax import run
from specdec_jax.checkpoints import feature_draft_io as fd_ckpt
from specdec_jax.checkpoints import head_ranking
from specdec_jax.checkpoints import loader
from specdec_jax.decoding.adaptive import AdaptiveConfig
from specdec_jax.decoding.decoder import Decoder
from specdec_jax.decoding.draft_schemes import plan
from specdec_jax.decoding.drafter import FeatureDrafter
from specdec_jax.decoding.feature_entries import LoneStep
from specdec_jax.decoding.lookup_feature import LookupFeatureDrafter
from specdec_jax.decoding.speculative import Chain
from specdec_jax.decoding.tree.dynamic import DynamicTreeScheme
from specdec_jax.decoding.tree.lookup_scheme import LookupTreeScheme
from specdec_jax.decoding.tree.scheme import TreeScheme
from specdec_jax.models.feature_draft import FeatureDraft
from specdec_jax.models.feature_draft_config import FeatureDraftConfig
from specdec_jax.runner.schedule import FeatureChain
from specdec_jax.runner import run_config as rc
from specdec_jax.runner import drafts as drafts_lib
from specdec_jax.runner import costs

pytestmark = pytest.mark.usefixtures("clean_gin")


def _save_feature_draft(path, target_seed=0):
  """A random feature draft for the smoke config's target (the preset at `target_seed`)."""
  target, tp = loader.load_model("t5_test_target", seed=target_seed)
  draft = FeatureDraft(FeatureDraftConfig.for_target(target.config, emb_dim=16, num_heads=2,
                                                     head_dim=8, mlp_dim=32))
  params = draft.with_target_pieces(draft.init(jax.random.key(1)), tp)
  return fd_ckpt.save(str(path), draft, params, target_name="t5_test_target", target_params=tp)


def test_checkpoint_selects_the_feature_kind_and_scheme(tmp_path):
  path = _save_feature_draft(tmp_path / "fd" / "export")
  cfg = rc.RunConfig(draft_checkpoint=[path, "t5_test_draft"])
  feature, model = rc.draft_specs(cfg)
  assert feature.kind == rc.FEATURE_DRAFT and feature.name == "fd"  # not 'export'
  assert model.kind == rc.MODEL_DRAFT and model.name == "t5_test_draft"
  target = loader.load_model("t5_test_target", seed=0)[0]
  draft, _ = fd_ckpt.load(path, loader.load_model("t5_test_target", seed=0)[1])
  assert plan(draft, 3) == (Chain(3), None)  # the draft's default drafter:
  assert Decoder(target, draft, Chain(3)).drafter == FeatureDrafter()
  assert plan(loader.load_model("t5_test_draft")[0], 3) == (Chain(3), None)
  # GAMMA='adaptive' drafts from the target's states too (the same drafter), not in parallel
  drafts_lib.check_feature_run(rc.RunConfig(draft_checkpoint=path, gamma="adaptive"), [feature])
  assert Decoder(target, draft, AdaptiveConfig(4)).drafter == FeatureDrafter()
  for gamma in ("adaptive", "tree"):  # neither drafts a block in one call
    with pytest.raises(ValueError, match="not combined with feature_parallel"):
      drafts_lib.check_feature_run(rc.RunConfig(draft_checkpoint=path, gamma=gamma,
                                                feature_parallel=True), [feature])
  # Static and dynamic trees are drafted from the target's states (the same drafter); the
  # prompt-lookup tree (tokens of the history) is refused.
  drafts_lib.check_feature_run(rc.RunConfig(draft_checkpoint=path, gamma="tree"), [feature])
  drafts_lib.check_feature_run(rc.RunConfig(draft_checkpoint=path, gamma="auto",
                                            tree_candidates=((2, 1), DynamicTreeScheme())),
                               [feature])
  for tree in (TreeScheme((2, 1)), DynamicTreeScheme()):
    assert plan(draft, tree) == (tree, None)
    assert Decoder(target, draft, tree).drafter == FeatureDrafter()
  with pytest.raises(ValueError, match="drafts from tokens"):
    drafts_lib.check_feature_run(
        rc.RunConfig(draft_checkpoint=path, gamma="tree", tree=LookupTreeScheme()), [feature])


def test_pairing_refuses_another_target_and_lone_step_times_one_entry(tmp_path):
  path = _save_feature_draft(tmp_path / "fd", target_seed=1)  # trained on another target
  spec = rc.DraftSpec(rc.FEATURE_DRAFT, path)
  target, tp = loader.load_model("t5_test_target", seed=0)
  with pytest.raises(ValueError, match="pair it with its own target"):
    drafts_lib.load_draft(spec, target, tp, drafts_lib.DraftSettings())
  other, otp = loader.load_model("t5_test_target", seed=1)
  draft, dp = drafts_lib.load_draft(spec, other, otp, drafts_lib.DraftSettings(head_vocab=16))
  step = LoneStep(draft)  # what the lone-extend timer calls for c
  prompt = np.array([[5, 6, 1]], np.int32)
  cache = step.prefill(dp, prompt, 8, encoded=other.encode(otp, prompt))
  logits, cache = step.extend(dp, cache, np.array([[3]], np.int32))
  assert logits.shape == (1, 1, draft.vocab_size) and int(cache.index_B[0]) == 1


def test_feature_parallel_decodes_the_draft_with_the_parallel_chain(tmp_path):
  """RunConfig.feature_parallel: every program the run builds for a feature draft (decode,
  calibration, timed loops: `draft_schemes.plan`, `costs.scheme_of`) is its chain with
  `FeatureDrafter(parallel=True)`, the draft's own mask token (the pad id when it was not block-trained); the loaded draft is the same
  object either way (the choice is the run's, not the model's); a run without a feature draft
  refuses."""
  path = _save_feature_draft(tmp_path / "fd")
  target, tp = loader.load_model("t5_test_target", seed=0)
  spec = rc.DraftSpec(rc.FEATURE_DRAFT, path)
  settings = drafts_lib.DraftSettings.for_run(rc.RunConfig(feature_parallel=True), None)
  draft, _ = drafts_lib.load_draft(spec, target, tp, settings)
  plain, _ = drafts_lib.load_draft(spec, target, tp, drafts_lib.DraftSettings())
  assert draft == plain
  parallel = (Chain(3), FeatureDrafter(parallel=True))
  assert plan(draft, 3, parallel=True) == parallel
  assert costs.scheme_of(3, draft, parallel=True) == parallel
  assert plan(plain, 3) == (Chain(3), None) == costs.scheme_of(3, plain)
  assert draft.mask_id == draft.pad_id  # not block-trained: the mask entries' token is the pad
  cfg = rc.RunConfig(feature_parallel=True)
  with pytest.raises(ValueError, match="feature_parallel"):
    drafts_lib.check_feature_run(cfg, rc.draft_specs(cfg))


@pytest.mark.slow  # ~25 s of CPU on 2 cores (compiles: costs, calibration, loops, decodes)
def test_run_with_a_feature_draft_matches_greedy_autoregressive(tmp_path):
  """Fixed gamma, batch 2, T = 0, benchmark mode: the metrics contract and exact outputs."""
  path = _save_feature_draft(tmp_path / "fd" / "export")
  (m,) = run.run(["configs/local/smoke.gin"], str(tmp_path / "out"), [
      f"DRAFT_CHECKPOINT = '{path}'", "GAMMA = 2", "NUM_EXAMPLES = 4", "BATCH_SIZE = 2",
      "MAX_DECODE_LENGTH = 8", "RunConfig.repeats = 1", "RunConfig.gamma_max = 2",
      "RunConfig.auto_calibration_gamma = 2"])
  assert m["run"] == "draft=fd,gamma=2,temperature=0" and m["draft_kind"] == "feature"
  assert m["greedy_match_rate"] == 1.0 and m["num_examples"] == 4
  for key in ("alpha", "acceptance_rate", "tokens_per_target_call", "c", "v", "speedup",
              "speedup_predicted", "ar_ms_per_token", "spec_ms_per_token", "quality"):
    assert key in m, key
  assert m["c"] > 0 and m["tokens_per_target_call"] >= 1.0


@pytest.mark.slow  # ~40 s of CPU on 2 cores: the tree decode, its probe and its timed loop
def test_run_with_a_feature_draft_tree_fixed_and_among_auto_candidates(tmp_path):
  """GAMMA='tree' and 'auto' with a static tree candidate, T = 0, with a feature draft: the tree
  point decodes the target's own tokens with its FeatureDrafter (the row carries the tree), and
  'auto' probes and times the feature tree beside the chains (its memo names the probe tree)."""
  path = _save_feature_draft(tmp_path / "fd" / "export")
  metrics = run.run(["configs/local/smoke.gin"], str(tmp_path / "out"), [
      f"DRAFT_CHECKPOINT = '{path}'", "GAMMA = ['tree', 'auto']", "NUM_EXAMPLES = 4",
      "BATCH_SIZE = 2", "MAX_DECODE_LENGTH = 8", "RunConfig.repeats = 1",
      "RunConfig.gamma_max = 2", "RunConfig.tree = @TreeScheme()", "TreeScheme.tree = (2, 1)",
      "RunConfig.tree_candidates = [(2, 1)]", "RunConfig.auto_min_speedup = 0.01"])
  by_gamma = {m["run"].split(",")[1]: m for m in metrics}
  tree = by_gamma["gamma=tree"]
  assert tree["draft_kind"] == "feature" and tree["greedy_match_rate"] == 1.0
  assert tree["tokens_per_target_call"] >= 1.0
  auto = by_gamma["gamma=auto"]
  assert auto["greedy_match_rate"] == 1.0 and auto["gamma_auto"]
  assert "tree(2,1)" in auto["auto_predicted_speedup"]  # the feature tree's loop was timed


@pytest.mark.slow  # ~40 s of CPU on 2 cores: two temperatures, two drafts, 'auto' planned
def test_auto_and_sampling_beside_a_token_draft(tmp_path):
  """Both drafts in one run at T = 0 and 1: the fixed gamma decodes (its loop timed for the
  prediction), 'auto' plans from the feature draft's c and calibration decode (on these random
  tiny models c > 1 and alpha ~0, so it chooses 0 without compiling a loop)."""
  path = _save_feature_draft(tmp_path / "fd" / "export")
  metrics = run.run(["configs/local/smoke.gin"], str(tmp_path / "out"), [
      f"DRAFT_CHECKPOINT = ['{path}', 't5_test_draft']", "GAMMA = [2, 'auto']",
      "TEMPERATURE = [0.0, 1.0]", "NUM_EXAMPLES = 4", "BATCH_SIZE = 2", "MAX_DECODE_LENGTH = 8",
      "RunConfig.repeats = 1", "RunConfig.gamma_max = 3"])
  by_run = {m["run"]: m for m in metrics}
  assert set(by_run) == {f"draft={d},gamma={g},temperature={t}" for g in (2, "auto")
                         for d in ("fd", "t5_test_draft") for t in (0, 1)}
  for m in metrics:
    assert ("draft_kind" in m) == (m["draft"] == "fd")
    if m["gamma_auto"]:
      assert "auto_lone_extend_speedup" in m and m["gamma"] in (0, 1, 2, 3)
      continue
    assert m["tokens_per_target_call"] >= 1.0 and m["speedup_predicted"] is not None
    if m["temperature"] == 0:
      assert m["greedy_match_rate"] == 1.0


def test_api_loads_a_feature_draft_and_decodes_exactly(tmp_path):
  """`specdec_jax.load(target, feature_draft)`: the same draft, pairing check and scheme as the
  run; greedy output equals the target alone, batch 2 with ragged prompts, with the full head,
  with one restricted to its ranking's first 16 ids and with the parallel chain (`parallel=`;
  refused for a token draft)."""
  import specdec_jax as sd  # pylint: disable=import-outside-toplevel
  path = _save_feature_draft(tmp_path / "fd")
  pair = sd.load("t5_test_target", path, vocabulary=False)
  assert pair.decoder(2).scheme == Chain(2) and pair.decoder(2).drafter == FeatureDrafter()
  prompts = [[5, 6, 7, 1], [3, 1]]
  spec = pair.generate(prompts, gamma=2, max_new_tokens=8, batch_size=2)
  assert spec.ids == pair.generate(prompts, gamma=0, max_new_tokens=8, batch_size=2).ids
  assert spec.tokens_per_call >= 1.0
  # a restricted head (the K first ids of the ranking beside it): still exact
  head_ranking.write_ranking(path, list(range(pair.target.vocab_size))[::-1],
                             pair.target.vocab_size, "test")
  small = sd.load("t5_test_target", path, vocabulary=False, head_vocab=16)
  assert len(small.draft.head_ids) == 16 and 1 in small.draft.head_ids  # EOS kept
  assert small.generate(prompts, gamma=2, max_new_tokens=8, batch_size=2).ids == spec.ids
  assert pair.decoder(2, parallel=True).drafter == FeatureDrafter(parallel=True)
  assert pair.decoder(FeatureChain(2, parallel=True)).drafter == FeatureDrafter(parallel=True)
  assert pair.generate(prompts, gamma=2, max_new_tokens=8, batch_size=2,
                       parallel=True).ids == spec.ids
  assert pair.decoder("tree", tree=(2, 1)).drafter == FeatureDrafter()
  assert pair.generate(prompts, gamma="tree", tree=(2, 1), max_new_tokens=8,
                       batch_size=2).ids == spec.ids
  assert pair.decoder("adaptive").drafter == FeatureDrafter()
  assert pair.generate(prompts, gamma="adaptive", max_new_tokens=8, batch_size=2).ids == spec.ids
  with pytest.raises(ValueError, match="not combined"):
    pair.decoder("adaptive", parallel=True)
  with pytest.raises(ValueError, match="parallel"):
    sd.load("t5_test_target", "t5_test_draft", vocabulary=False).decoder(2, parallel=True)


def test_a_mesh_places_the_feature_draft_on_the_draft_axes(tmp_path):
  """The runner's placement (`sharding.place_models`, called by `pipeline.load`): the feature
  draft gets the draft rules (its block split over model_inner only, its fusion replicated),
  not the replicated tables of a model-free draft; a mesh is no longer refused."""
  from specdec_jax import sharding as sh  # pylint: disable=import-outside-toplevel
  path = _save_feature_draft(tmp_path / "fd")
  cfg = rc.RunConfig(draft_checkpoint=path, mesh=sh.MeshConfig(data=2, model_outer=2,
                                                               model_inner=2))
  drafts_lib.check_feature_run(cfg, rc.draft_specs(cfg))
  target, tp = loader.load_model("t5_test_target", seed=0)
  draft, dp = drafts_lib.load_draft(rc.DraftSpec(rc.FEATURE_DRAFT, path), target, tp,
                                    drafts_lib.DraftSettings())
  mesh = sh.make_mesh(cfg.mesh)
  _, _, placed = sh.place_models(mesh, cfg.mesh, target, tp, {"fd": (draft, dp)}, batch_size=4)
  d, params = placed["fd"]
  assert d.axis_rules == cfg.mesh.rules_for("draft")
  wo = params["layer"]["mlp"]["wo"]["kernel"]
  assert wo.sharding.spec[0] == "model_inner" and len(wo.sharding.device_set) == 8
  assert wo.addressable_shards[0].data.shape == (wo.shape[0] // 2, wo.shape[1])
  fuse = params["fuse"]["kernel"]
  assert fuse.addressable_shards[0].data.shape == fuse.shape


@pytest.mark.slow  # ~40 s of CPU on 2 cores: the smoke run twice, on one device and on 8
def test_sharded_run_with_a_feature_draft_equals_the_unsharded_run(tmp_path):
  """`python -m specdec_jax.run` with a feature draft on smoke_sharded.gin's mesh (data 2,
  target over 4 devices, the draft over 2): the same greedy tokens and acceptance as on one
  device, and the greedy output is the target's own."""
  path = _save_feature_draft(tmp_path / "fd" / "export")
  common = [f"DRAFT_CHECKPOINT = '{path}'", "GAMMA = 2", "NUM_EXAMPLES = 4", "BATCH_SIZE = 4",
            "MAX_DECODE_LENGTH = 8", "RunConfig.repeats = 1"]
  (plain,) = run.run(["configs/local/smoke.gin"], str(tmp_path / "plain"), common)
  (sharded,) = run.run(["configs/local/smoke_sharded.gin"], str(tmp_path / "sharded"), common)
  assert sharded["draft_kind"] == "feature" and sharded["greedy_match_rate"] == 1.0
  for key in ("alpha", "acceptance_rate", "tokens_per_target_call", "num_examples"):
    assert sharded[key] == plain[key], key
  read = lambda d: (tmp_path / d / "predictions.jsonl").read_text()  # noqa: E731
  assert read("sharded") == read("plain")


def test_feature_lookup_is_refused_where_it_cannot_run(tmp_path):
  """RunConfig.feature_lookup_gamma: refused by name without a feature or model draft, with
  'auto' unless each candidate has its own calibration decode (its lookup share) and with the
  parallel chain; `chain_options` builds the LookupFeatureDrafter at every program of the run."""
  path = _save_feature_draft(tmp_path / "fd")
  target, tp = loader.load_model("t5_test_target", seed=0)
  draft, _ = drafts_lib.load_draft(rc.DraftSpec(rc.FEATURE_DRAFT, path), target, tp,
                                   drafts_lib.DraftSettings())
  cfg = rc.RunConfig(feature_lookup_gamma=4, feature_lookup_ngram=1, gamma=2)
  scheme, drafter = plan(draft, 2, **drafts_lib.chain_options(cfg))
  assert scheme == Chain(4) and isinstance(drafter, LookupFeatureDrafter)
  assert (drafter.draft_gamma, drafter.lookup_ngram) == (2, 1)
  assert costs.scheme_of(2, draft, **drafts_lib.chain_options(cfg)) == (scheme, drafter)
  token = drafts_lib.load_draft(rc.DraftSpec("prompt_lookup"), target, tp,
                               drafts_lib.DraftSettings())[0]
  assert plan(token, 2, **drafts_lib.chain_options(cfg)) == (Chain(2), None)  # token: off
  lookups = rc.RunConfig(draft="prompt_lookup", feature_lookup_gamma=4, gamma=2)
  with pytest.raises(ValueError, match="has neither"):  # no feature draft, no model draft
    drafts_lib.check_feature_run(lookups, rc.draft_specs(lookups))
  drafts_lib.check_feature_run(cfg, rc.draft_specs(cfg))  # a model draft: its self-draft may
  auto = rc.RunConfig(draft="model", draft_checkpoint=path, feature_lookup_gamma=4,
                      gamma="auto", auto_each_gamma=True)
  drafts_lib.check_feature_run(auto, rc.draft_specs(auto))
  for bad, match in ((dict(gamma="auto"), "auto_each_gamma = True"),
                     (dict(gamma="tree"), "'tree'"),
                     (dict(feature_parallel=True), "feature_parallel")):
    c = rc.RunConfig(draft="model", draft_checkpoint=path, feature_lookup_gamma=4, **bad)
    with pytest.raises(ValueError, match=match):
      drafts_lib.check_feature_run(c, rc.draft_specs(c))


@pytest.mark.slow  # ~40 s of CPU on 2 cores each (compiles: costs, calibration, loops, decodes)
@pytest.mark.parametrize("gamma", ["2", "'auto'"])
def test_run_with_lookup_where_it_matches(tmp_path, gamma):
  """feature_lookup_gamma in a run: the row is the target's own greedy output, says how it was
  decoded, reports the lookup's share of target calls (the smoke task's copies match) and is
  predicted from it; 'auto' chooses the draft's gamma from the same prediction."""
  path = _save_feature_draft(tmp_path / "fd" / "export")
  (m,) = run.run(["configs/local/smoke.gin"], str(tmp_path / "out"), [
      f"DRAFT_CHECKPOINT = '{path}'", f"GAMMA = {gamma}", "RunConfig.auto_each_gamma = True",
      "RunConfig.auto_min_speedup = 0.01", "NUM_EXAMPLES = 4", "BATCH_SIZE = 1",
      "MAX_DECODE_LENGTH = 8", "RunConfig.repeats = 1", "RunConfig.gamma_max = 2",
      "RunConfig.auto_calibration_gamma = 2", "RunConfig.feature_lookup_gamma = 3",
      "RunConfig.feature_lookup_ngram = 1"]
      # 'auto' may not pass lookup_gamma (3): its chain verifies 3 tokens every iteration
      + (["RunConfig.gamma_max = 4"] if gamma == "'auto'" else []))
  assert m["feature_scheme"] == "lookup" and m["greedy_match_rate"] == 1.0
  assert m["lookup"]["gamma"] == 3 and 0.0 <= m["lookup"]["share_of_target_calls"] <= 1.0
  # Predicted from the two kinds of iteration at the calibration decode's lookup share (decoded
  # at the run's batch size), not from one chain's formula.
  assert m["speedup_predicted_from"] == "loop, lookup share" and m["speedup_predicted"] > 0
  assert 0.0 <= m["calibration"]["lookup_share"] <= 1.0
  assert "lookup_share" in m["loop_costs"]
  if gamma == "'auto'":  # the chosen gamma's curve value is the record's prediction
    assert m["gamma_auto"] and 0 < m["gamma"] <= 3
    assert m["auto_predicted_speedup"][str(m["gamma"])] == pytest.approx(m["speedup_predicted"])
