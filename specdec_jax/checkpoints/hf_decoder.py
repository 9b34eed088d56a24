"""Hugging Face Llama, Qwen2 and Gemma checkpoints -> ModelConfig and the parameter tree.

Why beside `hf.py` (T5) and not in it: the families share one layout (`model.layers.{i}...`),
which maps onto the decoder-only tree of `models.transformer` with the modern options of
`ModelConfig` (DESIGN.md "The modern decoder family"); `hf.py` dispatches here by `model_type`.
What the mapping does besides renaming:
- kernels are transposed (HF's `nn.Linear` stores (out, in)), lazily, on the memory maps;
- the attention's 1/sqrt(head_dim) stays a run-time factor (`ModelConfig.attention_scale`), as
  in HF: folded into a bfloat16 query kernel it would round the weights once more;
- a tied head (`tie_word_embeddings`) reads the embedding; an `lm_head.weight` a tied file
  carries anyway is the same array and is left out.
"""
from __future__ import annotations

from typing import Any, Mapping

from specdec_jax.checkpoints.tree import CheckpointError
from specdec_jax.models.model_config import ModelConfig

MODEL_TYPES = ("llama", "qwen2", "gemma")
_ACT = {"silu": "silu", "gelu_pytorch_tanh": "gelu", "gelu_new": "gelu"}
_ATTN = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "out": "o_proj"}
_MLP = {"wi_0": "gate_proj", "wi_1": "up_proj", "wo": "down_proj"}


def _rope(hf: Mapping[str, Any]) -> dict[str, Any]:
  """rope_theta and rope_scaling fields from either spelling (transformers < 5: `rope_theta` and
  `rope_scaling`; >= 5: one `rope_parameters`)."""
  params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
  kind = params.get("rope_type", params.get("type", "default"))
  if kind == "default":
    return dict(rope_theta=float(theta))
  if kind != "llama3":
    raise CheckpointError(f"HF rope type {kind!r} is not supported (default and llama3 are)")
  scaling = (float(params["factor"]), float(params["low_freq_factor"]),
             float(params["high_freq_factor"]), float(params["original_max_position_embeddings"]))
  return dict(rope_theta=float(theta), rope_scaling=scaling)


def _activation(hf: Mapping[str, Any], model_type: str) -> str:
  act = hf.get("hidden_activation") or hf.get("hidden_act", "silu")
  if model_type == "gemma" and act == "gelu":  # HF runs Gemma's legacy 'gelu' as the tanh one
    act = "gelu_pytorch_tanh"
  if act not in _ACT:
    raise CheckpointError(f"HF activation {act!r} is not supported (one of {sorted(_ACT)})")
  return _ACT[act]


def _refuse_unsupported(hf: Mapping[str, Any], model_type: str) -> None:
  """Options these layers do not compute: an error, not logits that silently differ."""
  if hf.get("attention_bias") and model_type != "qwen2":
    raise CheckpointError("HF attention_bias=true (a bias on o_proj too) is not supported")
  if hf.get("mlp_bias"):
    raise CheckpointError("HF mlp_bias=true is not supported")
  if model_type == "qwen2" and hf.get("use_sliding_window"):
    raise CheckpointError("HF Qwen2 use_sliding_window=true is not supported")


# Tokens the families reserve for padding, by name, in the order they are preferred.
PAD_TOKENS = ("<|finetune_right_pad_id|>", "<pad>", "<|pad|>")


def choose_pad_id(hf: Mapping[str, Any], special_ids: Mapping[str, int],
                  pad_token: str | None = None) -> int:
  """The id prompts are right-padded with: one that no text encodes to.

  Why not 0: it is a real token in these vocabularies (Llama-3's '!'), and a prompt holding it
  would end there. In order: config.json's `pad_token_id`; the tokenizer's declared
  `pad_token` (tokenizer_config.json: Qwen2's '<|endoftext|>', also its EOS, which a prompt
  never holds); a special token reserved for padding (`PAD_TOKENS`: Llama-3.1's
  '<|finetune_right_pad_id|>', Gemma's '<pad>'); else 0, where a prompt that tokenizes to 0 is
  refused by name (`data.hf_tokenizer`). special_ids: the tokenizer's added tokens, content ->
  id ({} when no tokenizer files are beside the weights)."""
  if hf.get("pad_token_id") is not None:
    return int(_first(hf["pad_token_id"]))
  for name in ((pad_token,) if pad_token else ()) + PAD_TOKENS:
    if name in special_ids:
      return int(special_ids[name])
  return 0


