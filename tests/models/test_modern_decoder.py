"""The modern decoder family (Llama / Qwen2 / Gemma options of the decoder-only kind).

Why: rotary positions are applied to keys before they are cached, grouped-query attention folds
query heads into one product over fewer cached heads, and a tied head reads the embedding; each is
a place where a cached extend at a ragged per-example offset could silently differ from the full
forward pass the acceptance rule's p is defined by.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.checkpoints.tree import expected_shapes, flatten, to_layout, unflatten
from specdec_jax.models import packed
from specdec_jax.models.model_config import ModelConfig, get_preset
from specdec_jax.models.model import Model
from specdec_jax.testing import ragged_prompts

LLAMA = get_preset("llama_test_target")
VARIANTS = {
    "llama": LLAMA,
    "llama3_scaled": LLAMA.replace(rope_scaling=(8.0, 1.0, 4.0, 16), rope_theta=500000.0),
    "qwen2": LLAMA.replace(qkv_bias=True, tie_embeddings=True, rope_theta=1e6),
    "gemma": LLAMA.replace(mlp_activation="gelu", norm_offset=1.0, scale_embeddings=True,
                           tie_embeddings=True, num_kv_heads=1),
    "mha": LLAMA.replace(num_kv_heads=0),
}
LENGTHS = [6, 3, 1, 5]


def _params(model, seed=0):
  """Random params with nonzero biases and norm scales (zeros and ones would hide mistakes)."""
  params = model.init(jax.random.key(seed))
  rng = np.random.default_rng(seed)
  return unflatten({k: (v + rng.normal(0, 0.1, v.shape).astype(np.float32)
                        if k.endswith(("bias", "scale")) else v)
                    for k, v in flatten(params).items()})


def _extended_and_full(model, params, block):
  """Logits of 8 tokens per example fed from ragged prompts in blocks, and the full forward's."""
  seqs, prompts = ragged_prompts(LENGTHS, extra=8)
  cache = jax.jit(model.prefill, static_argnums=2)(params, jnp.asarray(prompts), 32)
  feed = np.stack([s[n - 1:n + 7] for s, n in zip(seqs, LENGTHS)])
  extend, outs = jax.jit(model.extend), []
  for s in range(0, 8, block):
    logits, cache = extend(params, cache, jnp.asarray(feed[:, s:s + block]))
    outs.append(np.asarray(logits))
  padded = np.zeros((4, max(LENGTHS) + 7), np.int32)
  for b, (s, n) in enumerate(zip(seqs, LENGTHS)):
    padded[b, :n + 7] = s[:n + 7]
  full = np.asarray(jax.jit(model.forward)(params, None, jnp.asarray(padded)))
  return np.concatenate(outs, axis=1), np.stack([full[b, n - 1:n + 7]
                                                 for b, n in enumerate(LENGTHS)])


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("block", [1, 4])
def test_cached_extend_equals_full_forward(name, block):
  model = Model(VARIANTS[name])
  got, want = _extended_and_full(model, _params(model), block)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_scanned_layers_compute_the_same_logits():
  model = Model(VARIANTS["qwen2"])
  params = _params(model)
  scanned = Model(model.config.replace(scan_layers=True))
  stacked = unflatten(to_layout({k: np.asarray(v) for k, v in flatten(params).items()}, True))
  got, _ = _extended_and_full(scanned, stacked, 4)
  want, _ = _extended_and_full(model, params, 4)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_grouped_query_attention_equals_repeated_heads():
  """GQA with 4 query heads over 2 key/value heads is multi-head attention whose key/value
  heads are each repeated for their group (HF's repeat_kv)."""
  gqa = Model(LLAMA)
  assert LLAMA.kv_heads == 2 < LLAMA.num_heads
  params = _params(gqa)
  mha = Model(LLAMA.replace(num_kv_heads=0))
  flat = dict(flatten(params))
  k = LLAMA.head_dim
  for key in [p for p in flat if p.endswith(("key/kernel", "value/kernel"))]:
    w = np.asarray(flat[key]).reshape(LLAMA.emb_dim, LLAMA.kv_heads, k)
    flat[key] = np.repeat(w, 2, axis=1).reshape(LLAMA.emb_dim, LLAMA.num_heads * k)
  tokens = jnp.asarray(np.random.default_rng(3).integers(1, 64, (2, 9)), jnp.int32)
  np.testing.assert_allclose(np.asarray(gqa.forward(params, None, tokens)),
                             np.asarray(mha.forward(unflatten(flat), None, tokens)),
                             rtol=1e-5, atol=1e-5)
  cache = gqa.prefill(params, tokens, 16)
  assert cache.self_kv[0].k_BxHxKxS.shape == (2, 2, k, 16)  # the cache holds kv_heads only


@pytest.mark.parametrize("name", ["qwen2", "gemma"])
def test_packed_kernel_layout_computes_the_same_logits(name):
  model = Model(VARIANTS[name])
  params = _params(model)
  packed_model, packed_params = packed.pack(model, params, "hybrid")
  got, _ = _extended_and_full(packed_model, packed_params, 4)
  want, _ = _extended_and_full(model, params, 4)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_tree_shape_and_config_round_trip():
  for config in (*VARIANTS.values(), get_preset("llama3_1_70b"), get_preset("llama3_2_1b")):
    assert ModelConfig.from_json(config.to_json()) == config
  shapes = expected_shapes(VARIANTS["qwen2"])
  assert "decoder/logits_dense/kernel" not in shapes  # tied
  assert "decoder/relpos_bias/rel_embedding" not in shapes  # rotary
  assert shapes["decoder/layers_0/self_attention/key/kernel"] == (32, 16)
  assert shapes["decoder/layers_0/self_attention/key/bias"] == (16,)
  assert get_preset("llama3_1_70b").num_params() == 70_553_706_496
  assert get_preset("llama3_2_1b").num_params() == 1_235_814_400


@pytest.mark.parametrize("bad", [dict(position="alibi"), dict(mlp_activation="relu"),
                                 dict(num_kv_heads=3), dict(rope_scaling=(8.0,))])
def test_invalid_options_are_refused(bad):
  with pytest.raises(ValueError):
    LLAMA.replace(**bad)


def test_modern_options_are_decoder_only():
  with pytest.raises(ValueError, match="decoder-only"):
    get_preset("t5_test_target").replace(position="rope")


def test_restricted_head_of_a_tied_model_keeps_its_columns():
  from specdec_jax.models import head_vocab
  model = Model(VARIANTS["gemma"])
  params = _params(model)
  ids = (1, 5, 9, 30, 63)
  restricted, same = head_vocab.restrict(model, params, ids)
  assert same is params
  tokens = jnp.asarray([[3, 4, 5, 6]], jnp.int32)
  full = np.asarray(model.forward(params, None, tokens))
  got = np.asarray(restricted.forward(same, None, tokens))
  np.testing.assert_allclose(got[..., list(ids)], full[..., list(ids)], rtol=1e-6, atol=1e-6)
  assert np.all(np.isneginf(np.delete(got, list(ids), axis=-1)))
