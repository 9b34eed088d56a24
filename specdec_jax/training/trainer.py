"""The optax trainer: from scratch, fine-tuning a loaded checkpoint, or distilling a draft
(its settings: `training.train_config.TrainConfig`).

Why it looks like this:
- Resume after a kill is exact: the train state (`training.train_state.TrainState`: params,
  optimizer state, step, tokens seen, seconds spent) is an Orbax checkpoint written every
  `checkpoint_every` steps, and the batch of a step is a pure function of (seed, step)
  (`training.data`), so a resumed run continues with the very batches the killed one would have
  seen. `batches.jsonl` logs a hash of every batch to prove it.
- Adafactor is the default because T5 trains with it (factored second moments: small optimizer
  state); AdamW is the option researchers reach for with small models.
- Distillation (DistillSpec) is a loss option of the same step: with a `teacher` checkpoint the
  loss mixes a divergence to the teacher's next-token distribution (`divergence`: forward KL,
  reverse KL, JSD(beta), total variation; `training.divergences`) with the data cross-entropy.
  The sequences it is measured on are the task's (references, or continuations the target
  generated: a `training.seqdata` directory as the task) or, for a fraction `on_policy_fraction`
  of the steps, the student's own continuations (`training.onpolicy`).
- Wall-clock budgets (`max_train_seconds`) end a run cleanly at a checkpoint: training on a
  2-core CPU is slow, and a budget that resumes across sessions is how the local zoo is built.
- Fine-tuning T5 v1.1 as T5X does (configs/paper/train/): tasks may be seqio tasks (WMT En-De,
  CNN/DM; `training.data`), `mesh` shards the model, batch and optimizer state over a TPU slice
  (`training.sharded`; XXL fits no single chip), `num_microbatches` accumulates gradients over
  slices of the batch (T5X's name: the same update, less activation memory) and `dtype` computes
  activations in bfloat16 while params, gradients and optimizer state stay float32.
- Several processes (a multi-host slice) run the same loop; only process 0 writes files other
  than Orbax checkpoints, and a wall-clock stop is process 0's decision, shared with all.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging

from specdec_jax import sharding
from specdec_jax.checkpoints import loader
from specdec_jax.checkpoints import orbax_io
from specdec_jax.checkpoints import pairing
from specdec_jax.data import tasks as tasks_lib
from specdec_jax.metrics.tensorboard import RunWriter
from specdec_jax.models.model_config import ModelConfig
from specdec_jax.models.model import Model
from specdec_jax.training import data as data_lib
from specdec_jax.training import evaluation
from specdec_jax.training import distill_data
from specdec_jax.training import onpolicy
from specdec_jax.training import run_key
from specdec_jax.training import shared_encoder
from specdec_jax.training import sharded as sharded_lib
from specdec_jax.training import warm_start
# Re-exported: `from specdec_jax.training.trainer import TrainConfig` is how users and gin see it.
from specdec_jax.training.train_config import OPTIMIZERS, SCHEDULES, TrainConfig  # noqa: F401
from specdec_jax.training.placement import Placement
# Re-exported: the step lives in training/step.py; scripts and tests name it from here too.
from specdec_jax.training.step import (  # noqa: F401
    _cached_train_step, learning_rate_schedule, make_optimizer, make_train_step)
from specdec_jax.training.train_state import TrainState

def _batch_digest(batch: dict[str, np.ndarray]) -> str:
  h = hashlib.sha1()
  for k in sorted(batch):
    h.update(k.encode())
    h.update(np.ascontiguousarray(batch[k]).tobytes())
  return h.hexdigest()[:16]


def _load_model(path_or_preset: str, seed: int, dtype: str = "float32"
                ) -> tuple[ModelConfig, Any]:
  """(config with activation `dtype`, per-layer float32 params on the host: placed by the
  caller)."""
  model, params = loader.load_model(path_or_preset, dtype=dtype, seed=seed, sharding=loader.HOST,
                                    weights_dtype="float32", scan_layers=False)
  return model.config, params


def _check_vocab(model_cfg: ModelConfig, vocab, what: str) -> None:
  if model_cfg.vocab_size < vocab.vocab_size:
    source = getattr(vocab, "model_file", None) or "the task's vocabulary"
    raise ValueError(f"{what} has vocab_size {model_cfg.vocab_size}, smaller than the "
                     f"vocabulary's {vocab.vocab_size} ids ({source})")


def _check_on_policy_model(cfg: TrainConfig, model_cfg: ModelConfig | None = None) -> None:
  """On-policy distillation needs an encoder-decoder student (its prompt is the encoder input);
  refused before anything is written when the config can be read without the weights."""
  if cfg.on_policy_fraction <= 0.0:
    return
  model_cfg = model_cfg or distill_data.peek_config(cfg.model)
  if model_cfg is not None and not model_cfg.is_encoder_decoder:
    raise ValueError(f"on_policy_fraction is {cfg.on_policy_fraction} but model {cfg.model} is "
                     "decoder-only; on-policy distillation supports encoder-decoder models only")


def _has_checkpoint(output_dir: str) -> bool:
  """Whether `output_dir` holds a committed train-state checkpoint (Orbax names a committed step's
  directory by the step; unfinished ones carry a temporary suffix)."""
  ckpt_dir = os.path.join(output_dir, "checkpoints")
  return os.path.isdir(ckpt_dir) and any(n.isdigit() for n in os.listdir(ckpt_dir))


def _agree(flag: bool) -> bool:
  """Process 0's decision on every process (one process: `flag`), so all run the same steps."""
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


