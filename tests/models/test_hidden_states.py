"""The target's hidden states for feature-level drafts (`Model.extend_with_hidden`).

Why each test: a feature-level draft reads the target's residual stream at chosen layers from the
verify call itself, so (1) that call's logits must be `extend`'s exactly (it IS the verify call:
a different number would change what the acceptance rule compares), and (2) its states must be
the ones the full teacher-forced forward computes at every fed position, at any cache offset
(an off-by-one between a feature's position and its token silently halves acceptance).
The reference states are Flax's captured intermediates of the plain forward, not this code path.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.testing import ragged_prompts, tiny_pair

LAYERS = (0, 1, 2)  # the test targets have two decoder layers: embeddings, middle, last


def _reference_hidden(model, params, inputs, tokens_BxT):
  """[B, T, 3, D] from the full forward's captured intermediates (layer outputs, embeddings)."""
  _, state = model.module.apply({"params": params}, inputs, tokens_BxT,
                                capture_intermediates=True, mutable=["intermediates"])
  inter = state["intermediates"]
  emb = model.module.apply({"params": params}, tokens_BxT,
                           method=lambda m, t: m.token_embedder(t))
  outs = [inter["decoder"][f"layers_{i}"]["__call__"][0][0] for i in range(2)]
  return jnp.stack([emb] + outs, axis=2)


@pytest.mark.parametrize("kind", ("t5", "decoder"))
@pytest.mark.parametrize("block", (1, 4))
def test_hidden_matches_full_forward_and_logits_match_extend(kind, block):
  model, params, _, _ = tiny_pair(kind)
  seqs, prompts = ragged_prompts([5, 2, 4], extra=8)
  if kind == "t5":
    inputs = jnp.asarray(prompts)
    feed = np.concatenate([np.zeros((3, 1), np.int32),
                           np.stack([s[-8:] for s in seqs]).astype(np.int32)], axis=1)
    ref_tokens, offset = feed, [0, 0, 0]
  else:
    inputs = jnp.asarray(prompts)
    feed = np.stack([s[n - 1:n + 7] for s, n in zip(seqs, [5, 2, 4])]).astype(np.int32)
    ref_tokens = np.zeros((3, 12), np.int32)
    for b, (s, n) in enumerate(zip(seqs, [5, 2, 4])):
      ref_tokens[b, :n + 7] = s[:n + 7]
    offset = [4, 1, 3]
  want = np.asarray(_reference_hidden(model, params, inputs, jnp.asarray(ref_tokens)))
  cache = jax.jit(model.prefill, static_argnums=2)(params, inputs, 24)
  cache_plain = cache
  ext_h = jax.jit(model.extend_with_hidden, static_argnums=3)
  ext = jax.jit(model.extend)
  for s in range(0, 8, block):
    chunk = jnp.asarray(feed[:, s:s + block])
    logits, hidden, cache = ext_h(params, cache, chunk, LAYERS)
    plain, cache_plain = ext(params, cache_plain, chunk)
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(plain))
    assert hidden.shape == (3, chunk.shape[1], 3, model.config.emb_dim)
    for b, o in enumerate(offset):
      np.testing.assert_allclose(np.asarray(hidden[b]), want[b, o + s:o + s + block],
                                 rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ("t5", "decoder"))
def test_forward_with_hidden_is_forward(kind):
  model, params, _, _ = tiny_pair(kind)
  _, prompts = ragged_prompts([5, 2, 4], extra=0)
  tokens = jnp.asarray(np.random.default_rng(0).integers(2, 64, (3, 7)), jnp.int32)
  logits, hidden = model.forward_with_hidden(params, jnp.asarray(prompts), tokens, (2, 0))
  np.testing.assert_array_equal(np.asarray(logits),
                                np.asarray(model.forward(params, jnp.asarray(prompts), tokens)))
  want = _reference_hidden(model, params, jnp.asarray(prompts), tokens)
  np.testing.assert_allclose(np.asarray(hidden), np.asarray(want[:, :, (2, 0)]), atol=1e-5)


def test_layer_out_of_range_is_refused():
  model, params, _, _ = tiny_pair("decoder")
  cache = model.prefill(params, jnp.ones((1, 2), jnp.int32), 8)
  with pytest.raises(ValueError, match="out of range"):
    model.extend_with_hidden(params, cache, jnp.ones((1, 1), jnp.int32), (3,))


def test_prefill_with_hidden_is_prefill_with_the_prompt_states():
  """The decoder-only prefill that also gives the prompt's states (a feature draft's start,
  `decoding.feature_entries.prime_carry`): the same cache as `prefill`, and each real prompt slot's states
  the full forward's."""
  model, params, _, _ = tiny_pair("decoder")
  lengths = [5, 2, 4, 1]
  seqs, prompts = ragged_prompts(lengths, extra=0)
  inputs = jnp.asarray(prompts)
  cache, hidden = jax.jit(model.prefill_with_hidden, static_argnums=(2, 3))(
      params, inputs, 16, LAYERS)
  plain = jax.jit(model.prefill, static_argnums=2)(params, inputs, 16)
  np.testing.assert_array_equal(np.asarray(cache.index_B), np.asarray(plain.index_B))
  for got, want in zip(jax.tree.leaves(cache), jax.tree.leaves(plain)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert hidden.shape == (4, inputs.shape[1] - 1, 3, model.config.emb_dim)
  want = np.asarray(_reference_hidden(model, params, inputs, inputs))
  for b, n in enumerate(lengths):
    np.testing.assert_allclose(np.asarray(hidden[b, :n - 1]), want[b, :n - 1], atol=1e-5)
  _, one = model.prefill_with_hidden(params, inputs[:, :1], 16, LAYERS)
  assert one.shape == (4, 0, 3, model.config.emb_dim)
  t5, t5_params, _, _ = tiny_pair("t5")
  with pytest.raises(ValueError, match="decoder-only"):
    t5.prefill_with_hidden(t5_params, inputs, 16, LAYERS)
