"""Training and distillation prompts through a Hugging Face tokenizer's chat template.

Why: the SmolLM2 drafts are distilled on the target's replies to chat-templated prompts, and a
draft trained on prompts of another shape, or on sequences ending with the SentencePiece EOS id
(1, SmolLM2's '<|im_start|>'), learns the wrong context. The tiny GGUF's converted tokenizer
stands in for SmolLM2's (tests/checkpoints/gguf_testutil.py)."""
import dataclasses

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from specdec_jax.convert import convert  # noqa: E402
from specdec_jax.data import hf_tokenizer, tasks  # noqa: E402
from specdec_jax.training import data as data_lib  # noqa: E402
from tests.checkpoints import gguf_testutil as gt  # noqa: E402


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  root = tmp_path_factory.mktemp("tok")
  gt.write(str(root / "tiny.gguf"))
  out = convert("gguf", str(root / "tiny.gguf"), str(root / "ckpt"))
  assert isinstance(tasks.load_vocabulary(out, required=True), hf_tokenizer.HFTokenizerVocabulary)
  return hf_tokenizer.HFTokenizerVocabulary(out)


def test_decoder_prompts_end_with_the_assistant_turn(vocab):
  spec = data_lib.TaskSpec("summarize", input_len=40, target_len=64, max_examples=3,
                           prompt_format="chat")
  task = data_lib.decoder_prompts(spec, vocab, "train")
  tail = vocab.encode("<|im_end|>\n<|im_start|>assistant\n")
  for row in task.inputs_NxP:
    ids = [int(t) for t in row if t != vocab.pad_id]
    assert ids[-len(tail):] == tail  # the reply is what gets generated; the prompt keeps its end
  plain = data_lib.decoder_prompts(data_lib.TaskSpec("summarize", input_len=40, target_len=64,
                                                     max_examples=3), vocab, "train")
  assert (plain.inputs_NxP != task.inputs_NxP).any()


def test_reference_sequences_end_with_the_vocabularys_eos(vocab):
  spec = data_lib.TaskSpec("summarize", input_len=0, target_len=2048, max_examples=2,
                           prompt_format="chat")
  task = data_lib.tokenize_task(spec, vocab, False, "train")
  for row in task.targets_NxL:
    ids = [int(t) for t in row if t != 0]
    assert ids[-1] == vocab.eos_id == 2


def test_a_continuation_loss_weighs_the_reply_only(vocab):
  """loss_on='continuation' (SpecForge's assistant-turn mask): the templated prompt feeds the
  model and gets no loss; every reply token and its EOS do."""
  spec = data_lib.TaskSpec("summarize", input_len=0, target_len=2048, max_examples=2,
                           prompt_format="chat")
  task = data_lib.tokenize_task(dataclasses.replace(spec, loss_on="continuation"), vocab, False,
                                "train")
  tail = vocab.encode("<|im_start|>assistant\n")
  weights = data_lib.batch_of(task, np.arange(2))["loss_weights"]
  for row, w, p in zip(task.targets_NxL, weights, task.prompt_lengths_N):
    ids = [int(t) for t in row if t != 0]
    assert ids[p - len(tail):p] == tail  # the prompt ends with the assistant turn's header
    assert not w[:p - 1].any() and w[p - 1:len(ids) - 1].all() and not w[len(ids) - 1:].any()
  every = data_lib.batch_of(data_lib.tokenize_task(spec, vocab, False, "train"), np.arange(2))
  assert every["loss_weights"].sum() > weights.sum() > 0
  with pytest.raises(ValueError, match="loss_on must be one of"):
    data_lib.TaskSpec("summarize", loss_on="reply")
  # The head ranking counts what the loss is on: the replies' ids only.
  (_, _, freqs), = data_lib.target_frequencies([task], vocab.vocab_size)
  replies = np.concatenate([row[p:][row[p:] != 0] for row, p in
                            zip(task.targets_NxL, task.prompt_lengths_N)])
  np.testing.assert_allclose(freqs, np.bincount(replies, minlength=vocab.vocab_size)[
      :vocab.vocab_size] / len(replies))
