"""A self-draft (the target's own architecture, e.g. its checkpoint in int8 panels) starts from the
target's cache of the prompt (`TokenDrafter.prompt_cache`), and stays exact.

Why: a self-draft's own prefill costs as much as the target's (each SmolLM2 summary's prompt
twice), so 'auto' hands it the target's cache instead; the draft's cache must then BE the
target's after the prompt (not a copy of the wrong slots, not its own prefill), its later entries
its own, and the outputs the target's: greedy token for token, sampled by the chi-square test.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import draft_schemes
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.drafter import TokenDrafter
from specdec_jax.decoding.prompt_cache import is_self_draft
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model import Model
from specdec_jax.models.model_config import get_preset
from specdec_jax.testing import law_pvalue, tiny_pair

GREEDY = SamplingConfig(temperature=0.0)
PROMPTS = np.array([[5, 6, 7, 8, 9, 3], [9, 10, 11, 0, 0, 0], [4, 3, 0, 0, 0, 0]], np.int32)


def _self_pair(kind="llama", noise=0.05):
  """(target, its params, the same model, its params perturbed): a self-draft that is not the
  target itself, so its q differs and acceptance is partial."""
  target, tp, _, _ = tiny_pair(kind)
  leaves, tree = jax.tree_util.tree_flatten(tp)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  dp = jax.tree_util.tree_unflatten(tree, [
      x + noise * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
      for x, k in zip(leaves, keys)])
  return target, tp, target, dp


def _caches_equal(a, b) -> bool:
  return all(np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_auto_gives_a_self_draft_the_targets_prompt_cache_and_others_their_own(kind):
  target, tp, draft, dp = _self_pair(kind)
  assert is_self_draft(target, draft)
  inputs = jnp.asarray(PROMPTS if kind == "llama" else PROMPTS[:, :5], jnp.int32)
  params = Params(tp, dp)
  shared = Decoder(target, draft, Chain(3), GREEDY, max_decode_len=8).init(
      params, inputs, jax.random.key(0))
  assert _caches_equal(shared.draft_cache, shared.target_cache)
  own = Decoder(target, draft, Chain(3), GREEDY, max_decode_len=8,
                drafter=TokenDrafter(prompt_cache="own")).init(params, inputs, jax.random.key(0))
  assert not _caches_equal(own.draft_cache, own.target_cache)  # its own (perturbed) prefill
  np.testing.assert_array_equal(np.asarray(own.draft_cache.index_B),
                                np.asarray(shared.draft_cache.index_B))
  # A smaller draft (another architecture) keeps its own prefill under 'auto'.
  small, sp, other, op = tiny_pair(kind)
  assert not is_self_draft(small, other)
  state = Decoder(small, other, Chain(3), GREEDY, max_decode_len=8).init(
      Params(sp, op), inputs, jax.random.key(0))
  assert _caches_equal(state.draft_cache,
                       other.prefill(op, inputs, state.draft_cache.length))


@pytest.mark.parametrize("prompt_cache", ["auto", "own", "target", "shared"])
def test_greedy_self_draft_equals_autoregressive(prompt_cache):
  target, tp, draft, dp = _self_pair()
  inputs = jnp.asarray(PROMPTS, jnp.int32)
  ar = Decoder(target, sampling=GREEDY, max_decode_len=14).generate(Params(tp), inputs)
  spec = Decoder(target, draft, Chain(3), GREEDY, max_decode_len=14,
                 drafter=TokenDrafter(prompt_cache=prompt_cache)).generate(Params(tp, dp), inputs)
  np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(spec.lengths_B), np.asarray(ar.lengths_B))
  counters = spec.counters
  assert 0 < int(np.sum(counters.accepted_B)) < int(np.sum(counters.drafted_B))


@pytest.mark.parametrize("prompt_cache", ["target", "shared"])
def test_self_draft_from_the_targets_cache_samples_the_targets_distribution(prompt_cache):
  """Chi-square over every 3-token continuation (vocabulary 6), T = 1: the draft reads the
  target's cache of the prompt ('target') or drafts in it ('shared'), its q is its own
  (perturbed weights), the law the target's."""
  cfg = get_preset("decoder_test_draft", vocab_size=6, emb_dim=16, num_decoder_layers=1,
                   eos_id=-1)
  target = Model(cfg)
  tp = jax.tree_util.tree_map(lambda x: 2.0 * x, target.init(jax.random.key(11)))
  dp = jax.tree_util.tree_map(lambda x, y: x + 0.5 * y, tp, target.init(jax.random.key(12)))
  assert is_self_draft(target, target)
  p, out = law_pvalue((target, tp, target, dp), SamplingConfig(temperature=1.0), Chain(2),
                      np.array([3, 5, 2], np.int32), 3, 100_000,
                      drafter=TokenDrafter(prompt_cache=prompt_cache))
  assert p > 1e-3, p
  accepted, drafted = int(np.sum(out.counters.accepted_B)), int(np.sum(out.counters.drafted_B))
  assert 0.2 * drafted < accepted < 0.98 * drafted  # q is not p: the test has something to do


def test_prompt_cache_target_refuses_a_draft_laid_out_otherwise():
  target, tp, draft, dp = tiny_pair("decoder")
  with pytest.raises(ValueError, match="laid out as the target's"):
    Decoder(target, draft, Chain(2), GREEDY, drafter=TokenDrafter(prompt_cache="target"))
  with pytest.raises(ValueError, match="prompt_cache must be one of"):
    Decoder(target, draft, Chain(2), GREEDY, drafter=TokenDrafter(prompt_cache="nope"))
  with pytest.raises(ValueError, match="laid out as the target's"):
    Decoder(target, draft, Chain(2), GREEDY, drafter=TokenDrafter(prompt_cache="shared"))
  # The same layers, heads and widths but another MLP: the cache fits ('target' allowed), but
  # it is not a self-draft, so 'auto' keeps its own prefill.
  wide = Model(dataclasses.replace(target.config, mlp_dim=2 * target.config.mlp_dim))
  assert not is_self_draft(target, wide)
  Decoder(target, wide, Chain(2), GREEDY, drafter=TokenDrafter(prompt_cache="target"))


def test_plan_builds_the_prompt_cache_option_for_token_drafts_only():
  target, _, draft, _ = tiny_pair("decoder")
  assert draft_schemes.plan(draft, 3) == (Chain(3), None)
  assert draft_schemes.plan(draft, 3, prompt_cache="own") == (Chain(3), TokenDrafter("own"))