def train(cfg: TrainConfig, output_dir: str, *, config_text: str = "",
          crash_after_step: int | None = None, progress: bool = True) -> dict[str, Any]:
  """Trains (or resumes) into `output_dir`; returns the summary written to `train_summary.json`.

  `crash_after_step` raises after that step's checkpoint logic, simulating a kill (tests).
  With `cfg.mesh`, the mesh is checked against the model and the (micro)batch before anything is
  compiled, and everything from placement to export runs with that mesh in context.
  """
  if cfg.mesh is not None:  # forced host devices must be set before jax's first device use
    sharding.force_cpu_devices(cfg.mesh.num_cpu_devices)
  _check_on_policy_model(cfg)
  shared_encoder.check_config(cfg, distill_data.peek_config(cfg.model),
                              distill_data.peek_config(cfg.teacher) if cfg.teacher else None)
  # Before any weights are loaded: a refused resume should cost nothing.
  run_key.check_or_write(cfg, output_dir, resuming=_has_checkpoint(output_dir),
                         write=jax.process_index() == 0)
  if config_text and jax.process_index() == 0:  # after the key check: a refusal writes nothing
    with open(os.path.join(output_dir, "config.gin"), "w", encoding="utf-8") as f:
      f.write(config_text)
  model_cfg, params = _load_model(cfg.model, cfg.seed, cfg.dtype)
  _check_on_policy_model(cfg, model_cfg)
  if cfg.init_from and not _has_checkpoint(output_dir):  # a resumed run restores its own
    params, _ = warm_start.warm_start(params, _load_model(cfg.init_from, cfg.seed)[1],
                                      cfg.init_from)
  model = Model(model_cfg)
  teacher, teacher_cfg, teacher_params = None, None, None
  if cfg.teacher:
    teacher_cfg, teacher_params = _load_model(cfg.teacher, cfg.seed, cfg.dtype)
    if teacher_cfg.vocab_size != model_cfg.vocab_size or teacher_cfg.kind != model_cfg.kind:
      raise ValueError(f"teacher {cfg.teacher} (kind {teacher_cfg.kind}, vocab_size "
                       f"{teacher_cfg.vocab_size}) cannot teach model {cfg.model} (kind "
                       f"{model_cfg.kind}, vocab_size {model_cfg.vocab_size})")
    teacher = Model(teacher_cfg)
  shared_encoder.check_config(cfg, model_cfg, teacher_cfg)
  if teacher_cfg is not None:
    shared_encoder.check_pairing(cfg, model_cfg, teacher_params)
  tm = None
  if cfg.mesh is not None:
    tm, model, teacher = sharded_lib.setup(
        cfg.mesh, model, batch_size=cfg.batch_size // cfg.num_microbatches,
        name=f"model {cfg.model}", teacher=teacher)
  with contextlib.ExitStack() as stack:
    if tm is not None:
      stack.enter_context(jax.set_mesh(tm.mesh))
    return _train(cfg, output_dir, model, params, teacher, teacher_params, Placement(tm),
                  _Options(config_text, crash_after_step, progress))


@dataclasses.dataclass(frozen=True)
class _Options:
  """How `train` was called beside the config (tests simulate a kill, scripts silence the bar)."""
  config_text: str = ""
  crash_after_step: int | None = None
  progress: bool = True


