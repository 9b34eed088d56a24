"""Every config under configs/ parses, binds every required macro and yields a valid RunConfig.

Why: a config that only breaks when someone runs it is found late (levanter tests every config
file). Macros left as %gin.REQUIRED are bound to a placeholder, as a user would on the command line.
Three kinds of file live under configs/:
- entry files (a "Required / commonly overridden" header): parsed alone into a RunConfig;
- fragments (draft swaps, mesh settings): parsed after an entry file that they are meant to follow,
  and each fragment must be applied somewhere (so none rots unparsed);
- training configs (configs/**/train/): parsed as specdec_jax.train parses them.
"""
import glob
import os

import gin
import pytest

from specdec_jax import configurables, gin_utils, run
from specdec_jax.runner.run_config import RunConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.gin"), recursive=True))
REQUIRED_MACROS = ("TARGET_CHECKPOINT", "DRAFT_CHECKPOINT", "DRAFT", "TASK", "NUM_EXAMPLES",
                   "BATCH_SIZE", "GAMMA", "TEMPERATURE", "TOP_K", "TOP_P", "SEED", "MODE",
                   "MAX_DECODE_LENGTH")
PLACEHOLDERS = {"TARGET_CHECKPOINT": "'t5_test_target'", "DRAFT_CHECKPOINT": "'t5_test_draft'",
                "TASK": "'translate_en_de'"}


pytestmark = pytest.mark.usefixtures("clean_gin")


def _required_bindings(path):
  """Placeholder bindings for macros the file leaves as %gin.REQUIRED."""
  configurables.register()
  gin.clear_config()
  gin_utils.add_search_paths()
  gin.parse_config_file(path)
  out = []
  for name in REQUIRED_MACROS:
    if gin_utils.macro_defined(name) and repr(gin.query_parameter(f"%{name}")) == "%gin.REQUIRED":
      out.append(f"{name} = {PLACEHOLDERS.get(name, '1')}")
  gin.clear_config()
  return out


def test_there_are_configs():
  names = {os.path.relpath(c, ROOT) for c in CONFIGS}
  for must in ("smoke", "ende", "summarize", "code", "default"):
    assert f"configs/local/{must}.gin" in names


HEADER = "Required / commonly overridden"
# Fragment directory -> the entry file a fragment there is applied after.
FRAGMENT_BASES = {
    "configs/local/drafts": "configs/local/ende.gin",
    "configs/paper/drafts": "configs/paper/ende.gin",
    "configs/paper": "configs/paper/table2/ende_t5_small_t0.gin",  # mesh_*.gin
    "configs/paper/chen": "configs/paper/chen/xsum_greedy.gin",  # base, xsum, mesh_*.gin
}


def _rel(path):
  return os.path.relpath(path, ROOT)


def _kind(path):
  rel = _rel(path)
  if "/train/" in rel:
    return "train"
  with open(path) as f:
    return "entry" if HEADER in f.read() else "fragment"


ENTRIES = [c for c in CONFIGS if _kind(c) == "entry"]
FRAGMENTS = [c for c in CONFIGS if _kind(c) == "fragment"]
TRAIN = [c for c in CONFIGS if _kind(c) == "train"]


@pytest.mark.parametrize("path", ENTRIES, ids=_rel)
def test_entry_config_parses(path):
  cfg = run.parse([path], _required_bindings(path))
  assert isinstance(cfg, RunConfig)
  for name in REQUIRED_MACROS:
    assert gin_utils.macro_defined(name), f"{path} does not declare {name}"


@pytest.mark.parametrize("path", FRAGMENTS, ids=_rel)
def test_fragment_parses_after_its_entry_file(path):
  base = FRAGMENT_BASES.get(os.path.dirname(_rel(path)))
  assert base is not None, f"{_rel(path)}: fragment in a directory without a base entry file"
  base = os.path.join(ROOT, base)
  cfg = run.parse([base, path], _required_bindings(base))
  assert isinstance(cfg, RunConfig)


