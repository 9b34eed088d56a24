"""The compiled training step: the learning-rate schedule, the optimizer and one jitted update
(microbatched gradients, distillation as a loss option), cached per setting.

Why apart from the loop (`training.trainer`): the step is what the AOT builder compiles for a TPU
slice (`aot.programs`) and what the feature-draft trainer shares the optimizer of; the loop around
it (checkpoints, resume, non-finite refusal, logs, export) is I/O these need none of.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from specdec_jax.models.model import Model
from specdec_jax.training import data as data_lib
from specdec_jax.training import divergences
from specdec_jax.training import losses
from specdec_jax.training import shared_encoder
from specdec_jax.training import sharded as sharded_lib
from specdec_jax.training.train_config import TrainConfig
from specdec_jax.training.train_state import TrainState


def learning_rate_schedule(cfg: TrainConfig) -> optax.Schedule:
  warm = max(cfg.warmup_steps, 1)
  if cfg.schedule == "constant":
    return optax.linear_schedule(0.0, cfg.learning_rate, warm) if cfg.warmup_steps else (
        lambda step: jnp.float32(cfg.learning_rate))
  if cfg.schedule == "rsqrt":
    return lambda step: cfg.learning_rate * jnp.sqrt(warm / jnp.maximum(step, warm))
  if cfg.schedule == "wsd":
    start = cfg.max_steps - cfg.decay_steps
    def wsd(step):
      warmup = jnp.minimum(step / warm, 1.0) if cfg.warmup_steps else 1.0
      done = jnp.clip((step - start) / cfg.decay_steps, 0.0, 1.0)
      return cfg.learning_rate * warmup * (1.0 - jnp.sqrt(done))
    return wsd
  return optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, warm, cfg.max_steps,
                                            cfg.learning_rate * 0.1)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  lr = learning_rate_schedule(cfg)
  if cfg.optimizer == "adafactor":
    return optax.adafactor(learning_rate=lr)
  return optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(lr, b1=0.9, b2=0.98, weight_decay=cfg.weight_decay))


def _microbatches(batch: dict[str, jax.Array], k: int) -> dict[str, jax.Array]:
  """[B, ...] -> [k, B / k, ...], microbatch j = rows j, j + k, ...: strided, so each one is spread
  over every data shard of a sharded batch (no resharding) instead of living on a few."""
  return jax.tree.map(lambda x: x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1), batch)


def make_train_step(model: Model, cfg: TrainConfig, optimizer: optax.GradientTransformation,
                    teacher: Model | None, state_shardings=None, replicated=None):
  """Jitted (TrainState, batch, teacher_params) -> (TrainState, metrics).

  Losses are sums over target tokens divided by the whole batch's token count, so microbatch
  gradients add up to the whole batch's. `state_shardings` (sharded runs) pins the state's layout
  across steps (and keeps the donated buffers reusable); metrics then come back replicated.
  """

  def loss_fn(params, batch, teacher_params, n):
    enc, dec = data_lib.model_inputs(batch)
    encoded = shared_encoder.encoded_for(model, teacher, teacher_params, enc)  # None or once
    logits = model.forward(params, enc, dec, encoded=encoded)
    w = batch["loss_weights"]
    ce_sum, tokens = losses.cross_entropy(logits, batch["decoder_target_tokens"], w, cfg.z_loss)
    metrics = {"cross_entropy": ce_sum / n, "target_tokens": tokens}
    if teacher is None:
      return ce_sum / n, metrics
    teacher_logits = teacher.forward(teacher_params, enc, dec, encoded=encoded)
    d = divergences.weighted_sum(cfg.divergence, logits, teacher_logits, w,
                                 temperature=cfg.distill_temperature, beta=cfg.jsd_beta) / n
    metrics[divergences.METRIC_NAMES[cfg.divergence]] = d
    return cfg.distill_weight * d + (1.0 - cfg.distill_weight) * ce_sum / n, metrics

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def loss_and_grads(params, batch, teacher_params):
    n = jnp.maximum(jnp.sum(batch["loss_weights"]), 1.0)
    if cfg.num_microbatches == 1:
      return grad_fn(params, batch, teacher_params, n)
    def body(acc, mb):
      out = grad_fn(params, mb, teacher_params, n)
      return jax.tree.map(jnp.add, acc, out), None
    mbs = _microbatches(batch, cfg.num_microbatches)
    first = jax.tree.map(lambda x: x[0], mbs)
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                         jax.eval_shape(grad_fn, params, first, teacher_params, n))
    return jax.lax.scan(body, zeros, mbs)[0]

  def step(state: TrainState, batch, teacher_params):
    (loss, metrics), grads = loss_and_grads(state.params, batch, teacher_params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads),
                   param_norm=optax.tree.norm(params))
    new_state = state.replace(params=params, opt_state=opt_state, step=state.step + 1,
                              tokens=state.tokens + metrics["target_tokens"].astype(jnp.int32))
    return new_state, metrics

  if state_shardings is None:
    return jax.jit(step, donate_argnums=(0,))
  return jax.jit(step, donate_argnums=(0,), out_shardings=(state_shardings, replicated))


_STEP_CACHE: dict[tuple, Any] = {}


def _cached_train_step(model: Model, cfg: TrainConfig, teacher: Model | None,
                       tm: sharded_lib.TrainMesh | None = None, state=None):
  """One compiled step per (model, optimizer, loss, mesh) setting: a resume in the same process
  (tests, notebooks) reuses the compilation instead of paying it again."""
  key = (model.config, teacher and teacher.config, cfg.optimizer, cfg.learning_rate, cfg.schedule,
         cfg.warmup_steps, cfg.decay_steps, cfg.weight_decay, cfg.z_loss, cfg.distill_weight,
         cfg.distill_temperature, cfg.divergence, cfg.jsd_beta, cfg.max_steps,
         cfg.num_microbatches, tm)
  if key not in _STEP_CACHE:
    extra = {} if tm is None else dict(state_shardings=sharded_lib.state_shardings(state),
                                       replicated=tm.replicated)
    _STEP_CACHE[key] = make_train_step(model, cfg, make_optimizer(cfg), teacher, **extra)
  return _STEP_CACHE[key]
