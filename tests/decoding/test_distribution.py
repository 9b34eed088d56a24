"""Speculative sampling must reproduce the target's processed distribution exactly.

Why: this is the whole promise of the method (Leviathan et al. Theorem 3.5). With a small
vocabulary the exact probability of every 3-token continuation is enumerable from the target's
uncached forward pass, so 100k vectorised samples are tested against the truth by a chi-square
goodness-of-fit test, not merely against another sampler. Seeds are fixed, so the test is
deterministic; the threshold 1e-3 is the false-alarm rate it would have with a fresh seed.
The last test shows the test has power: sampling the correction from p instead of the residual
norm(max(0, p - q)) is rejected with an astronomically small p-value.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import acceptance
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig, sample
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model
from specdec_jax.testing import chi_square_gof, exact_joint

V = 6
NUM_TOKENS = 3
NUM_SAMPLES = 100_000
PROMPT = np.array([3, 5, 2], np.int32)
CONFIGS = {
    "t1": SamplingConfig(temperature=1.0),
    "t0.7_topk4": SamplingConfig(temperature=0.7, top_k=4),
    "topp0.8": SamplingConfig(temperature=1.0, top_p=0.8),
}


@pytest.fixture(scope="module")
def models():
  """A 1-layer target and a differently initialised draft, vocabulary 6, sharp enough logits
  that p and q differ a lot (so a wrong residual is visible)."""
  # eos_id -1: no token ends a sample, so every sample has exactly NUM_TOKENS tokens.
  cfg = get_preset("decoder_test_draft", vocab_size=V, emb_dim=16, num_decoder_layers=1,
                   eos_id=-1)
  target, draft = Model(cfg), Model(cfg.replace(mlp_dim=16))
  tp = jax.tree_util.tree_map(lambda x: 2.0 * x, target.init(jax.random.key(11)))
  dp = draft.init(jax.random.key(12))
  return target, tp, draft, dp


def _counts(tokens_BxN):
  flat = np.ravel_multi_index(np.asarray(tokens_BxN[:, :NUM_TOKENS]).T, (V,) * NUM_TOKENS)
  return np.bincount(flat, minlength=V ** NUM_TOKENS)


def _spec_counts(models, sampling, rule="tokenwise", gamma=2, seed=0):
  target, tp, draft, dp = models
  inputs = jnp.asarray(np.broadcast_to(PROMPT, (NUM_SAMPLES, len(PROMPT))))
  decoder = Decoder(target, draft, Chain(gamma), sampling, rule=rule, max_decode_len=NUM_TOKENS)
  out = decoder.generate(Params(tp, dp), inputs, jax.random.key(seed))
  assert np.all(np.asarray(out.lengths_B) == NUM_TOKENS)
  return _counts(out.tokens_BxN)


def _exact(models, sampling):
  target, tp, _, _ = models
  return exact_joint(target, tp, PROMPT, NUM_TOKENS, sampling).ravel()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_speculative_matches_exact_target_distribution(models, name):
  sampling = CONFIGS[name]
  probs = _exact(models, sampling)
  counts = _spec_counts(models, sampling)
  stat, dof, pvalue = chi_square_gof(counts, probs)
  tv = 0.5 * np.abs(counts / counts.sum() - probs).sum()
  assert pvalue > 1e-3, f"{name}: chi2={stat:.1f} dof={dof} p={pvalue:.2e} TV={tv:.4f}"


def test_autoregressive_matches_exact_target_distribution(models):
  """The baseline sampler and the enumeration agree (validates the reference itself)."""
  target, tp, _, _ = models
  sampling = CONFIGS["t1"]
  inputs = jnp.asarray(np.broadcast_to(PROMPT, (NUM_SAMPLES, len(PROMPT))))
  out = Decoder(target, sampling=sampling, max_decode_len=NUM_TOKENS).generate(
      Params(tp), inputs, jax.random.key(1))
  _, _, pvalue = chi_square_gof(_counts(out.tokens_BxN), _exact(models, sampling))
  assert pvalue > 1e-3


def _broken_tokenwise(key, draft_tokens, draft_probs, target_probs):
  """Tokenwise with the classic bug: the correction is sampled from p, not the residual."""
  n_B, _ = acceptance.tokenwise(key, draft_tokens, draft_probs, target_probs)
  p_n = jnp.take_along_axis(target_probs, n_B[:, None, None], axis=1)[:, 0]
  return n_B, sample(jax.random.fold_in(key, 1), p_n)


def test_broken_residual_is_detected(models, monkeypatch):
  monkeypatch.setitem(acceptance.ACCEPTANCE_RULES, "broken_residual", _broken_tokenwise)
  sampling = CONFIGS["t1"]
  counts = _spec_counts(models, sampling, rule="broken_residual")
  _, _, pvalue = chi_square_gof(counts, _exact(models, sampling))
  assert pvalue < 1e-6


def test_modern_family_speculative_matches_exact_target_distribution():
  """The same test with nucleus sampling (Chen et al.'s top-p 0.8) for a llama-style pair: rotary
  positions, grouped-query attention, SwiGLU; the draft tied, with q/k/v biases."""
  cfg = get_preset("llama_test_draft", vocab_size=V, num_heads=2, num_kv_heads=1, eos_id=-1,
                   tie_embeddings=False)
  target, draft = Model(cfg), Model(cfg.replace(tie_embeddings=True, qkv_bias=True, mlp_dim=16))
  tp = target.init(jax.random.key(21))  # top-p keeps 56 of the 216 continuations; alpha ~0.1
  dp = jax.tree_util.tree_map(lambda x: x + 0.1, draft.init(jax.random.key(22)))
  pair = (target, tp, draft, dp)
  sampling = CONFIGS["topp0.8"]
  probs = _exact(pair, sampling)
  counts = _spec_counts(pair, sampling)
  stat, dof, pvalue = chi_square_gof(counts, probs)
  assert pvalue > 1e-3, f"chi2={stat:.1f} dof={dof} p={pvalue:.2e}"
  assert 0.5 * np.abs(counts / counts.sum() - probs).sum() < 0.01