@pytest.mark.parametrize("path", TRAIN, ids=_rel)
def test_train_config_parses(path):
  configurables.register()  # TrainConfig, TaskSpec, MeshConfig, DistillDataConfig (generate/)
  with open(path) as f:
    complete = "TrainConfig.model" in f.read()  # else an included fragment (the data mixture)
  gin_utils.parse_gin_flags([path], finalize=False)
  if complete:
    assert gin.get_configurable("TrainConfig")() is not None
  with open(path) as f:
    if "FeatureTrainConfig.target" in f.read():  # a feature-level draft's recipe
      assert configurables.is_feature_training_job()
      assert configurables.feature_train_config().max_steps > 0


def test_draft_swap_is_one_include_or_binding():
  base = os.path.join(ROOT, "configs/local/ende.gin")
  large = os.path.join(ROOT, "configs/local/drafts/large.gin")
  assert run.parse([base, large]).draft_checkpoint.endswith("t5_draft_large")
  cfg = run.parse([base], ["DRAFT_CHECKPOINT = 't5_test_draft'"])
  assert cfg.draft_checkpoint == "t5_test_draft"
  paper = os.path.join(ROOT, "configs/paper/table2/cnndm_t5_large_t1.gin")
  cfg = run.parse([paper])
  assert (cfg.gamma, cfg.temperature, cfg.task) == (3, 1.0, "cnn_dailymail")
  assert "t5_1_1_large" in cfg.draft_checkpoint and "t5_1_1_xxl" in cfg.target_checkpoint


def test_paper_table2_has_the_twelve_rows():
  rows = sorted(glob.glob(os.path.join(ROOT, "configs/paper/table2/*.gin")))
  assert len(rows) == 12
  gammas = {}
  for path in rows:
    cfg = run.parse([path])
    gammas[(cfg.task, os.path.basename(cfg.draft_checkpoint.rstrip("/").split("/")[-2]),
            cfg.temperature)] = cfg.gamma
    assert cfg.batch_size == 1 and cfg.mode == "benchmark"
  assert gammas[("wmt_t2t_ende_v003", "t5_1_1_base", 1.0)] == 5
  assert gammas[("cnn_dailymail", "t5_1_1_small", 0.0)] == 5
  assert sorted(gammas.values()) == sorted([7, 7, 7, 7, 5, 3, 5, 5, 3, 5, 3, 3])


@pytest.mark.parametrize("mesh", sorted(glob.glob(os.path.join(ROOT, "gin", "mesh", "tpu_*.gin"))),
                         ids=_rel)
def test_paper_row_composes_with_a_tpu_mesh(mesh):
  row = os.path.join(ROOT, "configs/paper/table2/ende_t5_small_t0.gin")
  cfg = run.parse([row, mesh])
  assert cfg.mesh is not None and cfg.batch_size == 1 and cfg.gamma == 7


def test_chen_configs_are_the_papers_settings():
  """Chen et al. Table 1: a 70B target with a small draft of its family, batch 1, K 3 on XSum
  (greedy and top-p 0.8) and 4 on HumanEval; the v4-32 mesh keeps the target on 8 chips (its 8
  key/value heads) and puts two rows side by side."""
  chen = os.path.join(ROOT, "configs/paper/chen")
  rows = {name: run.parse([os.path.join(chen, name + ".gin")])
          for name in ("xsum_greedy", "xsum_nucleus", "humaneval")}
  assert {(n, c.task, c.gamma, c.temperature, c.top_p) for n, c in rows.items()} == {
      ("xsum_greedy", "xsum", 3, 0.0, 1.0), ("xsum_nucleus", "xsum", 3, 1.0, 0.8),
      ("humaneval", "humaneval", 4, 1.0, 0.8)}
  for c in rows.values():
    assert (c.target_checkpoint, c.draft_checkpoint, c.batch_size) == (
        "llama3_1_70b", "llama3_2_1b", 1)
  v4_32 = run.parse([os.path.join(chen, "humaneval.gin"), os.path.join(chen, "mesh_tpu_v4_32.gin")])
  assert (v4_32.mesh.data, v4_32.mesh.model_outer, v4_32.mesh.model_inner) == (2, 4, 2)
  assert v4_32.batch_size == 2
  tp16 = run.parse([os.path.join(chen, "humaneval.gin"),
                    os.path.join(chen, "mesh_tpu_v4_32_tp16.gin")])
  assert (tp16.mesh.data, tp16.mesh.model_outer, tp16.mesh.model_inner, tp16.batch_size) == (
      1, 8, 2, 1)