@dataclasses.dataclass(frozen=True)
class _Run:
  """What the loop works with beside the train state: fixed for the whole run."""
  cfg: TrainConfig
  model: Model
  teacher: Model | None
  teacher_params: Any
  place: Placement
  tasks: list[data_lib.TokenizedTask]
  train_step: Callable
  schedule: optax.Schedule
  evaluator: Callable | None
  primary: bool  # process 0, the only one that writes files other than Orbax checkpoints


@dataclasses.dataclass
class _Sinks:
  """Where a run writes as it goes: checkpoints (every process); TensorBoard, the batch log and
  the progress bar (process 0 only, else None)."""
  manager: ocp.CheckpointManager
  writer: RunWriter | None = None
  batches_log: Any = None
  bar: Any = None

  def close(self) -> None:
    """Closes the batch log and the bar and waits for checkpoint writes (TensorBoard stays open
    for the summary's scalars)."""
    if self.batches_log:
      self.batches_log.close()
    if self.bar is not None:
      self.bar.close()
    self.manager.wait_until_finished()


@dataclasses.dataclass
class _Progress:
  """The loop's host-side counters (the device-side ones live in the `TrainState`)."""
  step: int
  seconds_before: float  # training seconds of the runs this one resumes
  t_process: float = dataclasses.field(default_factory=time.perf_counter)
  t_window: float = dataclasses.field(default_factory=time.perf_counter)
  tokens_window: float = 0.0
  last_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  stopped_by_budget: bool = False

  def seconds(self) -> float:
    return self.seconds_before + time.perf_counter() - self.t_process


def _train(cfg: TrainConfig, output_dir: str, model: Model, params, teacher: Model | None,
           teacher_params, place: Placement, opts: _Options) -> dict[str, Any]:
  output_dir = os.path.abspath(output_dir)
  primary = jax.process_index() == 0  # the only process that writes (Orbax: all of them)
  os.makedirs(output_dir, exist_ok=True)
  vocab, tasks = _tokenized_tasks(cfg, model)
  params = place.params(model, params)
  if teacher is not None:
    teacher_params = place.params(teacher, teacher_params)
  manager = ocp.CheckpointManager(
      os.path.join(output_dir, "checkpoints"),
      options=ocp.CheckpointManagerOptions(max_to_keep=cfg.keep_checkpoints, create=True))
  state = _restore(manager, _initial_state(cfg, params, place))
  evaluator = (evaluation.make_evaluator(model, cfg.tasks, vocab, eval_examples=cfg.eval_examples,
                                          batch_size=cfg.batch_size, place=place,
                                          teacher=teacher, teacher_params=teacher_params)
               if cfg.eval_examples else None)
  run = _Run(cfg, model, teacher, teacher_params, place, tasks,
             _cached_train_step(model, cfg, teacher, place.tm, state),
             learning_rate_schedule(cfg), evaluator, primary)
  sinks = _open_sinks(run, output_dir, int(state.step), manager, opts)
  progress = _Progress(step=int(state.step), seconds_before=float(state.seconds))
  try:
    state = _loop(run, state, sinks, progress, opts.crash_after_step)
  finally:
    sinks.close()
  return _finish(run, state, progress, sinks.writer, output_dir)


def _tokenized_tasks(cfg: TrainConfig, model: Model):
  """(vocabulary, the tokenized train split of every task); a vocabulary larger than the model's
  embedding is refused before anything runs."""
  vocab = tasks_lib.load_vocabulary(cfg.vocabulary, required=True)
  for spec in cfg.tasks:
    _check_vocab(model.config, data_lib.task_vocabulary(spec, vocab),
                 f"model {cfg.model} (task {spec.name})")
  enc_dec = model.config.is_encoder_decoder
  tasks = [data_lib.tokenize_task(s, vocab, enc_dec, "train") for s in cfg.tasks]
  logging.info("tasks: %s", ", ".join(f"{t.spec.name} ({t.size} examples)" for t in tasks))
  return vocab, tasks


def _initial_state(cfg: TrainConfig, params, place: Placement) -> TrainState:
  return TrainState(params=params, opt_state=place.opt_state(make_optimizer(cfg), params),
                    step=place.scalar(0, np.int32), tokens=place.scalar(0, np.int32),
                    seconds=place.scalar(0.0, np.float32))