def config_from_hf(hf: Mapping[str, Any], **overrides: Any) -> ModelConfig:
  """An HF LlamaConfig / Qwen2Config / GemmaConfig dict -> ModelConfig (kind 'decoder').

  pad_id: config.json's `pad_token_id`, else 0; `hf.read_config` passes the choice made with
  the tokenizer files beside the weights (`choose_pad_id`)."""
  model_type = hf["model_type"]
  _refuse_unsupported(hf, model_type)
  heads = hf["num_attention_heads"]
  head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
  gemma = model_type == "gemma"
  fields = dict(
      kind="decoder", vocab_size=hf["vocab_size"], emb_dim=hf["hidden_size"], num_heads=heads,
      num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=head_dim, attention_scale=head_dim ** -0.5, mlp_dim=hf["intermediate_size"],
      num_encoder_layers=0, num_decoder_layers=hf["num_hidden_layers"], position="rope",
      layer_norm_epsilon=hf.get("rms_norm_eps", 1e-6), mlp_activation=_activation(hf, model_type),
      norm_offset=1.0 if gemma else 0.0, scale_embeddings=gemma, qkv_bias=model_type == "qwen2",
      tie_embeddings=bool(hf.get("tie_word_embeddings", gemma)), pad_id=choose_pad_id(hf, {}),
      eos_id=_first(hf.get("eos_token_id")), **_rope(hf))
  fields.update(overrides)
  return ModelConfig(**fields)


def config_to_hf(config: ModelConfig, dtype: str = "float32") -> dict[str, Any]:
  """ModelConfig (kind 'decoder', Llama / Qwen2 options) -> the config.json that
  LlamaForCausalLM / Qwen2ForCausalLM load: the inverse of `config_from_hf`, for handing a
  draft trained here to transformers (an assistant model, `scripts/compare_hf.py`). Gemma's
  options (norm offset, scaled embeddings) and the T5-style decoder are refused."""
  if config.kind != "decoder" or config.position != "rope" or config.norm_offset or (
      config.scale_embeddings):
    raise CheckpointError("only a RoPE decoder with the Llama / Qwen2 options has an HF "
                          "counterpart here (LlamaForCausalLM, Qwen2ForCausalLM)")
  act = {v: k for k, v in _ACT.items() if k != "gelu_new"}[config.mlp_activation]
  model_type = "qwen2" if config.qkv_bias else "llama"
  rope = {"rope_type": "default", "rope_theta": config.rope_theta}
  if config.rope_scaling:
    factor, low, high, original = config.rope_scaling
    rope = {"rope_type": "llama3", "rope_theta": config.rope_theta, "factor": factor,
            "low_freq_factor": low, "high_freq_factor": high,
            "original_max_position_embeddings": int(original)}
  return {
      "architectures": ["Qwen2ForCausalLM" if config.qkv_bias else "LlamaForCausalLM"],
      "model_type": model_type, "vocab_size": config.vocab_size, "hidden_size": config.emb_dim,
      "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.head_dim, "intermediate_size": config.mlp_dim,
      "num_hidden_layers": config.num_decoder_layers, "rms_norm_eps": config.layer_norm_epsilon,
      "hidden_act": act, "tie_word_embeddings": bool(config.tie_embeddings),
      "rope_theta": config.rope_theta, "rope_parameters": rope,
      **({"rope_scaling": rope} if config.rope_scaling else {}),
      "attention_bias": False, "mlp_bias": False, "max_position_embeddings": 8192,
      "pad_token_id": config.pad_id, "eos_token_id": config.eos_id, "bos_token_id": None,
      "use_cache": True, "dtype": dtype,
  }


def _first(x) -> int:
  x = x[0] if isinstance(x, (list, tuple)) else x
  if x is None:
    raise CheckpointError("HF config has no eos_token_id")
  return int(x)


def name_map(config: ModelConfig) -> dict[str, tuple[str, bool]]:
  """{tree path: (HF key, transpose?)} for every array of the (unscanned) tree."""
  m = {"token_embedder/embedding": ("model.embed_tokens.weight", False),
       "decoder/decoder_norm/scale": ("model.norm.weight", False)}
  if not config.tie_embeddings:
    m["decoder/logits_dense/kernel"] = ("lm_head.weight", True)
  for i in range(config.num_decoder_layers):
    ours, theirs = f"decoder/layers_{i}", f"model.layers.{i}"
    m[f"{ours}/pre_self_attention_layer_norm/scale"] = (f"{theirs}.input_layernorm.weight", False)
    m[f"{ours}/pre_mlp_layer_norm/scale"] = (f"{theirs}.post_attention_layernorm.weight", False)
    for name, proj in _ATTN.items():
      m[f"{ours}/self_attention/{name}/kernel"] = (f"{theirs}.self_attn.{proj}.weight", True)
      if config.qkv_bias and name != "out":
        m[f"{ours}/self_attention/{name}/bias"] = (f"{theirs}.self_attn.{proj}.bias", False)
    for name, proj in _MLP.items():
      m[f"{ours}/mlp/{name}/kernel"] = (f"{theirs}.mlp.{proj}.weight", True)
  return m


def from_state_dict(sd: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
  """HF state dict -> flat tree (the transposes are lazy views of the memory maps)."""
  flat, used = {}, set()
  for path, (key, transpose) in name_map(config).items():
    if key not in sd:
      raise CheckpointError(f"HF checkpoint lacks {key} (needed for target/{path})")
    flat[path] = sd[key].T if transpose else sd[key]
    used.add(key)
  if config.tie_embeddings:
    used.add("lm_head.weight")
  extra = sorted(k for k in sd if k not in used and not k.endswith("rotary_emb.inv_freq"))
  if extra:
    raise CheckpointError(f"unexpected HF arrays (not part of this {config.kind} layout): "
                          f"{extra[:20]}")
  return flat
