"""The DistillSpec recipes under configs/local/train/ load into the configs they promise.

Why: a recipe that only breaks when its multi-hour run starts is found too late; and a
sequence-level recipe must name exactly the directories its generation recipe writes.
"""
import os

import gin
import pytest

from specdec_jax import distill_data as distill_data_cli, train
from specdec_jax.training import distill_data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = "specdec_jax/assets/zoo/t5_target"
SEQKD = {f"t5_draft_small_seqkd_{d}.gin": d for d in ("fkl", "rkl", "jsd", "tvd")}
GENERATE = {"t5_target_greedy.gin": (0.0, None, 0.0), "t5_target_t1.gin": (1.0, None, 0.0),
            "t5_mix_target_draft.gin": (1.0, "specdec_jax/assets/zoo/t5_draft_small_distill",
                                        0.5)}


@pytest.fixture(autouse=True)
def _clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _train(name):
  return train.parse([os.path.join(ROOT, "configs/local/train", name)])


@pytest.mark.parametrize("name", sorted(SEQKD))
def test_seqkd_recipes_distil_on_the_targets_greedy_sequences(name):
  cfg = _train(name)
  assert (cfg.model, cfg.teacher, cfg.divergence) == ("zoo_t5_draft_small", TARGET, SEQKD[name])
  assert (cfg.distill_weight, cfg.on_policy_fraction, cfg.jsd_beta) == (1.0, 0.0, 0.5)
  assert [t.name for t in cfg.tasks] == ["runs/seqkd/t5_target_greedy/translate_en_de",
                                         "runs/seqkd/t5_target_greedy/summarize"]
  assert [t.weight for t in cfg.tasks] == [4, 1]  # the zoo's mixture
  assert cfg.export_dir == "export"  # OUTPUT_DIR/export
  assert cfg.max_steps > 600 and cfg.checkpoint_every <= 100


def test_on_policy_recipes():
  cfg = _train("t5_draft_small_onpolicy_tvd.gin")
  assert (cfg.divergence, cfg.on_policy_fraction, cfg.on_policy_temperature) == ("tvd", 1.0, 1.0)
  assert cfg.teacher == TARGET and cfg.model.endswith("t5_draft_small_distill")
  assert [t.name for t in cfg.tasks] == ["translate_en_de", "summarize"]
  cfg = _train("t5_draft_small_mixed_jsd.gin")
  assert (cfg.divergence, cfg.jsd_beta, cfg.on_policy_fraction) == ("jsd", 0.5, 0.5)
  assert cfg.tasks[0].name.startswith("runs/seqkd/t5_target_greedy/")


@pytest.mark.parametrize("name", sorted(GENERATE))
def test_generation_recipes(name):
  cfg = distill_data_cli.parse([os.path.join(ROOT, "configs/local/train/generate", name)])
  assert isinstance(cfg, distill_data.DistillDataConfig)
  assert (cfg.temperature, cfg.mix_model, cfg.mix_fraction) == GENERATE[name]
  assert cfg.model == TARGET
  assert [(t.name, t.input_len, t.target_len) for t in cfg.tasks] == [
      ("translate_en_de", 40, 40), ("summarize", 128, 24)]  # the mixture's shapes


def test_seqkd_tasks_are_the_directories_the_generation_recipe_writes():
  gen = distill_data_cli.parse(
      [os.path.join(ROOT, "configs/local/train/generate/t5_target_greedy.gin")])
  written = [os.path.join("runs/seqkd/t5_target_greedy", distill_data.task_dir_name(t))
             for t in gen.tasks]  # its documented --output_dir
  gin.clear_config()
  cfg = _train("t5_draft_small_seqkd_fkl.gin")
  assert [t.name for t in cfg.tasks] == written
  assert [(t.input_len, t.target_len) for t in cfg.tasks] == [
      (t.input_len, t.target_len) for t in gen.tasks]
  with open(os.path.join(ROOT, "configs/local/train/generate/t5_target_greedy.gin")) as f:
    assert "--output_dir=runs/seqkd/t5_target_greedy" in f.read()


