"""The feature-level draft (`models/feature_draft.py`) as a model: cache, rollback, shapes.

Why each test: the draft is driven by a speculative loop through its cache like any draft, so
(1) feeding entries in blocks at per-example offsets must give the teacher-forced forward's
logits and output features (a wrong slot, mask or bias would change q silently), (2) rolling
back must be an index move only (writes replace, so rewritten entries are as fresh), and (3) its
shared pieces must be the target's own and its config must round-trip as JSON.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.models.model_config import get_preset
from specdec_jax.models.feature_draft import FeatureDraft
from specdec_jax.models.feature_draft_config import FeatureDraftConfig
from specdec_jax.models.model import Model
from specdec_jax.seam import Encoded


def _setup(kind, head="target", emb_dim=16):
  target = Model(get_preset(f"{kind}_test_target"))
  tp = target.init(jax.random.key(0))
  draft = FeatureDraft(FeatureDraftConfig.for_target(target.config, emb_dim=emb_dim, num_heads=2,
                                                     mlp_dim=32, head=head))
  dp = draft.with_target_pieces(draft.init(jax.random.key(1)), tp)
  prompts = jnp.asarray([[5, 6, 7, 1], [9, 10, 1, 0], [3, 1, 0, 0]], jnp.int32)
  encoded = target.encode(tp, prompts) if kind == "t5" else None
  return draft, dp, prompts, encoded


def _entries(draft, rng, b=3, t=12):
  tokens = jnp.asarray(rng.integers(2, 64, (b, t)), jnp.int32)
  g = jnp.asarray(rng.normal(size=(b, t, draft.width)), jnp.float32)
  return tokens, g


@pytest.mark.parametrize("kind,head", (("t5", "target"), ("t5", "own"), ("decoder", "target")))
@pytest.mark.parametrize("block", (1, 4))
def test_cached_extend_matches_full_forward(kind, head, block):
  draft, dp, prompts, encoded = _setup(kind, head)
  tokens, g = _entries(draft, np.random.default_rng(0))
  full_logits, full_out = draft.forward(dp, prompts, tokens, g, encoded=encoded)
  cache = draft.prefill(dp, prompts, 16, encoded=encoded).rollback(jnp.zeros(3, jnp.int32))
  # Each example at its own offset: feed 4 entries, keep 4, 2, 1 of them.
  _, _, cache = draft.extend_features(dp, cache, tokens[:, :4], g[:, :4])
  starts = np.array([4, 2, 1])
  cache = cache.rollback(jnp.asarray(starts))
  take = lambda x: jnp.stack([x[b, s:s + 8] for b, s in enumerate(starts)])  # noqa: E731
  step = jax.jit(draft.extend_features)
  outs, feats = [], []
  for s in range(0, 8, block):
    logits, out, cache = step(dp, cache, take(tokens)[:, s:s + block], take(g)[:, s:s + block])
    outs.append(logits)
    feats.append(out)
  np.testing.assert_allclose(np.concatenate(outs, 1), take(full_logits), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.concatenate(feats, 1), take(full_out), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(cache.index_B), starts + 8)


@pytest.mark.parametrize("kind", ("t5", "decoder"))
def test_rollback_is_an_index_move(kind):
  draft, dp, prompts, encoded = _setup(kind)
  rng = np.random.default_rng(1)
  tokens, g = _entries(draft, rng, t=6)
  other, g2 = _entries(draft, rng, t=3)
  cache = draft.prefill(dp, prompts, 12, encoded=encoded)
  base = cache.index_B
  _, _, cache = draft.extend_features(dp, cache, tokens, g)
  moved = cache.rollback(base + 3)
  assert jax.tree.structure(moved) == jax.tree.structure(cache)
  for a, b in zip(jax.tree.leaves(moved.self_kv), jax.tree.leaves(cache.self_kv)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # nothing but the index moved
  got, _, _ = draft.extend_features(dp, moved, other, g2)
  fresh = draft.prefill(dp, prompts, 12, encoded=encoded)
  _, _, fresh = draft.extend_features(dp, fresh, tokens[:, :3], g[:, :3])
  want, _, _ = draft.extend_features(dp, fresh, other, g2)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_shared_pieces_config_and_refusals():
  target = Model(get_preset("t5_test_target"))
  tp = target.init(jax.random.key(0))
  cfg = FeatureDraftConfig.for_target(target.config)
  assert cfg.feature_layers == (0, 1, 2) and cfg.source_dim == 32 and cfg.target_dim == 32
  assert FeatureDraftConfig.from_json(cfg.to_json()) == cfg
  draft = FeatureDraft(cfg.replace(emb_dim=16))
  dp = draft.with_target_pieces(draft.init(jax.random.key(1)), tp)
  assert dp["logits_dense"] is tp["decoder"]["logits_dense"]
  assert dp["head_projection"]["kernel"].shape == (16, 32)  # narrower block: projected up first
  assert draft.frozen_names() == ("token_embedder", "decoder_norm", "logits_dense")
  hidden = jnp.zeros((2, 3, 3, 32))
  assert draft.fuse(dp, hidden).shape == (2, 3, 16)
  with pytest.raises(TypeError, match="extend_features"):
    draft.extend(dp, None, None)
  with pytest.raises(ValueError, match="encoder output"):
    draft.prefill(dp, jnp.ones((1, 2), jnp.int32), 8)
  with pytest.raises(ValueError, match="source_dim"):
    FeatureDraftConfig(kind="decoder", source_dim=8)
  enc = Encoded(jnp.zeros((1, 2, 32)), jnp.ones((1, 2), bool))
  assert draft.prefill(dp, jnp.ones((1, 2), jnp.int32), 8, encoded=enc).length == 8


def test_a_tied_targets_head_is_its_embedding_table():
  """SmolLM2 and Llama-3.2 have no `logits_dense`: the frozen head a feature draft reads is the
  target's table, transposed (the draft's logits of a state h are norm(h) @ table.T, as the
  target's own head computes them); the block's norm epsilon is the target's."""
  cfg = get_preset("decoder_test_target").replace(tie_embeddings=True, layer_norm_epsilon=1e-5)
  target = Model(cfg)
  tp = target.init(jax.random.key(0))
  assert "logits_dense" not in tp["decoder"]
  draft = FeatureDraft(FeatureDraftConfig.for_target(cfg, num_heads=2, mlp_dim=32))
  assert draft.config.layer_norm_epsilon == 1e-5 and draft.config.emb_dim == cfg.emb_dim
  dp = draft.with_target_pieces(draft.init(jax.random.key(1)), tp)
  table_VxD = np.asarray(tp["token_embedder"]["embedding"])
  np.testing.assert_array_equal(np.asarray(dp["logits_dense"]["kernel"]), table_VxD.T)
  h = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, cfg.emb_dim)), jnp.float32)
  apply = lambda fn: np.asarray(draft.module.apply({"params": dp}, h, method=fn))  # noqa: E731
  want = np.einsum("btd,vd->btv", apply(lambda m, x: m.decoder_norm(x)), table_VxD)
  np.testing.assert_allclose(apply(lambda m, x: m.logits(x)), want, rtol=1e-5, atol=1e-5)


def test_a_gemma_style_final_norm_is_refused_for_the_targets_head():
  """Gemma's final norm multiplies by (1 + scale) and the draft's copy has no offset: its head
  would be another head than the target's (and an offline teacher another distribution)."""
  gemma = get_preset("llama_test_target", norm_offset=1.0)
  with pytest.raises(ValueError, match="norm_offset 1"):
    FeatureDraftConfig.for_target(gemma)
  assert FeatureDraftConfig.for_target(gemma, head="own").head == "own"
