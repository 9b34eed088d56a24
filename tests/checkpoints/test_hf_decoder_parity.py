"""Llama / Qwen2 / Gemma checkpoints saved by transformers, read by us: the same logits.

Why: the readers rename, transpose, fold the attention scale into the query and map config
fields (rotary theta and Llama-3 scaling, grouped heads, tied heads, Gemma's norm and embedding
scale, Qwen2's biases); a mistake in any of them gives a model that runs and drafts noise.
Each family is a tiny random model of transformers' own class, saved as safetensors (single and
sharded with an index), read directly and through `specdec_jax.convert`, and compared in float32
on the full forward pass, on cached extends from ragged prompts, and on greedy decoding
(autoregressive and speculative) against transformers' `generate`.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from specdec_jax.checkpoints import load_checkpoint  # noqa: E402
from specdec_jax.checkpoints.tree import CheckpointError  # noqa: E402
from specdec_jax.convert import convert  # noqa: E402
from specdec_jax.decoding.decoder import Decoder, Params  # noqa: E402
from specdec_jax.decoding.sampling import SamplingConfig  # noqa: E402
from specdec_jax.decoding.speculative import Chain  # noqa: E402
from specdec_jax.models.model import Model  # noqa: E402

ATOL = 1e-4
V = 96
SHAPE = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8, eos_token_id=V - 1,
             bos_token_id=1, pad_token_id=0, initializer_range=0.2)
FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8},
                   rope_theta=500000.0, tie_word_embeddings=False)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(rope_theta=1e6, tie_word_embeddings=True)),
    "gemma": (transformers.GemmaConfig, transformers.GemmaForCausalLM,
              dict(num_key_value_heads=1, hidden_activation="gelu_pytorch_tanh")),
}
LENGTHS = [7, 3, 5]


def random_hf(family, seed=0):
  """A transformers model with every weight random (norm scales and biases too: ones, zeros and
  Gemma's zero-initialised norms would hide a missing offset or bias)."""
  config_cls, model_cls, extra = FAMILIES[family]
  torch.manual_seed(seed)
  cfg = config_cls(**{**SHAPE, **extra}, attn_implementation="eager")
  m = model_cls(cfg).eval()
  with torch.no_grad():
    for name, p in m.named_parameters():
      if name.endswith(("norm.weight", "layernorm.weight", ".bias")):
        p.add_(0.3 * torch.randn_like(p))
  return m


def prompts(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.integers(2, V - 1, size=(len(LENGTHS), max(LENGTHS) + 6))
  return x


def hf_logits(m, ids):
  with torch.no_grad():
    return m(input_ids=torch.tensor(ids)).logits.numpy()


def assert_logits_match(m, config, params):
  """Full forward over the sequences, and cached extends of 6 tokens after ragged prompts."""
  model = Model(config)
  seqs = prompts()
  want = hf_logits(m, seqs)
  full = np.asarray(jax.jit(model.forward)(params, None, jnp.asarray(seqs, jnp.int32)))
  assert np.max(np.abs(full - want)) < ATOL, np.max(np.abs(full - want))
  padded = np.zeros((len(LENGTHS), max(LENGTHS)), np.int32)
  for b, n in enumerate(LENGTHS):
    padded[b, :n] = seqs[b, :n]
  cache = jax.jit(model.prefill, static_argnums=2)(params, jnp.asarray(padded), 32)
  extend, got = jax.jit(model.extend), []
  feed = np.stack([seqs[b, n - 1:n + 5] for b, n in enumerate(LENGTHS)])
  for s in (0, 1, 4):  # a step, a verification block of 3, a step... blocks of 1, 3, 2
    e = {0: 1, 1: 4, 4: 6}[s]
    logits, cache = extend(params, cache, jnp.asarray(feed[:, s:e], jnp.int32))
    got.append(np.asarray(logits))
  got = np.concatenate(got, axis=1)
  for b, n in enumerate(LENGTHS):
    diff = np.max(np.abs(got[b] - want[b, n - 1:n + 5]))
    assert diff < ATOL, (b, diff)


def hf_greedy(m, prompt, steps):
  with torch.no_grad():
    out = m.generate(torch.tensor(prompt[None]), max_new_tokens=steps, do_sample=False,
                     num_beams=1, pad_token_id=0).numpy()[0, len(prompt):]
  return out


def assert_greedy_matches(m, config, params, steps=10):
  """Our greedy decode, autoregressive and speculative (a draft of another seed), equals
  transformers' generate token for token."""
  model = Model(config)
  draft, dp = Model(config), None
  dp = jax.tree.map(lambda x: x + 0.05 * jnp.sin(jnp.arange(x.size).reshape(x.shape)), params)
  inputs = np.zeros((len(LENGTHS), max(LENGTHS)), np.int32)
  seqs = prompts(seed=3)
  for b, n in enumerate(LENGTHS):
    inputs[b, :n] = seqs[b, :n]
  greedy = SamplingConfig(temperature=0.0)
  ar = Decoder(model, sampling=greedy, max_decode_len=steps).generate(Params(params),
                                                                      jnp.asarray(inputs))
  spec = Decoder(model, draft, Chain(3), greedy, max_decode_len=steps).generate(
      Params(params, dp), jnp.asarray(inputs))
  for b, n in enumerate(LENGTHS):
    want = hf_greedy(m, inputs[b, :n], steps)
    got = np.asarray(ar.tokens_BxN)[b, :int(ar.lengths_B[b])]
    np.testing.assert_array_equal(got, want[:len(got)])
    assert len(got) == len(want)
  np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_single_file_read_directly_matches_transformers(family, tmp_path):
  m = random_hf(family)
  m.save_pretrained(str(tmp_path / "hf"))
  assert (tmp_path / "hf" / "model.safetensors").exists()
  config, params = load_checkpoint(str(tmp_path / "hf"))
  assert config.kind == "decoder" and config.uses_rope
  assert config.kv_heads == m.config.num_key_value_heads
  assert_logits_match(m, config, params)
  assert_greedy_matches(m, config, params)


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_sharded_index_converted_matches_transformers(family, tmp_path):
  m = random_hf(family, seed=1)
  m.save_pretrained(str(tmp_path / "hf"), max_shard_size="20KB")
  assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
  out = convert("hf", str(tmp_path / "hf"), str(tmp_path / "converted"))
  config, params = load_checkpoint(out)
  assert config == load_checkpoint(str(tmp_path / "hf"))[0]
  assert_logits_match(m, config, params)


def test_unsupported_options_are_refused(tmp_path):
  m = random_hf("qwen2")
  m.config.use_sliding_window = True
  m.save_pretrained(str(tmp_path / "hf"))
  with pytest.raises(CheckpointError, match="sliding"):
    load_checkpoint(str(tmp_path / "hf"))


def test_bfloat16_checkpoint_read_as_float32_and_scanned(tmp_path):
  """A bfloat16 file (how the public checkpoints ship) read at float32 into scanned layers gives
  transformers' float32 logits on the same (bf16-rounded) weights: nothing is rounded twice."""
  m = random_hf("llama", seed=2)
  m.to(torch.bfloat16).save_pretrained(str(tmp_path / "hf"))
  # Read back at float32 by transformers itself (its rotary buffers then float32 again).
  m = FAMILIES["llama"][1].from_pretrained(str(tmp_path / "hf"), dtype=torch.float32,
                                           attn_implementation="eager").eval()
  config, params = load_checkpoint(str(tmp_path / "hf"), dtype="float32", scan_layers=True)
  assert config.scan_layers
  assert_logits_match(m, config, params)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_our_decoder_exported_to_transformers_computes_the_same_logits(family, tmp_path):
  """`hf.to_hf` of a decoder-only model (how a draft trained here becomes transformers'
  assistant model, scripts/compare_hf.py): transformers loads it and computes our logits
  (Llama-3 rope scaling, an untied head, Qwen2's biases and a tied head), and our reader gets the
  same config back. Gemma's options have no export and are refused by name."""
  from specdec_jax.checkpoints import hf  # pylint: disable=import-outside-toplevel
  source = random_hf(family, seed=3)
  source.save_pretrained(str(tmp_path / "hf"))
  config, params = load_checkpoint(str(tmp_path / "hf"))
  hf.to_hf(config, params, str(tmp_path / "exported"))
  _, model_cls, _ = FAMILIES[family]
  exported = model_cls.from_pretrained(str(tmp_path / "exported"),
                                       attn_implementation="eager").eval()
  assert_logits_match(exported, config, params)
  assert load_checkpoint(str(tmp_path / "exported"))[0] == config
  gemma_config, gemma_params = load_checkpoint(_saved(random_hf("gemma"), tmp_path / "g"))
  with pytest.raises(CheckpointError, match="Llama / Qwen2"):
    hf.to_hf(gemma_config, gemma_params, str(tmp_path / "gemma_out"))


def _saved(m, path) -> str:
  m.save_pretrained(str(path))
  return str(path)