def test_shared_encoder_recipe_reads_the_targets_encoder():
  cfg = _train("t5_shared_draft_seqkd_fkl.gin")
  assert (cfg.model, cfg.teacher, cfg.divergence) == ("zoo_t5_shared_draft", TARGET, "fkl")
  assert cfg.init_from == "specdec_jax/assets/zoo/t5_draft_base"
  assert [t.name for t in cfg.tasks] == ["runs/seqkd/t5_target_greedy/translate_en_de",
                                         "summarize"]
  from specdec_jax.models.model_config import get_preset  # pylint: disable=import-outside-toplevel
  assert get_preset(cfg.model).source_dim == distill_data.peek_config(TARGET).emb_dim
  assert cfg.export_dir == "export"
  # The shipped weights' schedule: constant to step 5,240, then a 5,000-step cool-down.
  assert (cfg.schedule, cfg.max_steps - cfg.decay_steps, cfg.max_steps) == ("wsd", 5240, 10240)


def test_shared_encoder_continuation_recipe_weights_en_de():
  """The second stage starts from the first stage's float32 export (not its bfloat16 one) with
  en-de weighted 9 : 1, and cools down to 0 at its own max_steps."""
  first = _train("t5_shared_draft_seqkd_fkl.gin")
  gin.clear_config()
  cfg = _train("t5_shared_draft_ende_continue.gin")
  assert cfg.init_from == "runs/train/t5_shared_draft_seqkd_fkl/export_f32"
  assert (cfg.model, cfg.teacher, cfg.divergence) == (first.model, first.teacher, "fkl")
  assert [t.name for t in cfg.tasks] == [t.name for t in first.tasks]
  assert [t.weight for t in cfg.tasks] == [9, 1] and [t.weight for t in first.tasks] == [4, 1]
  assert cfg.schedule == "wsd" and cfg.warmup_steps > 0
  assert 0 < cfg.decay_steps < cfg.max_steps - cfg.warmup_steps
  assert cfg.export_dir == "export"
  with open(os.path.join(ROOT, "configs/local/train/t5_shared_draft_ende_continue.gin")) as f:
    text = f.read()  # the documented command writes the export the second stage reads
  assert "--gin.TrainConfig.export_dtype=None" in text and "export_f32" in text


def test_shared_encoder_on_policy_recipe_fine_tunes_the_shipped_draft():
  cfg = _train("t5_shared_draft_onpolicy_fkl.gin")
  assert cfg.model == "specdec_jax/assets/zoo/t5_shared_draft" and cfg.init_from is None
  assert (cfg.teacher, cfg.divergence) == (TARGET, "fkl")
  assert (cfg.on_policy_fraction, cfg.on_policy_temperature) == (0.5, 0.0)
  assert cfg.tasks[0].name == "runs/seqkd/t5_target_greedy/translate_en_de"  # the other half
  assert cfg.export_dir == "export"


def test_code_recipes_generate_and_distil_decoder_only():
  """The code pair's sequence-level recipe: generation with the LM target into the directory the
  draft's recipe trains on, prompts narrower than the sequences (room for a continuation)."""
  gen = distill_data_cli.parse(
      [os.path.join(ROOT, "configs/local/train/generate/lm_target_greedy.gin")])
  assert gen.model == "specdec_jax/assets/zoo/lm_target" and gen.temperature == 0.0
  assert distill_data.peek_config(gen.model).kind == "decoder"
  (spec,) = gen.tasks
  assert (spec.name, spec.input_len, spec.target_len) == ("code_complete", 128, 192)
  written = os.path.join("runs/seqkd/lm_target_greedy", distill_data.task_dir_name(spec))
  gin.clear_config()
  cfg = _train("lm_draft_seqkd_fkl.gin")
  assert (cfg.model, cfg.teacher, cfg.divergence) == (
      "zoo_lm_draft", "specdec_jax/assets/zoo/lm_target", "fkl")
  assert [(t.name, t.input_len, t.target_len) for t in cfg.tasks] == [(written, 0, 192)]
  assert cfg.init_from == "specdec_jax/assets/zoo/lm_draft"
