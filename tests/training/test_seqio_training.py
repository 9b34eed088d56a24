"""Training reads seqio tasks: the ids seqio produces are the ids the model is trained on.

Why: the paper's drafts and target are fine-tuned on the seqio tasks wmt_t2t_ende_v003 and
cnn_dailymail and then decode prompts tokenized by those tasks; a trainer that tokenized them any
other way (another vocabulary, EOS handling, truncation) would train a model on ids it never sees
at decode time. The local seqio task 'specdec_translate_en_de' needs no download, so it stands in
for the paper tasks here. Slow: importing TensorFlow (through seqio) alone takes ~20 s.
"""
import json

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from specdec_jax.checkpoints import load_checkpoint, orbax_io
from specdec_jax.models.model_config import get_preset
from specdec_jax.training import data as data_lib
from specdec_jax.training.trainer import TrainConfig, train

pytestmark = pytest.mark.slow
TASK = "specdec_translate_en_de"


@pytest.fixture(scope="module")
def seqio():
  return pytest.importorskip("seqio")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
  """A tiny T5 whose 8192 rows cover the local vocabulary (8,100 ids with the extra ids)."""
  path = str(tmp_path_factory.mktemp("seqio_train") / "init")
  cfg = get_preset("t5_test_draft", vocab_size=8192)
  orbax_io.save(path, cfg, load_checkpoint("t5_test_draft", config=cfg, seed=2)[1])
  return path


def test_batches_hold_the_task_tokenization(seqio):
  spec = data_lib.TaskSpec(TASK, input_len=24, target_len=16, max_examples=48)
  assert data_lib.is_seqio_task(TASK) and not data_lib.is_seqio_task("translate_en_de")
  task = data_lib.tokenize_task(spec, None, encoder_decoder=True, split="train")
  assert task.size == 48  # max_examples caps what is read
  # seqio's own pipeline at the same lengths: tokenize, then trim to length - 1 and append EOS.
  ds = seqio.get_mixture_or_task(TASK).get_dataset(
      {"inputs": 24, "targets": 16}, split="train", shuffle=False, use_cached=False, seed=0)
  for row, ex in zip(range(task.size), ds.as_numpy_iterator()):
    for ids, expected in ((task.inputs_NxP[row], ex["inputs"]),
                          (task.targets_NxL[row], ex["targets"])):
      np.testing.assert_array_equal(ids[:len(expected)], expected)
      assert not ids[len(expected):].any()  # right-padded with 0
  # A training batch is made of those rows (T5: targets shifted right behind BOS 0).
  _, batch = data_lib.batch_at([task], 0, 8, seed=0)
  rows = {r.tobytes() for r in task.inputs_NxP}
  assert all(r.tobytes() in rows for r in batch["encoder_input_tokens"])
  vocab = data_lib.task_vocabulary(spec, None)
  assert vocab.vocab_size == 8100
  first = [i for i in batch["decoder_target_tokens"][0] if i]
  assert vocab.decode(first[:-1]) and first[-1] == 1  # text, then EOS


def test_training_on_a_seqio_task_lowers_the_loss(seqio, tiny_model, tmp_path):
  spec = data_lib.TaskSpec(TASK, input_len=24, target_len=16, max_examples=64)
  cfg = TrainConfig(model=tiny_model, tasks=[spec], max_steps=6, batch_size=8, log_every=1,
                    checkpoint_every=6, eval_examples=8, export_dir=None, learning_rate=0.05)
  summary = train(cfg, str(tmp_path / "run"), progress=False)
  acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
  acc.Reload()
  losses = [e.value for e in acc.Scalars("train/loss")]
  assert len(losses) == 6 and np.all(np.isfinite(losses))
  assert losses[-1] < losses[0]  # 6 Adafactor steps at lr 0.05 on repeating batches
  assert np.isfinite(summary["valid_cross_entropy"][TASK])  # the validation split via seqio
  log = (tmp_path / "run" / "batches.jsonl").read_text().splitlines()
  assert [json.loads(line)["task"] for line in log] == [TASK] * 6


def test_model_vocab_must_cover_the_task_vocabulary(seqio, tmp_path):
  cfg = TrainConfig(model="t5_test_draft", tasks=[data_lib.TaskSpec(TASK)], max_steps=1)
  with pytest.raises(ValueError, match="vocab_size 64, smaller than the vocabulary's 8100 ids"):
    train(cfg, str(tmp_path / "small_vocab"), progress=False)
