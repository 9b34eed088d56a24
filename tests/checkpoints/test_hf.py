"""Hugging Face T5 v1.1 <-> T5X tree: config mapping, name mapping, safetensors and torch files."""
import json

import numpy as np
import pytest

from ckpt_testutil import BF16, assert_trees_bit_identical, random_params
from specdec_jax.checkpoints import hf, hf_decoder, safetensors_io
from specdec_jax.checkpoints.tree import CheckpointError, flatten, unflatten
from specdec_jax.models.model_config import get_preset

V11 = {"model_type": "t5", "vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 1024,
       "num_heads": 6, "num_layers": 8, "num_decoder_layers": 8,
       "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
       "relative_attention_num_buckets": 32, "layer_norm_epsilon": 1e-6,
       "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}


def test_config_mapping_of_t5_v1_1_small():
  assert hf.config_from_hf(V11) == get_preset("t5_1_1_small")
  # transformers >= 5 writes tie_word_embeddings=True for v1.1 and records scale_decoder_outputs.
  assert hf.config_from_hf(dict(V11, tie_word_embeddings=True, scale_decoder_outputs=False)) == \
      get_preset("t5_1_1_small")
  no_dec = {k: v for k, v in V11.items() if k != "num_decoder_layers"}
  assert hf.config_from_hf(no_dec).num_decoder_layers == 8
  back = hf.config_from_hf(hf.config_to_hf(get_preset("t5_1_1_base")))
  assert back == get_preset("t5_1_1_base")


def test_config_mapping_errors():
  with pytest.raises(CheckpointError, match="feed_forward_proj='relu'.*gated-gelu"):
    hf.config_from_hf(dict(V11, feed_forward_proj="relu"))
  with pytest.raises(CheckpointError, match="tie_word_embeddings"):
    hf.config_from_hf(dict(V11, tie_word_embeddings=True))
  with pytest.raises(CheckpointError, match="tie_word_embeddings"):
    hf.config_from_hf({k: v for k, v in V11.items() if k != "tie_word_embeddings"})
  with pytest.raises(CheckpointError, match="not T5"):
    hf.config_from_hf(dict(V11, model_type="bart"))
  with pytest.raises(CheckpointError, match="encoder-decoder"):
    hf.config_to_hf(get_preset("decoder_test_target"))


def test_name_map_transposes_kernels_only():
  m = hf.name_map(get_preset("t5_test_target"))
  assert m["decoder/layers_1/encoder_decoder_attention/value/kernel"] == (
      "decoder.block.1.layer.1.EncDecAttention.v.weight", True)
  assert m["decoder/layers_1/pre_mlp_layer_norm/scale"] == (
      "decoder.block.1.layer.2.layer_norm.weight", False)
  assert m["decoder/logits_dense/kernel"] == ("lm_head.weight", True)
  assert m["encoder/relpos_bias/rel_embedding"][1] is True
  assert len(set(k for k, _ in m.values())) == len(m)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_state_dict_round_trip(tmp_path, dtype):
  config = get_preset("t5_test_target")
  params = random_params(config, dtype=dtype)
  sd = hf.to_state_dict(config, params)
  assert sd["lm_head.weight"].shape == (64, 32)
  assert sd["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].shape == (32, 4)
  np.testing.assert_array_equal(sd["encoder.block.1.layer.1.DenseReluDense.wo.weight"],
                                params["encoder"]["layers_1"]["mlp"]["wo"]["kernel"].T)
  hf.to_hf(config, params, str(tmp_path))
  loaded_config, flat = hf.load(str(tmp_path))
  assert loaded_config == config
  assert_trees_bit_identical(unflatten({k: np.asarray(v) for k, v in flat.items()}), params)


def test_safetensors_io_bf16(tmp_path):
  tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3).astype(BF16),
             "b": np.arange(5, dtype=np.int64), "c": np.zeros((0, 3), np.float32)}
  safetensors_io.save_file(tensors, str(tmp_path / "x.safetensors"))
  back = safetensors_io.open_file(str(tmp_path / "x.safetensors"))
  for k, v in tensors.items():
    assert back[k].dtype == v.dtype and back[k].tobytes() == v.tobytes()
  from safetensors.numpy import load_file  # the reference reader agrees on the float32 layout
  safetensors_io.save_file({"w": np.ones((3, 2), np.float32)}, str(tmp_path / "y.safetensors"))
  np.testing.assert_array_equal(load_file(str(tmp_path / "y.safetensors"))["w"], np.ones((3, 2)))


