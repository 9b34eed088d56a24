"""The loss and the jitted step of a feature-level draft (EAGLE-3 style) on its frozen target.

Why apart from `training.feature_trainer` (the run: data order, checkpoints, export): the loss is
what experiments and tests take apart (`experiments/feature_draft_depth.py` replays
`rollout_layout` in the decode loop's frame), and it reads only a config's loss fields
(`ttt_steps`, `ttt_weight`, `start_weight`, `block_size`, `block_weight`), never the run's.

The step (see `models.feature_draft` for the coordinates): the target runs teacher-forced on the
task's targets, outside the gradient (its params are an argument the step never differentiates,
and its outputs are stopped), giving its states h_j and its next-token logits p_j. Entry j of
the draft gets (fuse(h_j), y_{j+1}) and learns forward KL(p_{j+1} || q_j). Training-time test
(`ttt_steps` k): rolled-out step a (1..k) feeds at entry j the draft's own output feature of
step a - 1 at entry j - 1, with the attention inference would see (step-0 entries up to j - a,
then its own chain of drafted entries: `rollout_layout`), and learns the same target; so the
draft is trained on the features it will read when drafting ahead of the target. Block loss
(`block_size` G, `training/feature_blocks.py`): after every anchor entry, G - 1 mask entries
learn the target's distributions 2..G places ahead, as `FeatureDrafter(parallel=True)` reads them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specdec_jax.models.feature_draft import FeatureDraft
from specdec_jax.models.model import Model
from specdec_jax.training import data as data_lib
from specdec_jax.training import divergences, feature_blocks
from specdec_jax.training.train_state import TrainState


def rollout_layout(length: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
  """(offsets [S T], visible [S T, S T]) of `steps` stacked copies of T entries: step a's entry
  i sits at position i and sees step 0's entries j <= i - a and, for 1 <= b <= a, step b's entry
  i - (a - b): the entries inference has when it drafts a tokens ahead of the target."""
  i = np.arange(length)
  offsets = np.tile(i, steps)
  visible = np.zeros((steps * length, steps * length), bool)
  for a in range(steps):
    rows = a * length + i
    visible[rows[:, None], i[None, :]] = i[None, :] <= i[:, None] - a
    for b in range(1, a + 1):
      ok = i - (a - b) >= 0
      visible[rows[ok], b * length + (i - (a - b))[ok]] = True
  return offsets, visible


def target_features(target: Model, layers, target_params, batch):
  """(encoded or None, the target's logits [B, T, V], states [B, T, n, D]), no gradient."""
  enc, dec = data_lib.model_inputs(batch)
  encoded = target.encode(target_params, enc) if target.config.is_encoder_decoder else None
  logits, hidden = target.forward_with_hidden(target_params, enc, dec, layers, encoded=encoded)
  return jax.lax.stop_gradient((encoded, logits, hidden))


STATES_KEY = "target_states_BxTxnxD"  # a batch's stored states (`training.target_states`)
SHARE_KEY = "loss_share"  # a length window's batch: its loss scale (`data.batch_share`)


def teacher(draft: FeatureDraft, target: Model, params, target_params, batch):
  """(encoded or None, the teacher's logits over the draft's head columns [B, T, K], the states
  at the feature layers [B, T, n, D]), no gradient: from the batch's stored states (the last
  layer's through the copied final norm and head) when it has them, else from a target pass
  (its logits taken at a restricted head's ids)."""
  n = len(draft.feature_layers)
  if STATES_KEY in batch:
    states = jnp.asarray(batch[STATES_KEY])
    last = target.config.num_decoder_layers
    at = draft.feature_layers.index(last) if last in draft.feature_layers else n
    logits = draft.target_logits(params, states[:, :, at])
    return jax.lax.stop_gradient((None, logits, states[:, :, :n]))
  encoded, logits, hidden = target_features(target, draft.feature_layers, target_params, batch)
  if draft.head_ids is not None:
    logits = jnp.take(logits, jnp.asarray(draft.head_ids, jnp.int32), axis=-1)
  return encoded, logits, hidden


def draft_loss(draft: FeatureDraft, target: Model, params, target_params, batch, cfg):
  """(objective, metrics): forward KL of each rolled-out step to the target's next
  distribution; the objective is that loss times the batch's `SHARE_KEY` where it has one
  (length windows), and the metrics keep the batch's own per-token loss. `cfg`: a
  `FeatureTrainConfig`; only its loss fields are read."""
  encoded, t_logits, hidden = teacher(draft, target, params, target_params, batch)
  enc, dec = data_lib.model_inputs(batch)
  tokens_BxT, teacher_BxTxV = dec[:, 1:], t_logits[:, 1:]
  w_BxT = batch["loss_weights"][:, 1:]
  n = jnp.maximum(jnp.sum(w_BxT), 1.0)
  t = tokens_BxT.shape[1]
  g_parts = [draft.fuse(params, hidden[:, :-1])]
  loss, metrics = 0.0, {}
  for a in range(cfg.ttt_steps + 1):
    layout = rollout_layout(t, a + 1) if a else (None, None)
    out = draft.features(params, enc, jnp.tile(tokens_BxT, (1, a + 1)),
                         jnp.concatenate(g_parts, axis=1), encoded=encoded,
                         offsets=layout[0], visible=layout[1])
    out_a = out[:, a * t:]
    logits_a = draft.compact_logits(params, out_a)
    w_a = w_BxT * (jnp.arange(t) >= a)[None, :].astype(w_BxT.dtype)
    kl = divergences.weighted_sum("fkl", logits_a, teacher_BxTxV, w_a) / n
    loss = loss + (1.0 if a == 0 else cfg.ttt_weight) * kl
    agree = jnp.argmax(logits_a, -1) == jnp.argmax(teacher_BxTxV, -1)
    metrics[f"kl_{a}"] = kl
    metrics[f"top1_agree_{a}"] = jnp.sum(agree * w_a) / jnp.maximum(jnp.sum(w_a), 1.0)
    g_parts.append(jnp.pad(out_a[:, :-1], ((0, 0), (1, 0), (0, 0))))  # entry i <- out[i - 1]
  if cfg.start_weight:
    kl, start_metrics = start_entry_loss(draft, params, enc, encoded, dec, t_logits,
                                         batch["loss_weights"])
    loss, metrics = loss + cfg.start_weight * kl, {**metrics, **start_metrics}
  if cfg.block_size:
    kl, block_metrics = feature_blocks.block_loss(draft, params, enc, encoded, dec, g_parts[0],
                                                  teacher_BxTxV, w_BxT, cfg)
    loss, metrics = loss + cfg.block_weight * kl, {**metrics, **block_metrics}
  objective = loss * batch[SHARE_KEY] if SHARE_KEY in batch else loss  # logged: the batch's own
  return objective, dict(metrics, loss=loss, target_tokens=jnp.sum(w_BxT))


def start_entry_logits(draft: FeatureDraft, params, enc, encoded, dec_BxT) -> jax.Array:
  """Logits of start entries: (zero feature, token) alone, the feature chain's first iteration
  (count 0: no target state yet, nothing in the draft's cache). T5 starts every request from
  y_0, the start token: [B, 1, V]. A decoder-only request starts from its prompt's last token,
  any token at any position, so every entry alone (each sees only itself; relative positions):
  [B, T, V], entry j predicting what the target predicts after token j. (V: the head's columns,
  K of them when restricted.)"""
  t = 1 if draft.config.kind == "t5" else dec_BxT.shape[1]
  zeros_BxTxD = jnp.zeros((dec_BxT.shape[0], t, draft.width), jnp.float32)
  alone = (None, None) if t == 1 else (np.zeros(t, np.int32), np.eye(t, dtype=bool))
  return draft.compact_logits(params, draft.features(params, enc, dec_BxT[:, :t], zeros_BxTxD,
                                                     encoded=encoded, offsets=alone[0],
                                                     visible=alone[1]))


def start_entry_loss(draft: FeatureDraft, params, enc, encoded, dec_BxT, t_logits_BxTxV,
                     weights_BxT):
  """(KL, metrics) of the start entries against the target's next-token p: without it every
  request's first draft comes from an entry no loss ever saw."""
  logits_BxSxV = start_entry_logits(draft, params, enc, encoded, dec_BxT)
  s = logits_BxSxV.shape[1]
  w_BxS, teacher_BxSxV = weights_BxT[:, :s], t_logits_BxTxV[:, :s]
  n = jnp.maximum(jnp.sum(w_BxS), 1.0)
  kl = divergences.weighted_sum("fkl", logits_BxSxV, teacher_BxSxV, w_BxS) / n
  agree = jnp.argmax(logits_BxSxV, -1) == jnp.argmax(teacher_BxSxV, -1)
  return kl, {"kl_start": kl, "top1_agree_start": jnp.sum(agree * w_BxS) / n}


def make_step(draft: FeatureDraft, target: Model, cfg, optimizer: optax.GradientTransformation):
  """Jitted (TrainState over the trainable params, batch, frozen params, target params) ->
  (TrainState, metrics); the frozen pieces and the target get no gradient and no update."""

  def loss_fn(trainable, frozen, target_params, batch):
    return draft_loss(draft, target, {**trainable, **frozen}, target_params, batch, cfg)

  def step(state: TrainState, batch, frozen, target_params):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, frozen,
                                                                    target_params, batch)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads))
    return state.replace(params=params, opt_state=opt_state, step=state.step + 1,
                         tokens=state.tokens + metrics["target_tokens"].astype(jnp.int32)), metrics

  return jax.jit(step, donate_argnums=(0,))
