"""Our model on converted weights vs transformers' T5ForConditionalGeneration (float32).

Two directions: an HF v1.1 model saved as safetensors, converted and run through our model; and
T5X's own test checkpoint run through our model and through an HF model built from the same
weights by `to_hf`, which cross-checks the T5X naming against an independent implementation.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from specdec_jax.checkpoints import hf, load_checkpoint  # noqa: E402
from specdec_jax.checkpoints.tree import flatten  # noqa: E402
from specdec_jax.convert import convert  # noqa: E402

model_lib = pytest.importorskip("specdec_jax.models.model")
RTOL = 1e-5


def rel_err(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


def random_hf_v11(seed=0):
  """A small random T5 v1.1 with an untied head (transformers 5 ties it unless reassigned)."""
  torch.manual_seed(seed)
  cfg = transformers.T5Config(
      vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
      num_heads=4, feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0,
      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
  m = transformers.T5ForConditionalGeneration(cfg).eval()
  m.lm_head.weight = torch.nn.Parameter(torch.randn(cfg.vocab_size, cfg.d_model))
  assert m.lm_head.weight.data_ptr() != m.shared.weight.data_ptr()
  return m


def prompts(vocab, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.integers(2, vocab, size=(3, 9))
  x[1, 6:] = 0
  x[2, 4:] = 0
  return x


def hf_outputs(m, inputs, dec):
  with torch.no_grad():
    ids = torch.tensor(inputs)
    mask = (ids > 0).long()
    enc = m.encoder(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
    logits = m(input_ids=ids, attention_mask=mask, decoder_input_ids=torch.tensor(dec)).logits.numpy()
  return enc, logits


def our_outputs(config, params, inputs, dec):
  from specdec_jax.models.transformer import Transformer
  model = model_lib.build_model(config)

  @jax.jit  # one compiled program: op-by-op dispatch is many times slower on a loaded CPU
  def run(params, inputs, dec):
    enc = model.module.apply({"params": params}, inputs, method=Transformer.encode)
    return enc, model.forward(params, inputs, dec)

  enc, logits = run(params, jnp.asarray(inputs, jnp.int32), jnp.asarray(dec, jnp.int32))
  return np.asarray(enc), np.asarray(logits)


def greedy(config, params, inputs, steps):
  """The lead's autoregressive loop when present, else argmax over `extend`."""
  model = model_lib.build_model(config)
  inputs = jnp.asarray(inputs, jnp.int32)
  try:
    from specdec_jax.decoding.decoder import Decoder, Params
    from specdec_jax.decoding.sampling import SamplingConfig
  except ImportError:
    cache = model.prefill(params, inputs, steps + 1)
    tok = model.start_tokens(inputs)[:, None]
    out = []
    for _ in range(steps):
      logits, cache = model.extend(params, cache, tok)
      tok = jnp.argmax(logits[:, -1], -1)[:, None].astype(jnp.int32)
      out.append(tok)
    return np.asarray(jnp.concatenate(out, 1))
  res = Decoder(model, sampling=SamplingConfig(), max_decode_len=steps).generate(Params(params),
                                                                                 inputs)
  return np.asarray(res.tokens_BxN)


def hf_greedy(m, inputs, steps):
  with torch.no_grad():
    ids = torch.tensor(inputs)
    out = m.generate(ids, attention_mask=(ids > 0).long(), max_new_tokens=steps, do_sample=False,
                     num_beams=1).numpy()[:, 1:]  # drop the decoder start token
  return np.pad(out, ((0, 0), (0, steps - out.shape[1])))  # HF pads finished rows with 0 too


def assert_parity(m, config, params, vocab, steps=12):
  inputs = prompts(vocab)
  dec = np.concatenate([np.zeros((3, 1), np.int64), prompts(vocab, seed=1)[:, :7]], axis=1)
  dec[dec == 0] = 5
  dec[:, 0] = 0
  enc_ref, logits_ref = hf_outputs(m, inputs, dec)
  enc, logits = our_outputs(config, params, inputs, dec)
  mask = inputs > 0
  assert rel_err(enc[mask], enc_ref[mask]) < RTOL
  assert rel_err(logits, logits_ref) < RTOL
  np.testing.assert_array_equal(greedy(config, params, inputs, steps), hf_greedy(m, inputs, steps))


def test_hf_safetensors_converted_matches_transformers(tmp_path):
  m = random_hf_v11()
  m.save_pretrained(str(tmp_path / "hf"))  # model.safetensors + config.json
  assert (tmp_path / "hf" / "model.safetensors").exists()
  out = convert("hf", str(tmp_path / "hf"), str(tmp_path / "converted"))
  config, params = load_checkpoint(out)
  assert config.emb_dim == 32 and config.vocab_size == 64
  assert_parity(m, config, params, vocab=64)


def test_to_hf_round_trip_through_transformers(tmp_path):
  m = random_hf_v11(seed=1)
  m.save_pretrained(str(tmp_path / "hf"))
  config, params = load_checkpoint(str(tmp_path / "hf"))
  # to_hf writes what transformers loads untied, with identical weights.
  hf.to_hf(config, params, str(tmp_path / "back"))
  m2 = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "back")).eval()
  assert m2.lm_head.weight.data_ptr() != m2.shared.weight.data_ptr()
  sd, sd2 = m.state_dict(), m2.state_dict()
  assert set(sd) == set(sd2)
  for k in sd:
    assert torch.equal(sd[k], sd2[k]), k


def test_t5x_tiny_checkpoint_matches_transformers_via_to_hf(tmp_path, t5x_tiny_path):
  config, params = load_checkpoint(t5x_tiny_path, preset="t5_1_1_tiny")
  hf.to_hf(config, params, str(tmp_path / "hf"))
  m = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "hf")).eval()
  assert m.lm_head.weight.data_ptr() != m.shared.weight.data_ptr()
  np.testing.assert_array_equal(m.lm_head.weight.detach().numpy().T,
                                flatten(params)["decoder/logits_dense/kernel"])
  assert_parity(m, config, params, vocab=32100)
