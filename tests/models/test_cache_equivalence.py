"""Cached decoding must give the full forward pass's logits, wherever each example sits.

Why: speculative decoding feeds the target blocks of gamma + 1 tokens and the draft single tokens,
then rolls the caches back; any error in write positions, masks or relative-position buckets at
an offset would silently change the distribution the acceptance rule compares.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.testing import ragged_prompts, tiny_pair

BLOCKS = (1, 4)  # a draft step (T = 1) and a verification block (T = gamma + 1 with gamma 3)


def _extend_in_blocks(model, params, cache, tokens_BxT, block):
  outs = []
  extend = jax.jit(model.extend)
  for s in range(0, tokens_BxT.shape[1], block):
    logits, cache = extend(params, cache, tokens_BxT[:, s:s + block])
    outs.append(logits)
  return jnp.concatenate(outs, axis=1), cache


@pytest.mark.parametrize("block", BLOCKS)
def test_t5_extend_matches_full_forward_at_ragged_offsets(block):
  model, params, _, _ = tiny_pair("t5")
  rng = np.random.default_rng(0)
  inputs = np.array([[5, 6, 7, 8, 1], [9, 10, 1, 0, 0], [3, 1, 0, 0, 0], [11, 12, 13, 1, 0]])
  seq_BxT = jnp.asarray(np.concatenate([np.zeros((4, 1), int),
                                        rng.integers(2, 64, (4, 12))], axis=1), jnp.int32)
  full = jax.jit(model.forward)(params, jnp.asarray(inputs), seq_BxT)
  # Put every example at its own position: feed 4 tokens, then roll back to 4, 2, 1, 3.
  starts = np.array([4, 2, 1, 3])
  cache = jax.jit(model.prefill, static_argnums=2)(params, jnp.asarray(inputs), 24)
  _, cache = jax.jit(model.extend)(params, cache, seq_BxT[:, :4])
  cache = cache.rollback(jnp.asarray(starts))
  rest = np.stack([np.asarray(seq_BxT)[b, s:s + 8] for b, s in enumerate(starts)])
  got, _ = _extend_in_blocks(model, params, cache, jnp.asarray(rest), block)
  want = np.stack([np.asarray(full)[b, s:s + 8] for b, s in enumerate(starts)])
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", BLOCKS)
def test_decoder_extend_matches_full_forward_with_ragged_prompts(block):
  model, params, _, _ = tiny_pair("decoder")
  lengths = [6, 3, 1, 5]
  seqs, prompts = ragged_prompts(lengths, extra=8)
  cache = jax.jit(model.prefill, static_argnums=2)(params, jnp.asarray(prompts), 32)
  np.testing.assert_array_equal(np.asarray(cache.index_B), np.array(lengths) - 1)
  # From the start token (last prompt token) on, feed 8 tokens per example.
  feed = np.stack([s[n - 1:n + 7] for s, n in zip(seqs, lengths)])
  got, _ = _extend_in_blocks(model, params, cache, jnp.asarray(feed), block)
  # One full forward over the right-padded sequences: causal, so padding cannot leak backwards.
  padded = np.zeros((4, max(lengths) + 7), np.int32)
  for b, (s, n) in enumerate(zip(seqs, lengths)):
    padded[b, :n + 7] = s[:n + 7]
  full = np.asarray(jax.jit(model.forward)(params, None, jnp.asarray(padded)))
  for b, n in enumerate(lengths):
    np.testing.assert_allclose(np.asarray(got[b]), full[b, n - 1:n + 7], rtol=1e-5, atol=1e-5)


def test_full_forward_is_causal():
  """Changing a later token must not change earlier logits (the reference itself is sound)."""
  model, params, _, _ = tiny_pair("decoder")
  seq = jnp.asarray(np.arange(2, 14)[None], jnp.int32)
  a = model.forward(params, None, seq)
  b = model.forward(params, None, seq.at[0, 8].set(40))
  np.testing.assert_array_equal(np.asarray(a[0, :8]), np.asarray(b[0, :8]))
  assert not np.allclose(np.asarray(a[0, 8:]), np.asarray(b[0, 8:]))
