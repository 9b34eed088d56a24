"""The block loss of a feature-level draft (`training/feature_blocks.py`), trained for the
parallel chain (`FeatureDrafter(parallel=True)`, `decoding/drafter.py`).

Why each test: (1) a mask entry must see exactly what the decode-time call gives it (its anchor's
prefix, the earlier masks of its own block), no other block and no later entry; (2) the training
forward's mask logits must be the very logits the parallel drafter's one draft call computes
for the same verified prefix, every anchor, every pending count, both model kinds: an off-by-one
in positions, features or the start entry trains masks for a call that never happens, and only
this test would show it; (3) a few dozen steps must lower the block KL on held-out sequences;
(4) a run selects the parallel drafter for a feature draft and feeds the mask token its config
records.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specdec_jax.decoding import start
from specdec_jax.decoding import state as st
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.draft_schemes import plan
from specdec_jax.decoding.drafter import FeatureDrafter
from specdec_jax.decoding.feature_entries import FeatureCarry, block_logits
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.feature_draft import FeatureDraft
from specdec_jax.models.feature_draft_config import FeatureDraftConfig
from specdec_jax.testing import tiny_feature_pair
from specdec_jax.training import data as data_lib
from specdec_jax.training import feature_blocks as fb
from specdec_jax.training import feature_step as fstep
from specdec_jax.training import feature_trainer as fdt
from specdec_jax.training.train_state import TrainState


TASKS = (data_lib.TaskSpec(name="translate_en_de"),)


def test_block_layout_masks_see_their_prefix_and_their_own_block():
  offsets, visible = fb.block_layout(3, 3)  # start, entries 0..2, 3 anchors x 2 masks
  assert visible.shape == (10, 10)
  assert offsets.tolist() == [0, 1, 2, 3, 1, 2, 2, 3, 3, 4]
  assert np.flatnonzero(visible[0]).tolist() == [0]  # the start entry: itself
  assert visible[1:4, 1:4].tolist() == np.tril(np.ones((3, 3), bool)).tolist()
  assert not visible[1:4, 0].any() and not visible[:4, 4:].any()
  rows = {i: np.flatnonzero(visible[i]).tolist() for i in range(4, 10)}
  assert rows == {4: [0, 4], 5: [0, 4, 5],  # anchor -1: the start entry, then its masks
                  6: [1, 6], 7: [1, 6, 7],  # anchor 0: entry 0
                  8: [1, 2, 8], 9: [1, 2, 8, 9]}  # anchor 1: entries 0..1


def _sequence(kind, vocab, t=8, batch=2, seed=0):
  """(enc, encoded, dec [B, T+1]) with y_0 the start token; enc has padding on one row."""
  rng = np.random.default_rng(seed)
  dec = rng.integers(2, vocab, (batch, t + 1)).astype(np.int32)
  if kind == "t5":
    dec[:, 0] = 0
    enc = rng.integers(2, vocab, (batch, 5)).astype(np.int32)
    enc[1, 3:] = 0
  else:
    enc = np.zeros((batch, 1), np.int32)
  return jnp.asarray(enc), jnp.asarray(dec)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _features(target, tp, draft, dp, enc, dec):
  encoded = target.encode(tp, enc) if target.config.is_encoder_decoder else None
  logits, hidden = target.forward_with_hidden(tp, enc, dec, draft.feature_layers, encoded=encoded)
  return encoded, logits, draft.fuse(dp, hidden[:, :-1])


@functools.partial(jax.jit, static_argnums=(0, 8, 9))
def _decode_call(draft, dp, enc, encoded, dec, g, anchor, count, gamma, mask_id):
  """The parallel chain's one draft call when entry `anchor` is the last verified one and the
  `count` before it (itself included) are pending; anchor -1: the first iteration (count 0)."""
  b, t = dec.shape[0], dec.shape[1] - 1
  cache = draft.prefill(dp, enc, t + 2 * gamma, encoded=encoded).rollback(jnp.zeros(b, jnp.int32))
  _, _, cache = draft.extend_features(dp, cache, dec[:, 1:], g)  # entry e at slot e
  i_P = jnp.arange(gamma + 1)
  src_P = jnp.clip(anchor + 1 - count + i_P, 0, t - 1)
  pending = jnp.where((i_P < count)[None, :, None], g[:, src_P], 0.0)
  state = st.DecodeState(
      tokens_BxL=jnp.pad(dec, ((0, 0), (0, 2 * gamma))), num_B=jnp.full((b,), anchor + 2),
      done_B=jnp.zeros(b, bool), base_B=jnp.zeros(b, jnp.int32), target_cache=None, rng=None,
      counters=None, draft_cache=cache)
  carry = FeatureCarry(pending, jnp.full((b,), count, jnp.int32))
  return block_logits(draft, dp, state, carry, gamma, mask_id)[0]


@pytest.fixture(scope="module")
def pairs():
  return {}


def _pair(pairs, kind):
  """One tiny pair per kind for the module (its init compiles take most of a test's time)."""
  if kind not in pairs:
    pairs[kind] = tiny_feature_pair(kind, 64)
  return pairs[kind]


@pytest.mark.parametrize("kind", ["t5", "decoder"])
def test_training_mask_logits_equal_the_parallel_chains_draft_call(kind, pairs):
  target, tp, draft, dp = _pair(pairs, kind)
  gamma, mask_id = 3, 5
  enc, dec = _sequence(kind, 64)
  encoded, _, g = _features(target, tp, draft, dp, enc, dec)
  masks = jax.jit(fb.block_logits, static_argnums=(0, 6, 7))(
      draft, dp, enc, encoded, dec, g, gamma, mask_id)  # [B, A, G-1, V]
  chain_logits, _ = jax.jit(lambda p: draft.forward(p, enc, dec[:, 1:], g, encoded=encoded))(dp)
  assert masks.shape == (2, 8, gamma - 1, 64)
  cases = [(-1, 0), (0, 1), (3, 1), (3, 3), (4, gamma + 1), (6, 2)]
  for anchor, count in cases:
    call = _decode_call(draft, dp, enc, encoded, dec, g, anchor, count, gamma, mask_id)
    np.testing.assert_allclose(np.asarray(masks[:, anchor + 1]), np.asarray(call[:, 1:]),
                               rtol=1e-5, atol=1e-5, err_msg=f"anchor {anchor}, count {count}")
    if anchor >= 0:  # q_1: the teacher-forced entry itself
      np.testing.assert_allclose(np.asarray(chain_logits[:, anchor]), np.asarray(call[:, 0]),
                                 rtol=1e-5, atol=1e-5)
  # Another mask token is another input: the test would see a mismatch.
  other = _decode_call(draft, dp, enc, encoded, dec, g, 3, 1, gamma, mask_id + 1)
  assert not np.allclose(np.asarray(masks[:, 4]), np.asarray(other[:, 1:]), atol=1e-4)


def _batch(kind, vocab, seed):
  enc, dec = _sequence(kind, vocab, t=10, batch=8, seed=seed)
  weights = np.ones(dec.shape, np.float32)
  weights[::2, -3:] = 0.0  # ragged ends
  return {"encoder_input_tokens": enc, "decoder_input_tokens": dec,
          "loss_weights": jnp.asarray(weights)}


def test_block_loss_training_lowers_held_out_block_kl(pairs):
  target, tp, draft, dp = _pair(pairs, "t5")
  cfg = fdt.FeatureTrainConfig(target="tiny", tasks=TASKS, max_steps=40, block_size=3,
                               mask_id=5, ttt_steps=0)
  draft = FeatureDraft(draft.config.replace(block_size=3, mask_id=5))
  trainable, frozen = fdt.split(draft, dp)
  optimizer = optax.adam(3e-3)
  state = TrainState(params=trainable, opt_state=optimizer.init(trainable), step=jnp.int32(0),
                     tokens=jnp.int32(0), seconds=jnp.float32(0.0))
  step = fstep.make_step(draft, target, cfg, optimizer)
  held_out = _batch("t5", 64, seed=99)
  eval_fn = jax.jit(lambda p: fstep.draft_loss(draft, target, {**p, **frozen}, tp, held_out,
                                             cfg)[1])
  before = {k: float(v) for k, v in eval_fn(state.params).items()}
  for i in range(40):
    state, _ = step(state, _batch("t5", 64, seed=i % 8), frozen, tp)
  after = {k: float(v) for k, v in eval_fn(state.params).items()}
  assert {"block_kl_2", "block_kl_3", "block_top1_agree_3"} <= set(after)
  assert after["block_kl"] < 0.9 * before["block_kl"], (before, after)
  assert after["block_kl_3"] < before["block_kl_3"]


def test_run_selects_the_parallel_chain_with_the_recorded_mask_token(pairs):
  """`draft_schemes.plan` (the run's choice): the chain with the draft's default drafter, or the
  parallel drafter, whose mask entries (mask_id None) are the draft's own token: the pad id, or
  the one its block training recorded, which the drafter's one call then feeds."""
  target, tp, draft, _ = _pair(pairs, "t5")
  assert plan(draft, 3) == (Chain(3), None)  # the default: FeatureDrafter()
  assert plan(draft, 3, parallel=True) == (Chain(3), FeatureDrafter(parallel=True))
  assert draft.mask_id == draft.pad_id
  cfg = fdt.FeatureTrainConfig(target="tiny", tasks=TASKS, max_steps=1, block_size=4, mask_id=7,
                               emb_dim=16, num_heads=2, mlp_dim=32)
  trained = FeatureDraft(FeatureDraftConfig.from_json(cfg.draft_config(target.config).to_json()))
  assert trained.config.block_size == 4 and trained.mask_id == 7
  scheme, drafter = plan(trained, 2, parallel=True)
  assert (scheme, drafter) == (Chain(2), FeatureDrafter(parallel=True))
  dp = trained.with_target_pieces(trained.init(jax.random.key(2)), tp)
  inputs = jnp.asarray([[5, 6, 7, 1]], jnp.int32)

  def first_q(d):  # the first iteration's q rows; q_2 is read at a mask entry
    decoder = Decoder(target, trained, scheme, SamplingConfig(temperature=1.0), drafter=d)
    state = start.init_state(decoder, Params(tp, dp), inputs, jax.random.key(0))
    return np.asarray(d.propose(decoder, dp, state, jax.random.key(1))[0].q_BxGxV)

  got = first_q(drafter)
  np.testing.assert_array_equal(got, first_q(FeatureDrafter(parallel=True, mask_id=7)))
  assert not np.allclose(got, first_q(FeatureDrafter(parallel=True, mask_id=trained.pad_id)))
  with pytest.raises(ValueError, match="block_size"):
    fdt.FeatureTrainConfig(target="tiny", tasks=TASKS, max_steps=1, block_size=1)