def test_sharded_safetensors_index(tmp_path):
  config = get_preset("t5_test_draft")
  params = random_params(config)
  sd = hf.to_state_dict(config, params)
  names = sorted(sd)
  half = {n: sd[n] for n in names[: len(names) // 2]}
  rest = {n: sd[n] for n in names[len(names) // 2:]}
  safetensors_io.save_file(half, str(tmp_path / "model-00001-of-00002.safetensors"))
  safetensors_io.save_file(rest, str(tmp_path / "model-00002-of-00002.safetensors"))
  weight_map = {n: "model-00001-of-00002.safetensors" for n in half}
  weight_map.update({n: "model-00002-of-00002.safetensors" for n in rest})
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  (tmp_path / "config.json").write_text(json.dumps(hf.config_to_hf(config)))
  assert hf.is_hf(str(tmp_path))
  _, flat = hf.load(str(tmp_path))
  assert_trees_bit_identical(unflatten({k: np.asarray(v) for k, v in flat.items()}), params)


def test_missing_and_unexpected_hf_arrays(tmp_path):
  config = get_preset("t5_test_draft")
  sd = hf.to_state_dict(config, random_params(config))
  with pytest.raises(CheckpointError, match=r"lacks decoder\.block\.0\.layer\.2\.DenseReluDense\.wo"
                     r"\.weight \(needed for target/decoder/layers_0/mlp/wo/kernel\)"):
    hf.from_state_dict({k: v for k, v in sd.items()
                        if k != "decoder.block.0.layer.2.DenseReluDense.wo.weight"}, config)
  with pytest.raises(CheckpointError, match=r"unexpected HF arrays.*DenseReluDense\.wi\.weight"):
    hf.from_state_dict(dict(sd, **{"encoder.block.0.layer.1.DenseReluDense.wi.weight": sd[
        "shared.weight"]}), config)
  # Tied aliases of the embedding may be present, and a missing lm_head means an unscaled tie.
  sd2 = dict(sd, **{"encoder.embed_tokens.weight": sd["shared.weight"]})
  del sd2["lm_head.weight"]
  flat = hf.from_state_dict(sd2, config)
  np.testing.assert_array_equal(flat["decoder/logits_dense/kernel"], sd["shared.weight"].T)


def test_pytorch_bin(tmp_path):
  torch = pytest.importorskip("torch")
  config = get_preset("t5_test_draft")
  params = random_params(config, dtype=BF16)
  sd = hf.to_state_dict(config, params)
  tsd = {k: torch.from_numpy(v.view(np.int16).copy()).view(torch.bfloat16) for k, v in sd.items()}
  torch.save(tsd, str(tmp_path / "pytorch_model.bin"))
  (tmp_path / "config.json").write_text(json.dumps(hf.config_to_hf(config)))
  _, flat = hf.load(str(tmp_path))
  assert_trees_bit_identical(unflatten({k: np.asarray(v) for k, v in flat.items()}), params)


def test_to_hf_requires_complete_params(tmp_path):
  config = get_preset("t5_test_draft")
  flat = flatten(random_params(config))
  del flat["decoder/logits_dense/kernel"]
  with pytest.raises(CheckpointError, match="target/decoder/logits_dense/kernel"):
    hf.to_hf(config, unflatten(flat), str(tmp_path))


# meta-llama/Llama-3.1-70B's config.json (transformers < 5 spelling: rope_theta + rope_scaling).
LLAMA31_70B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 8192,
    "intermediate_size": 28672, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 64, "num_hidden_layers": 80,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256}


def test_decoder_family_configs_map_to_the_presets():
  """The Llama-3.x presets are what their HF config.json files say (either rope spelling), with
  the pad id their tokenizer files give (config.json alone declares none: 0)."""
  def read(config):  # as `hf.read_config` reads a checkpoint directory with its tokenizer files
    pad = hf_decoder.choose_pad_id(config, {"<|finetune_right_pad_id|>": 128004})
    return hf.config_from_hf(config, pad_id=pad)
  assert read(LLAMA31_70B) == get_preset("llama3_1_70b")
  assert hf.config_from_hf(LLAMA31_70B) == get_preset("llama3_1_70b", pad_id=0)
  new = {k: v for k, v in LLAMA31_70B.items() if k not in ("rope_theta", "rope_scaling")}
  new["rope_parameters"] = dict(LLAMA31_70B["rope_scaling"], rope_theta=500000.0)
  assert read(new) == get_preset("llama3_1_70b")
  small = dict(LLAMA31_70B, hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
               num_hidden_layers=16, head_dim=64, tie_word_embeddings=True,
               rope_scaling=dict(LLAMA31_70B["rope_scaling"], factor=32.0))
  assert read(small) == get_preset("llama3_2_1b")
  gemma = hf.config_from_hf(dict(model_type="gemma", vocab_size=256, hidden_size=32,
                                 intermediate_size=64, num_attention_heads=4, head_dim=16,
                                 num_hidden_layers=2, num_key_value_heads=1, hidden_act="gelu",
                                 eos_token_id=1))
  assert (gemma.mlp_activation, gemma.norm_offset, gemma.scale_embeddings,
          gemma.tie_embeddings) == ("gelu", 1.0, True, True)


@pytest.mark.parametrize("change,match", [
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "yarn"),
    (dict(attention_bias=True), "attention_bias"), (dict(hidden_act="relu"), "relu"),
    (dict(eos_token_id=None), "eos_token_id")])
def test_decoder_family_options_we_do_not_compute_are_refused(change, match):
  with pytest.raises(CheckpointError, match=match):
    hf.config_from_hf(dict(LLAMA31_70B, **change))