def _restore(manager: ocp.CheckpointManager, state: TrainState) -> TrainState:
  """The latest checkpoint laid out like `state` (shardings included), else `state`."""
  latest = manager.latest_step()
  if latest is None:
    return state
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state.to_checkpoint())
  restored = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
  logging.info("resumed from step %d (%s)", latest, manager.directory)
  return TrainState.from_checkpoint(restored)


def _open_sinks(run: _Run, output_dir: str, start_step: int, manager: ocp.CheckpointManager,
                opts: _Options) -> _Sinks:
  sinks = _Sinks(manager)
  if not run.primary:
    return sinks
  sinks.writer = RunWriter(os.path.join(output_dir, "tensorboard"))
  if opts.config_text and start_step == 0:
    sinks.writer.text("config", opts.config_text)
  sinks.batches_log = open(os.path.join(output_dir, "batches.jsonl"), "a", encoding="utf-8")
  if opts.progress:
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    sinks.bar = tqdm(total=run.cfg.max_steps, initial=start_step, desc="train", unit="step",
                     dynamic_ncols=True)
  return sinks


def _loop(run: _Run, state: TrainState, sinks: _Sinks, progress: _Progress,
          crash_after_step: int | None) -> TrainState:
  """Steps until `max_steps` or the wall-clock budget, checkpointing as configured."""
  cfg = run.cfg
  pending = None  # the previous step's metrics, checked once the next step is dispatched
  while progress.step < cfg.max_steps:
    state, metrics = _step(run, state, progress, sinks.batches_log)
    step = progress.step
    if pending is not None:
      _check_finite(*pending, sinks.manager)
    pending = (step, metrics)
    if step % cfg.log_every == 0 or step == cfg.max_steps:
      _check_finite(step, metrics, sinks.manager)  # it syncs anyway: no NaN reaches the logs
      _log_metrics(run, step, metrics, progress, sinks)
    if run.evaluator and cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.max_steps:
      valid = run.evaluator(state.params)
      if sinks.writer:
        sinks.writer.scalars(step, {f"valid/{k}": v for k, v in valid.items()})
    if sinks.bar is not None:
      sinks.bar.update(1)
    over_budget = (cfg.max_train_seconds is not None and _agree(
        time.perf_counter() - progress.t_process > cfg.max_train_seconds))
    if step % cfg.checkpoint_every == 0 or step == cfg.max_steps or over_budget:
      _check_finite(step, metrics, sinks.manager)  # only finite states are ever saved
      state = state.replace(seconds=run.place.scalar(progress.seconds(), np.float32))
      sinks.manager.save(step, args=ocp.args.StandardSave(state.to_checkpoint()))
      sinks.manager.wait_until_finished()
      if sinks.batches_log:
        sinks.batches_log.flush()
    if crash_after_step is not None and step >= crash_after_step:
      raise RuntimeError(f"simulated crash after step {step}")
    if over_budget:
      progress.stopped_by_budget = step < cfg.max_steps
      break
  if pending is not None:
    _check_finite(*pending, sinks.manager)
  return state


class NonFiniteTraining(FloatingPointError):
  """The loss, the gradients or the parameters stopped being finite."""


_WATCHED = ("loss", "grad_norm", "param_norm")


def _check_finite(step: int, metrics: dict[str, jax.Array], manager: ocp.CheckpointManager
                  ) -> None:
  """Stops the run at the first step whose loss, gradient norm or parameter norm is NaN or
  infinite, naming the step, the quantities and the last good checkpoint.

  Why: a diverged run used to train on "successfully" (loss NaN) and export NaN weights. The
  check reads the previous step's metrics after the next step is dispatched (and the current
  step's before any checkpoint), so it costs no pipeline stall and no bad state is ever saved.
  """
  values = {k: float(v) for k, v in jax.device_get({k: metrics[k] for k in _WATCHED}).items()}
  bad = {k: v for k, v in values.items() if not np.isfinite(v)}
  if bad:
    last = manager.latest_step()
    raise NonFiniteTraining(
        f"training stopped at step {step}: {bad} not finite (the others: "
        f"{ {k: v for k, v in values.items() if k not in bad} }); "
        + (f"the last good checkpoint is step {last} in {manager.directory}, nothing later "
           "was saved" if last is not None else "no checkpoint had been saved yet") +
        " and nothing was exported; lower TrainConfig.learning_rate or add warm-up "
        "and resume (a changed learning rate resumes)")


