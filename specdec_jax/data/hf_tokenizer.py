"""A Hugging Face checkpoint's tokenizer (tokenizer.json, the `tokenizers` library) as a run's
vocabulary, for text prompts to Llama / Qwen2 / Gemma checkpoints.

Why not SentencePieceVocabulary: that class holds T5's conventions (pad 0, eos 1, sentinels),
which the modern families do not share; their checkpoints ship a `tokenizer.json` that the
`tokenizers` library (a dependency of transformers, the `hf` extra) reads without torch. This
class gives it the interface the data door and the runner use (`encode`, `encode_batch`,
`decode`, `vocab_size`, `padded_vocab_size`, `eos_id`, `pad_id`):
- `encode` adds the tokenizer's own special tokens (Llama-3's and Gemma's BOS; Qwen2 has none),
  as transformers does by default: the model was trained with them; no EOS (a decoder-only
  prompt continues);
- `decode` stops at the first EOS (the checkpoint's `eos_token_id` from config.json beside the
  tokenizer) and drops special tokens, so a completion decodes to the text the model wrote;
- `padded_vocab_size` is the checkpoint's embedding size (config.json `vocab_size`: Qwen2.5
  pads 151,665 ids to 151,936), so its outputs decode with this vocabulary.
- `pad_id` is the id the checkpoint's prompts are right-padded with, chosen by the rule the
  converter uses (`checkpoints.hf_decoder.choose_pad_id`: config.json's pad_token_id, the
  tokenizer's pad token, a reserved padding token such as Llama-3.1's
  '<|finetune_right_pad_id|>'), so a prompt holding id 0 (Llama-3's '!') decodes whole; only
  where the checkpoint offers none does the pad stay 0, and a prompt that tokenizes to it is
  refused by name rather than silently cut there.
Chat templates are not applied.
"""
from __future__ import annotations

import json
import os

from specdec_jax.checkpoints import hf_decoder

FILE = "tokenizer.json"


def is_tokenizer(path: str | None) -> bool:
  """Whether `path` is a tokenizer.json or a directory holding one."""
  return bool(path) and (os.path.basename(str(path)) == FILE
                         or os.path.isfile(os.path.join(str(path), FILE)))


def beside(checkpoint_dir: str | None) -> str | None:
  """The tokenizer.json of a local checkpoint directory, or None (no directory, no file)."""
  if checkpoint_dir and os.path.isdir(checkpoint_dir):
    path = os.path.join(checkpoint_dir, FILE)
    return path if os.path.isfile(path) else None
  return None


def _token_config(directory: str) -> dict:
  """tokenizer_config.json beside the tokenizer, with token entries given by content; {} if none."""
  path = os.path.join(directory, "tokenizer_config.json")
  if not os.path.isfile(path):
    return {}
  with open(path, encoding="utf-8") as f:
    raw = json.load(f)
  return {k: (v.get("content") if isinstance(v, dict) and "content" in v else v)
          for k, v in raw.items()}


def _checkpoint_config(directory: str) -> dict:
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return json.load(f)


class HFTokenizerVocabulary:
  """tokenizer.json with the data door's vocabulary interface (module docstring)."""

  def __init__(self, path: str, eos_id: int | None = None, model_vocab_size: int | None = None):
    try:
      import tokenizers  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise ModuleNotFoundError(
          "a tokenizer.json vocabulary needs the `tokenizers` package: pip install "
          "'specdec_jax[hf]' (or pip install tokenizers)") from e
    path = str(path)
    file = path if os.path.basename(path) == FILE else os.path.join(path, FILE)
    if not os.path.isfile(file):
      raise FileNotFoundError(f"no {FILE} at {path}")
    self.path = file
    self._tok = tokenizers.Tokenizer.from_file(file)
    config = _checkpoint_config(os.path.dirname(file))
    specials = {t.content: int(i) for i, t in self._tok.get_added_tokens_decoder().items()}
    token_config = _token_config(os.path.dirname(file))
    eos = config.get("eos_token_id") if eos_id is None else eos_id
    if eos is None:  # no config.json beside it (a converted GGUF): the tokenizer's EOS by name
      eos = specials.get(token_config.get("eos_token"))
    self.eos_id = eos[0] if isinstance(eos, list) else eos
    self.chat_template = token_config.get("chat_template")
    self.pad_id = hf_decoder.choose_pad_id(config, specials, token_config.get("pad_token"))
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    self.padded_vocab_size = max(int(model_vocab_size or config.get("vocab_size") or 0),
                                 self.vocab_size)

  def __repr__(self):
    return f"HFTokenizerVocabulary({self.path!r}) [vocab_size={self.vocab_size}]"

  def _checked(self, ids: list[int], text: str) -> list[int]:
    if self.pad_id in ids:
      raise ValueError(
          f"the prompt {text[:40]!r}... tokenizes to id {self.pad_id} "
          f"({self._tok.id_to_token(self.pad_id)!r}), the pad id: prompts are right-padded "
          f"with it, so it would end the prompt there; this checkpoint declares no pad token "
          "(config.json pad_token_id, tokenizer_config.json pad_token, or a reserved one such "
          "as '<|finetune_right_pad_id|>'): add one, give this prompt as `input_ids` without "
          "it, or rephrase it")
    return ids

  def encode(self, text: str) -> list[int]:
    """Ids of `text` with the tokenizer's special tokens (BOS where the family has one)."""
    return self._checked(self._tok.encode(text).ids, text)

  def encode_batch(self, texts) -> list[list[int]]:
    return [self._checked(e.ids, t) for e, t in zip(self._tok.encode_batch(list(texts)), texts)]

  def decode(self, ids) -> str:
    """Text of `ids` up to the first EOS, special tokens dropped."""
    ids = [int(i) for i in ids]
    if self.eos_id is not None and self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    return self._tok.decode([i for i in ids if 0 <= i < self.vocab_size],
                            skip_special_tokens=True)
