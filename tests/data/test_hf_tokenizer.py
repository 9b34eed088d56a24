"""A Hugging Face tokenizer.json as a run's vocabulary (specdec_jax/data/hf_tokenizer.py).

Why: text prompts to a Llama / Qwen2 / Gemma checkpoint must be tokenized as the model was
trained (its own tokenizer, its BOS), and its outputs decoded up to its EOS; the T5
SentencePiece conventions (pad 0, eos 1) are not theirs.
"""
import json
import types

import pytest

tokenizers = pytest.importorskip("tokenizers")

from specdec_jax.data import hf_tokenizer, local_tasks, tasks  # noqa: E402
from specdec_jax.runner import pipeline  # noqa: E402

TEXT = ["def add(a, b):\n    return a + b\n", "hello world, this is a test of tokens"] * 20


def checkpoint(tmp_path, vocab_size=400):
  """A checkpoint directory with a small byte-level BPE tokenizer.json (BOS added, like Llama-3)
  and a config.json naming EOS and the embedding size."""
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<pad>", "<bos>", "<eos>"],
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(TEXT, trainer)
  tok.post_processor = tokenizers.processors.TemplateProcessing(
      single="<bos> $A", special_tokens=[("<bos>", 1)])
  tok.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [2], "vocab_size": vocab_size}))
  return tmp_path


def test_a_checkpoint_directory_is_a_vocabulary(tmp_path):
  vocab = tasks.load_vocabulary(str(checkpoint(tmp_path)), required=True)
  assert isinstance(vocab, hf_tokenizer.HFTokenizerVocabulary)
  assert vocab.eos_id == 2 and vocab.padded_vocab_size == 400 and vocab.vocab_size <= 300
  ids = vocab.encode("def add(a, b):")
  assert ids[0] == 1  # the tokenizer's own BOS
  completion = vocab.encode("    return a + b\n")[1:]
  assert vocab.decode(completion + [2, 5, 6]) == "    return a + b\n"  # exact, up to EOS
  examples = [local_tasks.Example(0, "def add(a, b):", input_field="prompt")]
  assert tasks.tokenize(examples, vocab, model_vocab_size=400, encoder_decoder=False,
                        max_input_length=64) == [ids]  # no EOS on a decoder-only prompt
  assert tasks.vocab_for_decoding(vocab, 400) is vocab


def test_a_prompt_holding_the_pad_id_is_refused(tmp_path):
  vocab = hf_tokenizer.HFTokenizerVocabulary(str(checkpoint(tmp_path)))
  with pytest.raises(ValueError, match="pad id"):
    vocab.encode("x <pad> y")


def test_a_run_reads_the_tokenizer_beside_its_hf_target(tmp_path):
  ckpt = checkpoint(tmp_path)
  cfg = types.SimpleNamespace(vocabulary=None, target_checkpoint=str(ckpt))
  assert pipeline.run_vocabulary(cfg) == str(ckpt / "tokenizer.json")
  assert pipeline.run_vocabulary(types.SimpleNamespace(
      vocabulary="x.model", target_checkpoint=str(ckpt))) == "x.model"
  assert pipeline.run_vocabulary(types.SimpleNamespace(
      vocabulary=None, target_checkpoint="llama_test_target")) is None


def llama_like_checkpoint(tmp_path, config=None):
  """Like `checkpoint`, but id 0 is a real token ('!', as in Llama-3) and a reserved padding
  token is among the added special tokens (Llama-3.1's)."""
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(TEXT, trainer)
  tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>"])
  tok.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "config.json").write_text(json.dumps(config or {"vocab_size": 400}))
  return tmp_path, tok


def test_a_reserved_padding_token_is_the_pad_and_id_0_is_text(tmp_path):
  ckpt, tok = llama_like_checkpoint(tmp_path)
  assert tok.id_to_token(0) == "!"
  vocab = hf_tokenizer.HFTokenizerVocabulary(str(ckpt))
  assert vocab.pad_id == tok.token_to_id("<|finetune_right_pad_id|>") != 0
  ids = vocab.encode("hello world!")
  assert 0 in ids and vocab.decode(ids) == "hello world!"  # not refused, not cut


def test_pad_choice_order():
  from specdec_jax.checkpoints import hf_decoder
  specials = {"<|finetune_right_pad_id|>": 7, "<pad>": 9, "<|endoftext|>": 11}
  assert hf_decoder.choose_pad_id({"pad_token_id": 3}, specials, "<|endoftext|>") == 3
  assert hf_decoder.choose_pad_id({"pad_token_id": None}, specials, "<|endoftext|>") == 11
  assert hf_decoder.choose_pad_id({}, specials) == 7
  assert hf_decoder.choose_pad_id({}, {"<pad>": 9}) == 9
  assert hf_decoder.choose_pad_id({}, {}) == 0


def test_a_converted_llama_pads_with_what_its_tokenizer_reads(tmp_path):
  """The converter and the tokenizer make the same choice (one rule), so a run's padded prompts
  are read back whole by the model."""
  from specdec_jax.checkpoints import hf
  config = {"model_type": "llama", "vocab_size": 400, "hidden_size": 16,
            "num_attention_heads": 2, "intermediate_size": 32, "num_hidden_layers": 1,
            "eos_token_id": 2}
  ckpt, tok = llama_like_checkpoint(tmp_path, config)
  pad = tok.token_to_id("<|finetune_right_pad_id|>")
  assert hf.read_config(str(ckpt)).pad_id == pad
  assert hf_tokenizer.HFTokenizerVocabulary(str(ckpt)).pad_id == pad
  assert hf.config_from_hf(config).pad_id == 0  # config.json alone declares none