def _step(run: _Run, state: TrainState, progress: _Progress, batches_log
          ) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on the batch of `progress.step` (the student's own continuations on an
  on-policy step), logged to batches.jsonl; advances the host counters."""
  cfg, step = run.cfg, progress.step
  task_idx, batch_np = data_lib.batch_at(run.tasks, step, cfg.batch_size, cfg.seed)
  on_policy = onpolicy.is_on_policy(cfg.on_policy_fraction, cfg.seed, step)
  if on_policy:
    batch_np = onpolicy.student_batch(run.model, state.params, batch_np,
                                      temperature=cfg.on_policy_temperature, seed=cfg.seed,
                                      step=step, teacher=run.teacher,
                                      teacher_params=run.teacher_params)
  if batches_log:
    row = {"step": step, "task": run.tasks[task_idx].spec.name, "digest": _batch_digest(batch_np)}
    if on_policy:
      row["on_policy"] = True
    batches_log.write(json.dumps(row) + "\n")
  state, metrics = run.train_step(state, run.place.batch(batch_np), run.teacher_params)
  progress.step += 1
  progress.tokens_window += float(np.sum(batch_np["loss_weights"]))
  return state, metrics


def _log_metrics(run: _Run, step: int, metrics: dict[str, jax.Array], progress: _Progress,
                 sinks: _Sinks) -> None:
  """The step's train metrics, learning rate and throughput since the last log line."""
  metrics = jax.device_get(metrics)
  now = time.perf_counter()
  last = {f"train/{k}": float(v) for k, v in metrics.items() if k != "target_tokens"}
  last["train/learning_rate"] = float(run.schedule(step))
  last["train/target_tokens_per_second"] = (progress.tokens_window /
                                            max(now - progress.t_window, 1e-9))
  if sinks.writer:
    sinks.writer.scalars(step, last)
  progress.t_window, progress.tokens_window = now, 0.0
  progress.last_metrics = last
  if sinks.bar is not None:
    sinks.bar.set_postfix(loss=f"{last['train/loss']:.3f}",
                          tok_s=f"{last['train/target_tokens_per_second']:.0f}")


def _finish(run: _Run, state: TrainState, progress: _Progress, writer: RunWriter | None,
            output_dir: str) -> dict[str, Any]:
  """The summary (final validation, export) written to train_summary.json."""
  cfg = run.cfg
  summary = {
      "model": cfg.model, "teacher": cfg.teacher, "steps": progress.step,
      "max_steps": cfg.max_steps, "stopped_by_time_budget": progress.stopped_by_budget,
      "target_tokens_seen": int(state.tokens), "train_seconds": round(progress.seconds(), 1),
      "num_params": int(sum(np.size(x) for x in jax.tree.leaves(state.params))),
      "final_train_metrics": progress.last_metrics,
  }
  if run.evaluator:
    summary["valid_cross_entropy"] = run.evaluator(state.params)
  if writer:
    writer.scalars(progress.step, {f"valid/{k}": v
                                   for k, v in summary.get("valid_cross_entropy", {}).items()})
    writer.close()
  if cfg.export_dir:
    summary.update(_export(run, state, output_dir))
  if run.primary:
    with open(os.path.join(output_dir, "train_summary.json"), "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=1)
  return summary


def _export(run: _Run, state: TrainState, output_dir: str) -> dict[str, Any]:
  """Writes the trained weights to `export_dir` (under `output_dir` when relative:
  `TrainConfig.export_path`); the summary entries that say so."""
  cfg = run.cfg
  export_dir = cfg.export_path(output_dir)
  dtype = jnp.dtype(cfg.export_dtype) if cfg.export_dtype else None
  # Sharded params are written shard by shard (every process calls save); the stored config
  # keeps float32 activations, as exports always had (runs pick their own dtype).
  exported = state.params if run.place.tm is not None else jax.device_get(state.params)
  orbax_io.save(export_dir, run.model.config.replace(dtype="float32"), exported, dtype=dtype)
  out = {"export_dir": export_dir}
  if run.model.shares_encoder and run.primary:  # which target's encoder it reads (checked at load)
    out["paired_target"] = pairing.write(export_dir, target_name=cfg.teacher,
                                         target_config=run.teacher.config,
                                         target_params=run.teacher_params)
  return out
