"""A tiny random Llama written as GGUF the way llama.cpp's converter writes one (queries and keys
permuted, quantized and float tensors, a byte-level BPE vocabulary, a chat template), so the
GGUF tests need no network and no real model."""
from __future__ import annotations

import numpy as np

V, E, M, L, H, KV, HD = 96, 64, 256, 2, 4, 2, 16
TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
            "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_char(b: int) -> str:
  """GPT-2's bytes_to_unicode for one byte (printable ASCII maps to itself, ' ' to 'Ġ')."""
  printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
  if b in printable:
    return chr(b)
  return chr(256 + [c for c in range(256) if c not in printable].index(b))


def vocabulary():
  """(tokens, token types, merges): 3 control tokens, 90 single characters, 3 merges."""
  chars = [byte_char(b) for b in [32] + list(range(97, 123)) + list(range(48, 58))
           + list(range(33, 48)) + list(range(58, 97)) + list(range(123, 127))][:90]
  merges = ["Ġ a", "a b", "Ġa b"]
  tokens = SPECIALS + chars + ["Ġa", "ab", "Ġab"]
  assert len(tokens) == V, len(tokens)
  return tokens, [3] * len(SPECIALS) + [1] * (V - len(SPECIALS)), merges


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp convert_hf_to_gguf.py's `LlamaModel.permute` (HF rows -> GGUF rows)."""
  return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2)
          .reshape(w.shape))


def _raw_k_quant(rng, rows: int, cols: int, qtype) -> np.ndarray:
  """Random bytes of a K-quant tensor with finite, modest fp16 scales (gguf-py cannot quantize
  K types; reading them is what is tested)."""
  import gguf  # pylint: disable=import-outside-toplevel
  block, size = gguf.GGML_QUANT_SIZES[qtype]
  raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
  scale = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
  if qtype == gguf.GGMLQuantizationType.Q4_K:  # d, dmin first
    raw[..., 0:2] = scale
    raw[..., 2:4] = scale
  elif qtype == gguf.GGMLQuantizationType.Q6_K:  # d last
    raw[..., size - 2:size] = scale
  return raw.reshape(rows, -1)


def random_hf_state(seed: int = 0) -> dict[str, np.ndarray]:
  """HF-named float32 weights (norm scales away from 1 so a missing one shows)."""
  rng = np.random.default_rng(seed)
  w = lambda *s: (0.2 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
  sd = {"model.embed_tokens.weight": w(V, E), "model.norm.weight": 1 + w(E)}
  for i in range(L):
    p = f"model.layers.{i}."
    sd.update({p + "input_layernorm.weight": 1 + w(E), p + "post_attention_layernorm.weight": 1 + w(E),
               p + "self_attn.q_proj.weight": w(H * HD, E), p + "self_attn.k_proj.weight": w(KV * HD, E),
               p + "self_attn.v_proj.weight": w(KV * HD, E), p + "self_attn.o_proj.weight": w(E, H * HD),
               p + "mlp.gate_proj.weight": w(M, E), p + "mlp.up_proj.weight": w(M, E),
               p + "mlp.down_proj.weight": w(E, M)})
  return sd


# GGUF tensor name -> type written (the rest F32); every type the issue names appears.
TYPES = {"token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q4_1", "blk.0.attn_k.weight": "Q4_0",
         "blk.0.attn_v.weight": "F16", "blk.0.attn_output.weight": "BF16",
         "blk.0.ffn_gate.weight": "Q4_1", "blk.0.ffn_up.weight": "Q8_0",
         "blk.0.ffn_down.weight": "Q4_K", "blk.1.attn_q.weight": "Q8_0",
         "blk.1.attn_k.weight": "Q4_1", "blk.1.ffn_down.weight": "Q6_K",
         "blk.1.ffn_gate.weight": "Q5_0"}
_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
          "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down"}


def gguf_name(hf_name: str) -> str:
  if hf_name == "model.embed_tokens.weight":
    return "token_embd.weight"
  if hf_name == "model.norm.weight":
    return "output_norm.weight"
  _, _, i, rest = hf_name.split(".", 3)
  module = rest.rsplit(".", 1)[0]
  return f"blk.{i}.{_NAMES[module]}.weight"


def write(path: str, seed: int = 0, arch: str = "llama", types: dict | None = None,
          pre: str = "smollm") -> dict[str, np.ndarray]:
  """Writes the tiny model to `path`; returns its HF state dict (before quantization)."""
  import gguf  # pylint: disable=import-outside-toplevel
  types = TYPES if types is None else types
  rng = np.random.default_rng(seed + 1)
  sd = random_hf_state(seed)
  w = gguf.GGUFWriter(path, arch)
  w.add_block_count(L)
  w.add_context_length(128)
  w.add_embedding_length(E)
  w.add_feed_forward_length(M)
  w.add_head_count(H)
  w.add_head_count_kv(KV)
  w.add_rope_freq_base(10000.0)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_rope_dimension_count(HD)
  w.add_vocab_size(V)
  tokens, token_types, merges = vocabulary()
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_types(token_types)
  w.add_token_merges(merges)
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  w.add_pad_token_id(2)
  w.add_chat_template(TEMPLATE)
  for hf_name, array in sd.items():
    name = gguf_name(hf_name)
    if name.endswith("attn_q.weight"):
      array = llama_permute(array, H)
    elif name.endswith("attn_k.weight"):
      array = llama_permute(array, KV)
    kind = types.get(name, "F32")
    qtype = gguf.GGMLQuantizationType[kind]
    if kind == "F32":
      w.add_tensor(name, array)
    elif kind == "F16":
      w.add_tensor(name, array.astype(np.float16))
    elif kind in ("Q4_K", "Q6_K", "Q2_K"):
      w.add_tensor(name, _raw_k_quant(rng, *array.shape, qtype), raw_dtype=qtype)
    else:
      w.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return sd
