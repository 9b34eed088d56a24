"""Hugging Face T5 v1.1 checkpoints <-> the T5X parameter tree (Llama, Qwen2 and Gemma
checkpoints: `hf_decoder`, dispatched to by `model_type` from `config_from_hf` and `load`).

HF stores `nn.Linear` weights (out, in), so every kernel is transposed; the relative-position
table exists only in block 0 of each stack, stored (buckets, heads); the v1.1 head is a separate
`lm_head.weight` (V, E). Reading needs no torch for safetensors (`safetensors_io`), and only
`pytorch_model.bin` files pull torch in. `to_hf` is the reverse, used to build HF reference models
from our weights (including T5X ones) for parity tests against `model.generate`.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from specdec_jax import paths
from specdec_jax.checkpoints import hf_decoder, safetensors_io, storage
from specdec_jax.checkpoints.tree import CheckpointError, expected_shapes, flatten, to_layout
from specdec_jax.models.model_config import ModelConfig

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
# Tied aliases of `shared.weight`; files may or may not contain them.
_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
_ATTN = {"query": "q", "key": "k", "value": "v", "out": "o"}


def tokenizer_specials(path: str) -> tuple[dict[str, int], str | None]:
  """(the added tokens of `tokenizer.json`, content -> id; tokenizer_config.json's `pad_token`)
  of an HF checkpoint directory; ({}, None) where the files are absent."""
  specials, pad = {}, None
  tok_file = os.path.join(path, "tokenizer.json")
  if os.path.isfile(tok_file):
    added = storage.read_json(tok_file, "HF tokenizer").get("added_tokens") or []
    specials = {t["content"]: int(t["id"]) for t in added if "content" in t and "id" in t}
  cfg_file = os.path.join(path, "tokenizer_config.json")
  if os.path.isfile(cfg_file):
    pad = storage.read_json(cfg_file, "HF tokenizer config").get("pad_token")
    pad = pad.get("content") if isinstance(pad, dict) else pad
  return specials, pad


def read_config(path: str, **overrides: Any) -> ModelConfig:
  """An HF checkpoint directory's ModelConfig: config.json, and for the decoder families the pad
  id chosen with the tokenizer files beside it (`hf_decoder.choose_pad_id`)."""
  hf = storage.read_json(os.path.join(path, CONFIG_FILE), "HF config")
  if hf.get("model_type") in hf_decoder.MODEL_TYPES and "pad_id" not in overrides:
    overrides["pad_id"] = hf_decoder.choose_pad_id(hf, *tokenizer_specials(path))
  return config_from_hf(hf, **overrides)


def is_hf(path: str) -> bool:
  return (os.path.isdir(path) and os.path.isfile(os.path.join(path, CONFIG_FILE))
          and any(os.path.isfile(os.path.join(path, f)) for f in WEIGHT_FILES))


def config_from_hf(hf: Mapping[str, Any], **overrides: Any) -> ModelConfig:
  """Maps an HF T5Config dict to ModelConfig; rejects what the T5 v1.1 network cannot run.
  Llama, Qwen2 and Gemma configs go to `hf_decoder.config_from_hf`."""
  model_type = hf.get("model_type", "t5")
  if model_type in hf_decoder.MODEL_TYPES:
    return hf_decoder.config_from_hf(hf, **overrides)
  if model_type not in ("t5", "mt5", "umt5"):
    raise CheckpointError(f"HF model_type {model_type!r} is not T5, nor one of the decoder "
                          f"families {list(hf_decoder.MODEL_TYPES)}")
  if model_type == "umt5":
    raise CheckpointError("umT5 has per-layer relative position tables; not a T5 v1.1 layout")
  proj = hf.get("feed_forward_proj", "relu")
  if proj != "gated-gelu":
    raise CheckpointError(f"HF feed_forward_proj={proj!r}: only T5 v1.1's 'gated-gelu' "
                          "(gelu_new(x wi_0) * (x wi_1)) is supported; T5 v1.0 ('relu') is not")
  # v1.0 scales the decoder output by d_model**-0.5 before a head tied to the embedding; v1.1 has
  # neither. transformers < 5 records v1.1 as tie_word_embeddings=False; transformers >= 5 always
  # writes tie_word_embeddings=True and records v1.1 as scale_decoder_outputs=False instead.
  scale = hf.get("scale_decoder_outputs")
  if scale is None:
    scale = hf.get("tie_word_embeddings", True) is not False
  if scale:
    raise CheckpointError(
        f"HF tie_word_embeddings={hf.get('tie_word_embeddings', True)} without "
        "scale_decoder_outputs=false: a v1.0-style head (shared embedding, output scaled by "
        "d_model**-0.5); T5 v1.1 needs tie_word_embeddings=False (a separate lm_head)")
  fields = dict(
      kind="t5", vocab_size=hf["vocab_size"], emb_dim=hf["d_model"], num_heads=hf["num_heads"],
      head_dim=hf["d_kv"], mlp_dim=hf["d_ff"], num_encoder_layers=hf["num_layers"],
      num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
      relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
      relative_attention_max_distance=hf.get("relative_attention_max_distance", 128),
      layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-6),
      pad_id=hf.get("pad_token_id", 0) if hf.get("pad_token_id") is not None else 0,
      eos_id=_first(hf.get("eos_token_id", 1)))
  fields.update(overrides)
  return ModelConfig(**fields)


def _first(x):
  return x[0] if isinstance(x, (list, tuple)) else (1 if x is None else x)


def config_to_hf(config: ModelConfig, dtype: str = "float32") -> dict[str, Any]:
  if not config.is_encoder_decoder:
    raise CheckpointError("only the T5 encoder-decoder has an HF counterpart (T5ForConditionalGeneration)")
  if config.shares_encoder:
    raise CheckpointError("a shared-encoder draft (no encoder of its own) has no HF counterpart: "
                          "T5ForConditionalGeneration needs an encoder")
  return {
      "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
      "vocab_size": config.vocab_size, "d_model": config.emb_dim, "d_kv": config.head_dim,
      "d_ff": config.mlp_dim, "num_heads": config.num_heads, "num_layers": config.num_encoder_layers,
      "num_decoder_layers": config.num_decoder_layers,
      "relative_attention_num_buckets": config.relative_attention_num_buckets,
      "relative_attention_max_distance": config.relative_attention_max_distance,
      "feed_forward_proj": "gated-gelu", "dense_act_fn": "gelu_new", "is_gated_act": True,
      "tie_word_embeddings": False, "scale_decoder_outputs": False,
      "layer_norm_epsilon": config.layer_norm_epsilon,
      "dropout_rate": 0.0, "initializer_factor": 1.0, "is_encoder_decoder": True,
      "use_cache": True, "pad_token_id": config.pad_id, "eos_token_id": config.eos_id,
      "decoder_start_token_id": config.pad_id, "dtype": dtype,
  }


def name_map(config: ModelConfig) -> dict[str, tuple[str, bool]]:
  """{T5X path: (HF key, transpose?)} for every array of the (unscanned) tree."""
  m: dict[str, tuple[str, bool]] = {
      "token_embedder/embedding": ("shared.weight", False),
      "decoder/logits_dense/kernel": ("lm_head.weight", True),
      "encoder/relpos_bias/rel_embedding":
          ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", True),
      "decoder/relpos_bias/rel_embedding":
          ("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", True),
      "encoder/encoder_norm/scale": ("encoder.final_layer_norm.weight", False),
      "decoder/decoder_norm/scale": ("decoder.final_layer_norm.weight", False),
  }
  def block(stack, i, sub_idx, t5x_attn, hf_attn):
    hf_pre = f"{stack}.block.{i}.layer.{sub_idx}"
    for t5x_name, hf_name in _ATTN.items():
      m[f"{stack}/layers_{i}/{t5x_attn}/{t5x_name}/kernel"] = (f"{hf_pre}.{hf_attn}.{hf_name}.weight", True)
  def mlp(stack, i, sub_idx, norm):
    hf_pre = f"{stack}.block.{i}.layer.{sub_idx}"
    m[f"{stack}/layers_{i}/{norm}/scale"] = (f"{hf_pre}.layer_norm.weight", False)
    for w in ("wi_0", "wi_1", "wo"):
      m[f"{stack}/layers_{i}/mlp/{w}/kernel"] = (f"{hf_pre}.DenseReluDense.{w}.weight", True)
  for i in range(config.num_encoder_layers):
    m[f"encoder/layers_{i}/pre_attention_layer_norm/scale"] = (
        f"encoder.block.{i}.layer.0.layer_norm.weight", False)
    block("encoder", i, 0, "attention", "SelfAttention")
    mlp("encoder", i, 1, "pre_mlp_layer_norm")
  for i in range(config.num_decoder_layers):
    m[f"decoder/layers_{i}/pre_self_attention_layer_norm/scale"] = (
        f"decoder.block.{i}.layer.0.layer_norm.weight", False)
    block("decoder", i, 0, "self_attention", "SelfAttention")
    m[f"decoder/layers_{i}/pre_cross_attention_layer_norm/scale"] = (
        f"decoder.block.{i}.layer.1.layer_norm.weight", False)
    block("decoder", i, 1, "encoder_decoder_attention", "EncDecAttention")
    mlp("decoder", i, 2, "pre_mlp_layer_norm")
  return m


def read_state_dict(path: str) -> dict[str, Any]:
  """{HF key: numpy array (memory-mapped for safetensors)} from a model directory."""
  def load(file):
    if file.endswith(".safetensors"):
      return safetensors_io.open_file(file)
    return _torch_load(file)
  for single, index in (("model.safetensors", "model.safetensors.index.json"),
                        ("pytorch_model.bin", "pytorch_model.bin.index.json")):
    if os.path.isfile(os.path.join(path, single)):
      return load(os.path.join(path, single))
    if os.path.isfile(os.path.join(path, index)):
      files = sorted(set(_weight_map(os.path.join(path, index)).values()))
      out = {}
      for file in files:
        out.update(load(os.path.join(path, file)))
      return out
  raise CheckpointError(f"no HF weights in {path}; looked for {list(WEIGHT_FILES)}, found "
                        f"{sorted(os.listdir(path))}")


def _torch_load(file: str) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError as e:
    raise CheckpointError(f"{file} is a PyTorch pickle; install torch (pip install "
                          "'specdec_jax[hf]') or convert it to safetensors") from e
  import ml_dtypes
  sd = torch.load(file, map_location="cpu", weights_only=True)
  out = {}
  for k, t in sd.items():
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
      out[k] = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
      out[k] = t.numpy()
  return out


def from_state_dict(sd: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
  """HF state dict -> flat T5X tree (transposes are lazy views of memory maps)."""
  sd = dict(sd)
  if "shared.weight" not in sd:
    for alias in _ALIASES:
      if alias in sd:
        sd["shared.weight"] = sd[alias]
        break
  if "lm_head.weight" not in sd and "shared.weight" in sd:
    # An unscaled head tied to the embedding (transformers >= 5 drops the duplicate on save).
    sd["lm_head.weight"] = sd["shared.weight"]
  flat, used = {}, set(_ALIASES)
  for t5x_path, (key, transpose) in name_map(config).items():
    if key not in sd:
      raise CheckpointError(f"HF checkpoint lacks {key} (needed for target/{t5x_path})")
    arr = sd[key]
    flat[t5x_path] = arr.T if transpose else arr
    used.add(key)
  extra = sorted(k for k in sd if k not in used and "relative_attention_bias" not in k)
  if extra:
    raise CheckpointError(f"unexpected HF arrays (not part of T5 v1.1): {extra[:20]}")
  return flat


def load(path: str, **config_overrides: Any) -> tuple[ModelConfig, dict[str, Any]]:
  """HF model directory -> (ModelConfig, flat T5X tree of lazy numpy arrays)."""
  config = read_config(path, **config_overrides)
  if not config.is_encoder_decoder:
    return config, hf_decoder.from_state_dict(read_state_dict(path), config)
  return config, from_state_dict(read_state_dict(path), config)


def to_state_dict(config: ModelConfig, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """The HF state dict of a T5 (T5ForConditionalGeneration) or a Llama-layout decoder
  (`hf_decoder.name_map`, the reader's own mapping run backwards)."""
  flat = flatten(params) if any(isinstance(v, Mapping) for v in params.values()) else dict(params)
  flat = to_layout(flat, scan_layers=False)
  missing = [p for p in expected_shapes(config, scan_layers=False) if p not in flat]
  if missing:
    raise CheckpointError(f"params lack {['target/' + p for p in missing[:10]]}")
  sd = {}
  names = name_map(config) if config.is_encoder_decoder else hf_decoder.name_map(config)
  for t5x_path, (key, transpose) in names.items():
    arr = np.asarray(flat[t5x_path])
    sd[key] = np.ascontiguousarray(arr.T if transpose else arr)
  return sd


def to_hf(config: ModelConfig, params: Mapping[str, Any], out_dir: str, dtype=None) -> str:
  """Writes `model.safetensors` + `config.json` that `T5ForConditionalGeneration` loads untied,
  or, for a decoder-only model, `LlamaForCausalLM` / `Qwen2ForCausalLM`
  (`hf_decoder.config_to_hf`)."""
  paths.check_writable(out_dir, "an HF export")
  sd = to_state_dict(config, params)
  if dtype is not None:
    sd = {k: v.astype(dtype) for k, v in sd.items()}
  dtype_name = np.dtype(next(iter(sd.values())).dtype).name
  os.makedirs(out_dir, exist_ok=True)
  safetensors_io.save_file(sd, os.path.join(out_dir, "model.safetensors"))
  with open(os.path.join(out_dir, CONFIG_FILE), "w") as f:
    to_config = config_to_hf if config.is_encoder_decoder else hf_decoder.config_to_hf
    json.dump(to_config(config, dtype_name), f, indent=2, sort_keys=True)
  return out_dir


def _weight_map(index_file: str) -> dict[str, str]:
  """A sharded checkpoint's {array name: shard file}, with an error naming the index file."""
  index = storage.read_json(index_file, "HF weight index")
  if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
    raise CheckpointError(f"HF weight index {index_file} has no 'weight_map' object")
  return index["weight_map"]
