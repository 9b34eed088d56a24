"""The block loss of a feature-level draft: its mask entries, trained for the parallel chain.

Why (issue 28's parallel variant, after DFlash / PARD): `FeatureDrafter(parallel=True)`
(decoding/drafter.py) makes one draft call per iteration, the verified (pending) entries followed by G - 1 mask entries (token
`mask_id`, feature zeros) whose outputs are the marginals q_2..q_G. A draft trained on next-token
entries only has never seen a mask; this loss trains each mask entry on exactly what that call
feeds it, against the target's distribution at the position it drafts.

Coordinates (`models/feature_draft.py`'s, in the training frame of `feature_step.draft_loss`):
entry e = (g_e, y_{e+1}) predicts teacher[e] = p_{e+1}, e = 0..T-1. An anchor a is the last
verified entry of a decode-time call: a >= 0 is entry a (every entry before it is in the draft
cache or pending, all with the target's features: the parallel chain never caches a draft
feature); a = -1 is the first iteration's call, whose only real entry is the start entry (zero
feature, the start token y_0), fed once and rolled back. Mask k (1..G-1) of anchor a sits k
positions after it and learns teacher[a + k] (q_{k+1} drafts the token k places past x_1).
Positions: the start entry at 0, entry e at e + 1, anchor a's mask k at a + 1 + k (relative
positions, the only ones the draft's biases read, are the decode cache's).

Layout: one forward over U = 1 + T + T (G - 1) entries, [start entry, entries 0..T-1, then
anchor -1's masks, anchor 0's, ..., anchor T-2's], with a custom visible matrix
(`block_layout`): every anchor of every sequence in one call of static shape, rather than one
random anchor per example, because it is the same forward either way (`transformer.masked_block`
takes any layout) and trains T blocks per sequence instead of one. Its cost is ~G times the
next-token forward. The next-token loss and training-time test keep their own forwards; the
prefix entries here repeat the next-token forward's (their outputs are not used).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.training import divergences


def block_layout(length: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
  """(offsets [U], visible [U, U]) of [start entry, T entries, T blocks of G - 1 masks]: the start
  entry sees itself; entry e sees entries 0..e (the teacher-forced chain); anchor a's mask k sees
  the prefix of its call (entries 0..a, or the start entry for a = -1) and masks 1..k of its own
  block, nothing of other blocks."""
  t, m = length, block_size - 1
  u = 1 + t + t * m
  offsets = np.zeros(u, np.int32)
  offsets[1:1 + t] = np.arange(t) + 1
  visible = np.zeros((u, u), bool)
  visible[0, 0] = True
  visible[1:1 + t, 1:1 + t] = np.tril(np.ones((t, t), bool))
  for i in range(t):  # anchor a = i - 1
    rows = 1 + t + i * m + np.arange(m)
    offsets[rows] = i + 1 + np.arange(m)  # a + 1 + k, k = 1..m
    prefix = np.arange(1, i + 1) if i else np.zeros(1, np.int64)
    visible[np.ix_(rows, prefix)] = True
    visible[np.ix_(rows, rows)] = np.tril(np.ones((m, m), bool))
  return offsets, visible


def block_inputs(start_B: jax.Array, tokens_BxT: jax.Array, g_BxTxD: jax.Array,
                 block_size: int, mask_id: int) -> tuple[jax.Array, jax.Array]:
  """(tokens [B, U], features [B, U, D]) of `block_layout`: the start entry (start token, zero
  feature), the T teacher-forced entries, then every mask entry (`mask_id`, zero feature)."""
  b, t = tokens_BxT.shape
  m = t * (block_size - 1)
  tokens_BxU = jnp.concatenate([start_B[:, None].astype(tokens_BxT.dtype), tokens_BxT,
                                jnp.full((b, m), mask_id, tokens_BxT.dtype)], axis=1)
  zeros = lambda n: jnp.zeros((b, n, g_BxTxD.shape[-1]), g_BxTxD.dtype)  # noqa: E731
  return tokens_BxU, jnp.concatenate([zeros(1), g_BxTxD, zeros(m)], axis=1)


def block_logits(draft, params, enc, encoded, dec_BxT1: jax.Array, g_BxTxD: jax.Array,
                 block_size: int, mask_id: int) -> jax.Array:
  """The masks' logits [B, A, G - 1, V] (A = T anchors, a = -1..T-2) of one forward over the
  block layout. dec_BxT1: the decoder inputs (y_0, the start token, then y_1..y_T); g_BxTxD: the
  fused target features of entries 0..T-1 (positions 0..T-1)."""
  t = g_BxTxD.shape[1]
  offsets, visible = block_layout(t, block_size)
  tokens_BxU, g_BxUxD = block_inputs(dec_BxT1[:, 0], dec_BxT1[:, 1:], g_BxTxD, block_size,
                                     mask_id)
  out_BxUxD = draft.features(params, enc, tokens_BxU, g_BxUxD, encoded=encoded,
                             offsets=offsets, visible=visible)
  masks_BxMxV = draft.compact_logits(params, out_BxUxD[:, 1 + t:])  # the head on the masks only
  return masks_BxMxV.reshape(masks_BxMxV.shape[0], t, block_size - 1, -1)


def block_kl(masks_BxAxKxV: jax.Array, teacher_BxTxV: jax.Array, w_BxT: jax.Array):
  """(mean forward KL over every weighted mask, metrics): mask k of anchor i - 1 learns
  teacher[i - 1 + k] with its weight (none past the sequence). Per k: `block_kl_{k+1}` and
  `block_top1_agree_{k+1}` (the q index it drafts)."""
  t, m = teacher_BxTxV.shape[1], masks_BxAxKxV.shape[2]
  total, weight, metrics = 0.0, 0.0, {}
  for k in range(1, m + 1):
    n_anchor = t - k + 1  # anchors -1..T-1-k have a target at a + k
    logits_k = masks_BxAxKxV[:, :n_anchor, k - 1]
    teacher_k, w_k = teacher_BxTxV[:, k - 1:], w_BxT[:, k - 1:]
    kl_sum = divergences.weighted_sum("fkl", logits_k, teacher_k, w_k)
    n_k = jnp.sum(w_k)
    agree = jnp.argmax(logits_k, -1) == jnp.argmax(teacher_k, -1)
    metrics[f"block_kl_{k + 1}"] = kl_sum / jnp.maximum(n_k, 1.0)
    metrics[f"block_top1_agree_{k + 1}"] = jnp.sum(agree * w_k) / jnp.maximum(n_k, 1.0)
    total, weight = total + kl_sum, weight + n_k
  kl = total / jnp.maximum(weight, 1.0)
  return kl, dict(metrics, block_kl=kl)


def block_loss(draft, params, enc, encoded, dec_BxT1, g_BxTxD, teacher_BxTxV, w_BxT, cfg):
  """(block KL, metrics) of a batch (`FeatureTrainConfig.block_size`, the draft's mask id)."""
  masks = block_logits(draft, params, enc, encoded, dec_BxT1, g_BxTxD, cfg.block_size,
                       draft.mask_id)
  return block_kl(masks, jax.lax.stop_gradient(teacher_BxTxV), w_BxT)
