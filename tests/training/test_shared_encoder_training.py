"""Training a shared-encoder draft: the target's encoder frozen, the export records its target,
and a run refuses to pair the export with another target."""
import json

import numpy as np
import pytest

from specdec_jax.checkpoints import load_checkpoint, loader, orbax_io, pairing
from specdec_jax.data.vocabulary import default_vocabulary
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model
from specdec_jax.runner.run_config import DraftSpec
from specdec_jax.runner.drafts import DraftSettings, load_draft
from specdec_jax.training import data as data_lib
from specdec_jax.training import onpolicy, shared_encoder, warm_start
from specdec_jax.training.trainer import TrainConfig, train


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("shared")
  lines = [{"en": f"The dog number {i} ran to house {i % 5}.", "de": f"Der Hund {i} lief."}
           for i in range(40)]
  task = root / "pairs.jsonl"
  task.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
  paths = {}
  one_layer = dict(num_encoder_layers=1, num_decoder_layers=1)
  for name, preset, seed in (("target", "t5_test_target", 1), ("other", "t5_test_target", 5),
                             ("draft", "t5_test_draft", 2), ("shared", "t5_test_shared_draft", 3)):
    cfg = get_preset(preset, vocab_size=8192,
                     **({} if preset == "t5_test_shared_draft" else one_layer))
    paths[name] = str(root / name)
    orbax_io.save(paths[name], cfg, load_checkpoint(preset, config=cfg, seed=seed)[1])
  return root, str(task), paths


def _config(task, paths, out, **kw):
  spec = data_lib.TaskSpec(name=task, input_len=24, target_len=10)
  base = dict(model=paths["shared"], tasks=[spec], max_steps=3, batch_size=8,
              checkpoint_every=3, log_every=1, eval_examples=8, export_dir=str(out / "export"),
              learning_rate=0.05, teacher=paths["target"], divergence="fkl", seed=4,
              init_from=paths["draft"])
  return TrainConfig(**{**base, **kw})


def test_trains_exports_its_target_and_is_refused_by_another(setup, tmp_path):
  _, task, paths = setup
  summary = train(_config(task, paths, tmp_path), str(tmp_path), progress=False)
  assert summary["steps"] == 3 and np.isfinite(summary["final_train_metrics"]["train/loss"])
  assert summary["valid_cross_entropy"]  # the evaluator encodes with the teacher too
  record = pairing.read(str(tmp_path / "export"))
  assert record["target"] == paths["target"] and record == summary["paired_target"]

  target, tparams = loader.load_model(paths["target"])
  spec = DraftSpec("model", str(tmp_path / "export"))
  draft, _ = load_draft(spec, target, tparams, DraftSettings(), target_name=paths["target"])
  assert draft.shares_encoder
  other, oparams = loader.load_model(paths["other"])
  with pytest.raises(ValueError, match="another encoder"):
    load_draft(spec, other, oparams, DraftSettings(), target_name=paths["other"])


def test_shared_draft_without_teacher_or_with_a_narrow_one_is_refused(setup, tmp_path):
  _, task, paths = setup
  with pytest.raises(ValueError, match="name its target as TrainConfig.teacher"):
    train(_config(task, paths, tmp_path, teacher=None, init_from=None), str(tmp_path / "a"),
          progress=False)
  with pytest.raises(ValueError, match="reads encoder states of width 32 but teacher"):
    train(_config(task, paths, tmp_path, teacher=paths["draft"], init_from=None),
          str(tmp_path / "c"), progress=False)
  for sub in "ac":  # refused before anything was written
    assert not (tmp_path / sub).exists()


def test_warm_start_copies_matching_leaves_only():
  params = {"decoder": {"a": np.zeros((2, 3)), "b": np.zeros(4)}, "source_projection": np.ones(2)}
  source = {"decoder": {"a": np.full((2, 3), 7.0), "b": np.full(5, 7.0)}, "encoder": np.ones(3)}
  out, counts = warm_start.warm_start(params, source, "src")
  assert counts == {"copied": 1, "kept": 2}
  np.testing.assert_array_equal(out["decoder"]["a"], 7.0)
  np.testing.assert_array_equal(out["decoder"]["b"], 0.0)
  with pytest.raises(ValueError, match="shares no parameter"):
    warm_start.warm_start(params, {"x": np.ones(1)}, "src")


def test_on_policy_student_samples_on_its_targets_encoding(setup):
  """A shared-encoder student's own greedy continuation, generated in the cached loop with the
  target's encoder, is what the full teacher-forced forward pass on that encoding predicts."""
  _, task, paths = setup
  cfg, params = load_checkpoint(paths["shared"], dtype=np.float32)
  tcfg, tparams = load_checkpoint(paths["target"], dtype=np.float32)
  student, target = Model(cfg), Model(tcfg)
  spec = data_lib.TaskSpec(task, input_len=24, target_len=10)
  _, batch = data_lib.batch_at([data_lib.tokenize_task(spec, default_vocabulary(), True)], 0, 8, 0)
  with pytest.raises(ValueError, match="pass the target"):
    onpolicy.student_batch(student, params, batch, temperature=0.0, seed=0, step=0)
  out = onpolicy.student_batch(student, params, batch, temperature=0.0, seed=0, step=0,
                               teacher=target, teacher_params=tparams)
  enc = batch["encoder_input_tokens"]
  logits = student.forward(params, enc, out["decoder_input_tokens"],
                           encoded=target.encode(tparams, enc))
  w = out["loss_weights"] > 0
  assert w.sum() > 8  # something was generated
  np.testing.assert_array_equal(np.asarray(logits).argmax(-1)[w], out["decoder_target_tokens"][w])
  wrapped, _ = shared_encoder.standalone(student, params, target, tparams)
  assert hash(wrapped) == hash(shared_encoder.WithTargetEncoder(student, target=target))  # jit-static


def test_on_policy_training_of_a_shared_draft(setup, tmp_path):
  _, task, paths = setup
  summary = train(_config(task, paths, tmp_path, max_steps=2, checkpoint_every=2,
                          on_policy_fraction=1.0, on_policy_temperature=1.0, divergence="tvd",
                          eval_examples=0, export_dir=None), str(tmp_path), progress=False)
  assert summary["steps"] == 2 and np.isfinite(summary["final_train_metrics"]["train/tvd"])
  rows = [json.loads(l) for l in (tmp_path / "batches.jsonl").read_text().splitlines()]
  assert [r.get("on_policy") for r in rows] == [True, True]
