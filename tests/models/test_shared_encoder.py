"""Shared-encoder drafts: a decoder over the TARGET's encoder output, behind the same seam.

Why each test: the draft's cross-attention reads states it did not compute, so (1) its cache must
still equal its full forward pass, (2) greedy speculative decoding with it must reproduce the
target token for token, (3) speculative sampling with it must keep the target's distribution
exactly, and (4) it must refuse a target whose encoder it was not trained on, because a foreign
encoder of the same width runs without any error and only drafts noise.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.checkpoints import pairing
from specdec_jax import seam
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig, process_logits
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model_config import ModelConfig, get_preset
from specdec_jax.models.model import Model
from specdec_jax.testing import chi_square_gof, ragged_prompts


@pytest.fixture(scope="module")
def pair():
  target = Model(get_preset("t5_test_target"))
  draft = Model(get_preset("t5_test_shared_draft"))
  return target, target.init(jax.random.key(0)), draft, draft.init(jax.random.key(1))


def test_config_and_params():
  cfg = get_preset("t5_test_shared_draft")
  assert cfg.shares_encoder and cfg.num_encoder_layers == 0
  params = Model(cfg).init(jax.random.key(0))
  assert "encoder" not in params and params["source_projection"]["kernel"].shape == (32, 16)
  assert cfg.num_params() == sum(x.size for x in jax.tree.leaves(params))
  same_width = cfg.replace(source_dim=16)  # no projection when the widths agree
  p2 = Model(same_width).init(jax.random.key(0))
  assert "source_projection" not in p2
  assert same_width.num_params() == sum(x.size for x in jax.tree.leaves(p2))
  with pytest.raises(ValueError, match="num_encoder_layers must be 0"):
    cfg.replace(num_encoder_layers=1)
  with pytest.raises(ValueError, match="needs kind 't5'"):
    ModelConfig(kind="decoder", num_encoder_layers=0, source_dim=8)
  assert ModelConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("block", (1, 4))
def test_cached_extend_matches_full_forward(pair, block):
  target, tp, draft, dp = pair
  seqs, prompts = ragged_prompts([5, 2, 4], extra=0)
  prompts = jnp.asarray(prompts)
  encoded = jax.jit(target.encode)(tp, prompts)
  dec = jnp.asarray(np.random.default_rng(0).integers(2, 64, (3, 12)), jnp.int32)
  dec = dec.at[:, 0].set(0)
  full = draft.forward(dp, prompts, dec, encoded=encoded)
  cache = draft.prefill(dp, prompts, 16, encoded=encoded)
  outs, extend = [], jax.jit(draft.extend)
  for s in range(0, 12, block):
    logits, cache = extend(dp, cache, dec[:, s:s + block])
    outs.append(logits)
  np.testing.assert_allclose(np.concatenate(outs, axis=1), full, atol=2e-5, rtol=2e-5)


def test_target_prefill_with_its_own_encoded_is_unchanged(pair):
  """`init_state` hands the target its own `encode` output: the cache must be the same."""
  target, tp, _, _ = pair
  _, prompts = ragged_prompts([5, 3], extra=0)
  prompts = jnp.asarray(prompts)
  a = target.prefill(tp, prompts, 8)
  b = target.prefill(tp, prompts, 8, encoded=target.encode(tp, prompts))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, atol=1e-6)


@pytest.mark.parametrize("gamma", (1, 3))
def test_greedy_speculative_equals_autoregressive(pair, gamma):
  target, tp, draft, dp = pair
  _, prompts = ragged_prompts([6, 3, 5, 1], extra=0, seed=3)
  greedy = SamplingConfig(temperature=0.0)
  ar = Decoder(target, sampling=greedy, max_decode_len=16).generate(Params(tp), prompts)
  sp = Decoder(target, draft, Chain(gamma), greedy, max_decode_len=16).generate(
      Params(tp, dp), prompts)
  np.testing.assert_array_equal(sp.tokens_BxN, ar.tokens_BxN)
  np.testing.assert_array_equal(sp.lengths_B, ar.lengths_B)


def test_missing_encoded_and_wrong_pairs_are_refused(pair):
  target, tp, draft, dp = pair
  prompts = jnp.asarray([[5, 6, 1]], jnp.int32)
  with pytest.raises(ValueError, match="shared-encoder draft"):
    draft.prefill(dp, prompts, 8)
  with pytest.raises(ValueError, match="shared-encoder draft"):
    draft.forward(dp, prompts, prompts)
  with pytest.raises(ValueError, match="cannot decode alone"):
    Decoder(draft, sampling=SamplingConfig(), max_decode_len=4).generate(Params(dp), prompts)
  wide = Model(get_preset("t5_test_shared_draft", source_dim=48))
  with pytest.raises(ValueError, match="width 48 but the target's encoder is 32"):
    seam.check_pair(target, wide)
  with pytest.raises(ValueError, match="target is a shared-encoder draft"):
    seam.check_pair(draft, draft)


def test_pairing_record_accepts_its_target_and_refuses_another(pair, tmp_path):
  target, tp, _, _ = pair
  pairing.write(str(tmp_path), target_name="my_target", target_config=target.config,
                target_params=tp)
  pairing.check(str(tmp_path), draft_name="d", target_name="my_target", target_params=tp)
  # Stored in bfloat16, run in float32: the same encoder.
  rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), tp)
  pairing.check(str(tmp_path), draft_name="d", target_name="my_target", target_params=rounded)
  other = target.init(jax.random.key(7))  # same shapes, another encoder
  with pytest.raises(ValueError, match="trained on the encoder of 'my_target'.*another encoder"):
    pairing.check(str(tmp_path), draft_name="d", target_name="other", target_params=other)
  with pytest.raises(ValueError, match="has no paired_target.json"):
    pairing.check(str(tmp_path / "nothing"), draft_name="d", target_name="t", target_params=tp)


# ---- exactness: the distribution test with a shared-encoder draft ------------------------------
V, NUM_TOKENS, NUM_SAMPLES = 6, 3, 100_000
PROMPT = np.array([3, 5, 2, 1], np.int32)


def _t5_exact_joint(model, params, num_tokens, sampling):
  """P(every continuation) of a T5 target, from its uncached forward pass (BOS = 0 first)."""
  seqs = np.array(list(itertools.product(range(V), repeat=num_tokens)), np.int32)
  enc = jnp.asarray(np.broadcast_to(PROMPT, (len(seqs), len(PROMPT))))
  dec = jnp.asarray(np.concatenate([np.zeros((len(seqs), 1), np.int32), seqs[:, :-1]], axis=1))
  probs = process_logits(model.forward(params, enc, dec), sampling)
  step = np.take_along_axis(np.asarray(probs, np.float64), seqs[..., None], axis=-1)[..., 0]
  return np.prod(step, axis=1)


@pytest.mark.parametrize("temperature", (1.0, pytest.param(0.7, marks=pytest.mark.slow)))
def test_speculative_sampling_with_shared_encoder_draft_is_exact(temperature):
  base = dict(vocab_size=V, eos_id=-1)
  target = Model(get_preset("t5_test_target", num_encoder_layers=1, num_decoder_layers=1, **base))
  draft = Model(get_preset("t5_test_shared_draft", **base))
  tp = jax.tree.map(lambda x: 2.0 * x, target.init(jax.random.key(11)))  # sharp p
  dp = jax.tree.map(lambda x: 2.0 * x, draft.init(jax.random.key(12)))  # q far from p
  sampling = SamplingConfig(temperature=temperature)
  inputs = jnp.asarray(np.broadcast_to(PROMPT, (NUM_SAMPLES, len(PROMPT))))
  out = Decoder(target, draft, Chain(2), sampling, max_decode_len=NUM_TOKENS).generate(
      Params(tp, dp), inputs, jax.random.key(0))
  assert np.all(np.asarray(out.lengths_B) == NUM_TOKENS)
  accepted, drafted = np.sum(out.counters.accepted_B), np.sum(out.counters.drafted_B)
  assert 0 < accepted < drafted  # both branches of the rule are exercised
  flat = np.ravel_multi_index(np.asarray(out.tokens_BxN[:, :NUM_TOKENS]).T, (V,) * NUM_TOKENS)
  counts = np.bincount(flat, minlength=V ** NUM_TOKENS)
  stat, dof, pvalue = chi_square_gof(counts, _t5_exact_joint(target, tp, NUM_TOKENS, sampling))
  assert pvalue > 1e-3, f"chi2={stat:.1f} dof={dof} p={pvalue:.2e}"
