"""Training a feature-level draft (EAGLE-3 style) on its frozen target, in JAX.

Why its own loop beside `training.trainer`: the student is not a `Model` (it reads the target's
hidden states) and the step runs the target inside it; the pieces are the trainer's own: the
data order as a pure function of (seed, step) (`training.data.batch_at`), the optimizer and
schedule (`training.step.make_optimizer`), the typed `TrainState` in Orbax checkpoints (a killed run
resumes with the very batches it would have seen), a wall-clock budget.

The loss and its step: `training.feature_step`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from specdec_jax import paths
from specdec_jax.checkpoints import feature_draft_io as fd_ckpt
from specdec_jax.checkpoints import head_ranking, loader
from specdec_jax.data import tasks as tasks_lib
from specdec_jax.models.feature_draft import FeatureDraft
from specdec_jax.models.feature_draft_config import FeatureDraftConfig
from specdec_jax.models import head_vocab
from specdec_jax.models.model import Model
from specdec_jax.training import data as data_lib
from specdec_jax.training import feature_step, run_key, target_states, warm_start
from specdec_jax.training.train_config import TrainConfig
from specdec_jax.training.train_state import TrainState


@dataclasses.dataclass(frozen=True)
class FeatureTrainConfig:
  """A feature draft's training run (gin: `FeatureTrainConfig`, `python -m specdec_jax.train`).

  target: the frozen target (checkpoint path or preset). tasks / max_steps / batch_size /
  optimizer / learning_rate / schedule / warmup_steps / decay_steps / weight_decay / seed: as in
  `TrainConfig`. emb_dim, num_heads, head_dim, mlp_dim: the block (0: the target's), feature_layers
  (empty: `FeatureDraftConfig.for_target`'s), head ('target' or 'own'). ttt_steps: rolled-out
  steps on the draft's own features (0: none); ttt_weight: their loss weight. start_weight: the
  start entry's loss weight (zero feature, the start token -> y_1: the first iteration's only
  entry, which has no target state yet; 0: untrained, as before it existed). block_size: G > 1
  adds the block loss (`feature_blocks`: G - 1 mask entries after every anchor, the parallel
  chain's draft call; 0: off), block_weight its weight, mask_id the masks' token (None: the
  target's pad id); both are recorded in the draft's config, which the parallel chain reads.
  head_vocab: K > 0 trains against the head restricted to the K most frequent ids of the
  training targets (the mixture's ranking, `head_vocab.select`: EOS always in), the teacher's p
  restricted to the same ids (FR-Spec / EAGLE-3's draft vocabulary): the head, most of a step's
  arithmetic for a 49k-token target, shrinks V / K times; the export keeps the full head and gets
  that ranking as its `head_ranking.json` (the mixture's only, no per-task rankings), so a run's
  `draft_head_vocab = K` drafts from the ids it trained on, whatever its task; the logged KL and
  agreement are then over those K ids. 0: the full head.
  target_states: a directory (under the output directory when relative) of the target's
  precomputed states (`training.target_states`, SpecForge's offline mode): filled on the first
  run (resumable), then every step reads its batch's states there instead of running the
  target. Decoder-only targets and head='target' only; ~n * D * 4 bytes per token (SmolLM2,
  n = 3: 6.9 kB; its 2,048 training replies: 4.1 GB). None: the target runs in every step.
  length_window: W > 1 serves each epoch's rows in windows of W batches sorted by length, each
  batch cut to its longest row (`data.rows_at`, `data.cut_batch`): the same loss a step, the same
  rows an epoch, fewer padded positions computed (SmolLM2 code replies, W = 16: 64 % of them);
  each batch's loss scaled by its share of its window's tokens (`data.batch_share`), so a token
  of a short batch weighs what one of a long batch does. 0: batches of the epoch's permutation
  at full width, as the recipes recorded before it.
  init_from: a feature draft's export (`fd_ckpt.save`, for the same target: checked) whose
  weights start every parameter of this draft with the same path and shape (`warm_start`; its
  export dtype, e.g. bfloat16, rounded into float32), the optimizer and the schedule fresh. Why:
  a second stage with another objective (more training-time-test steps: a draft trained on one
  rolled-out step keeps 0.33 of its second drafts but 0.06 of its third, SmolLM2 code, in
  sample) starts from what the first learned. A resumed run restores its own checkpoint.
  """

  target: str
  tasks: Sequence[data_lib.TaskSpec]
  max_steps: int
  batch_size: int = 32
  optimizer: str = "adamw"
  learning_rate: float = 1e-3
  schedule: str = "constant"
  warmup_steps: int = 0
  decay_steps: int = 0
  weight_decay: float = 0.0
  emb_dim: int = 0
  num_heads: int = 0
  head_dim: int = 0
  mlp_dim: int = 0
  feature_layers: Sequence[int] = ()
  head: str = "target"
  ttt_steps: int = 1
  ttt_weight: float = 1.0
  start_weight: float = 1.0
  block_size: int = 0
  block_weight: float = 1.0
  mask_id: Optional[int] = None
  head_vocab: int = 0
  target_states: Optional[str] = None
  length_window: int = 0
  seed: int = 0
  checkpoint_every: int = 100
  keep_checkpoints: int = 2
  log_every: int = 10
  max_train_seconds: Optional[float] = None
  export_dir: Optional[str] = None
  export_dtype: Optional[str] = "bfloat16"
  vocabulary: Optional[str] = None
  init_from: Optional[str] = None

  def __post_init__(self):
    if self.ttt_steps < 0 or self.ttt_weight < 0 or self.start_weight < 0:
      raise ValueError(f"ttt_steps, ttt_weight and start_weight must be >= 0, got "
                       f"{self.ttt_steps}, {self.ttt_weight}, {self.start_weight}")
    if self.block_size < 0 or self.block_size == 1 or self.block_weight < 0:
      raise ValueError(f"block_size must be 0 (off) or >= 2 and block_weight >= 0, got "
                       f"{self.block_size}, {self.block_weight}")
    if not isinstance(self.head_vocab, int) or self.head_vocab < 0:
      raise ValueError(f"head_vocab must be an integer >= 0 (0: the full head), got "
                       f"{self.head_vocab!r}")
    if self.head_vocab and self.head != "target":
      raise ValueError("head_vocab restricts the target's head: it needs head='target'")
    if not isinstance(self.length_window, int) or self.length_window < 0:
      raise ValueError(f"length_window must be an integer >= 0 (batches per length-sorted "
                       f"window; 0: off), got {self.length_window!r}")
    if self.target_states and self.head != "target":
      raise ValueError("target_states computes the teacher through the target's head copied "
                       "into the draft: it needs head='target'")
    self.optimizer_config()  # validates the shared settings

  def optimizer_config(self) -> TrainConfig:
    """The trainer's config for what the two share (optimizer, schedule, data)."""
    return TrainConfig(model=self.target, tasks=self.tasks, max_steps=self.max_steps,
                       batch_size=self.batch_size, optimizer=self.optimizer,
                       learning_rate=self.learning_rate, schedule=self.schedule,
                       warmup_steps=self.warmup_steps, decay_steps=self.decay_steps,
                       weight_decay=self.weight_decay, seed=self.seed)

  def draft_config(self, target: Any) -> FeatureDraftConfig:
    sizes = {k: getattr(self, k) for k in ("emb_dim", "num_heads", "head_dim", "mlp_dim")
             if getattr(self, k)}
    if self.feature_layers:
      sizes["feature_layers"] = tuple(self.feature_layers)
    if self.block_size:  # recorded: the parallel chain feeds the mask token trained here
      sizes.update(block_size=self.block_size,
                   mask_id=target.pad_id if self.mask_id is None else self.mask_id)
    return FeatureDraftConfig.for_target(target, head=self.head, **sizes)


def split(draft: FeatureDraft, params) -> tuple[dict, dict]:
  """(trainable, frozen): the frozen ones are the target's copied pieces."""
  frozen = {k: v for k, v in params.items() if k in draft.frozen_names()}
  return {k: v for k, v in params.items() if k not in frozen}, frozen


@dataclasses.dataclass(frozen=True)
class _Setup:
  """What the loop works with: fixed for the whole run. `draft` is what is exported (the full
  head), `trained` what the step runs (its head restricted when head_vocab > 0); `states`: the
  stored target states per task (None: the step runs the target); `ranking`: the mixture's
  token ranking when head_vocab > 0."""
  cfg: FeatureTrainConfig
  draft: FeatureDraft
  trained: FeatureDraft
  target: Model
  target_params: Any
  frozen: Any
  tasks: list
  step_fn: Any
  states: Optional[list] = None
  ranking: Optional[list] = None


def _setup(cfg: FeatureTrainConfig, output_dir: str, resuming: bool = False
           ) -> tuple[_Setup, TrainState]:
  """Loads the target, builds the draft (the target's pieces copied in; `init_from`'s weights
  unless `resuming`) and its first state."""
  target, target_params = loader.load_model(cfg.target, dtype="float32", seed=cfg.seed,
                                            weights_dtype="float32", scan_layers=False)
  draft = FeatureDraft(cfg.draft_config(target.config))
  params = draft.with_target_pieces(draft.init(jax.random.key(cfg.seed)), target_params)
  if cfg.init_from and not resuming:
    params = _warm_start(cfg, draft, params, target_params)
  vocab = tasks_lib.load_vocabulary(cfg.vocabulary, required=True)
  tasks = [data_lib.tokenize_task(s, vocab, target.config.is_encoder_decoder, "train")
           for s in cfg.tasks]
  trained, ranking = draft, None
  if cfg.head_vocab:
    ranking = training_ranking(tasks, draft.vocab_size)
    ids = head_vocab.select(ranking, cfg.head_vocab, draft.eos_id)
    trained, params = draft.restrict_head(params, ids)
  trainable, frozen = split(trained, params)
  states = _target_states(cfg, output_dir, target, target_params, draft, tasks)
  optimizer = _optimizer(cfg)
  state = TrainState(params=trainable, opt_state=optimizer.init(trainable),
                     step=jnp.int32(0), tokens=jnp.int32(0), seconds=jnp.float32(0.0))
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, CONFIG_FILE), "w", encoding="utf-8") as f:
    f.write(draft.config.to_json())
  return _Setup(cfg, draft, trained, target, target_params, frozen, tasks,
                feature_step.make_step(trained, target, cfg, optimizer), states, ranking), state


def _warm_start(cfg: FeatureTrainConfig, draft: FeatureDraft, params, target_params):
  """`params` with `cfg.init_from`'s trained weights (`FeatureTrainConfig.init_from`); the
  target's copied pieces stay the target's own float32 ones."""
  fd_ckpt.check_target(cfg.init_from, cfg.target, target_params)
  source, source_params = fd_ckpt.load(cfg.init_from, target_params)
  if source.config.feature_layers != draft.config.feature_layers:
    raise ValueError(f"init_from {cfg.init_from!r} fuses layers {source.config.feature_layers}, "
                     f"this draft {draft.config.feature_layers}: not a warm start of it")
  trained = {k: v for k, v in source_params.items() if k not in draft.frozen_names()}
  out, _ = warm_start.warm_start({k: v for k, v in params.items()
                                  if k not in draft.frozen_names()}, trained, cfg.init_from)
  return {**params, **out}


def training_ranking(tasks, vocab_size: int) -> list[int]:
  """The mixture's token ranking of the training targets (`scripts/head_ranking.py`'s
  "ranking" for the same config)."""
  freqs = data_lib.target_frequencies(tasks, vocab_size)
  return head_ranking.ranking_from_counts(data_lib.mixed_frequencies(freqs))


def _target_states(cfg: FeatureTrainConfig, output_dir: str, target: Model, target_params,
                   draft: FeatureDraft, tasks) -> Optional[list]:
  """The stored states (`training.target_states`), filled first where missing; None without."""
  if not cfg.target_states:
    return None
  if target.config.is_encoder_decoder:
    raise ValueError("target_states stores a decoder-only target's states; a T5 target's "
                     "draft also reads its encoder output: train it with target_states = None")
  directory = paths.under_run(output_dir, cfg.target_states)
  layers = target_states.stored_layers(draft.feature_layers, target.config.num_decoder_layers)
  meta = target_states.describe(cfg.target, fd_ckpt.target_digest(target_params), layers,
                                tasks, target.config.emb_dim)
  missing = target_states.rows_to_fill(directory, meta)
  if not missing:
    return target_states.open_store(directory, meta)
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel

  @jax.jit  # the params an argument: closed over, they would be compiled in as constants
  def states_fn(params, dec_BxT):
    enc, dec = data_lib.model_inputs({"decoder_input_tokens": dec_BxT})
    return target.forward_with_hidden(params, enc, dec, layers)[1]

  with tqdm(total=missing, desc="target states", unit="seq") as bar:
    return target_states.fill(directory, meta, tasks, lambda dec: states_fn(target_params, dec),
                              cfg.batch_size, bar.update)


CONFIG_FILE = "feature_draft_config.json"


def _optimizer(cfg: FeatureTrainConfig) -> optax.GradientTransformation:
  from specdec_jax.training.step import make_optimizer  # pylint: disable=import-outside-toplevel
  return make_optimizer(cfg.optimizer_config())


def train(cfg: FeatureTrainConfig, output_dir: str, *, crash_after_step: Optional[int] = None
          ) -> dict[str, Any]:
  """Trains (or resumes) into `output_dir`; returns the summary (`train_summary.json`).
  `crash_after_step` raises after that step's checkpoint logic (tests simulate a kill)."""
  output_dir = os.path.abspath(output_dir)
  manager = ocp.CheckpointManager(
      os.path.join(output_dir, "checkpoints"),
      options=ocp.CheckpointManagerOptions(max_to_keep=cfg.keep_checkpoints, create=True))
  resuming = manager.latest_step() is not None
  run_key.check_or_write(cfg, output_dir, resuming=resuming, write=True,
                         strict=run_key.FEATURE_STRICT, logged=run_key.FEATURE_LOGGED)
  run, state = _setup(cfg, output_dir, resuming=resuming)
  if resuming:
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state.to_checkpoint())
    state = TrainState.from_checkpoint(manager.restore(
        manager.latest_step(), args=ocp.args.StandardRestore(abstract)))
  log = open(os.path.join(output_dir, "metrics.jsonl"), "a", encoding="utf-8")
  try:
    state, last, stopped = _loop(run, state, manager, log, crash_after_step)
  finally:
    log.close()
    manager.wait_until_finished()
  return _finish(run, state, last, stopped, output_dir)


def _loop(run: _Setup, state: TrainState, manager, log, crash_after_step):
  """Steps to max_steps or the budget; checkpoints as configured. (state, last metrics, stopped
  by the budget)."""
  cfg, t0, seconds0 = run.cfg, time.perf_counter(), float(state.seconds)
  step, last = int(state.step), {}
  target_params = None if run.states is not None else run.target_params
  while step < cfg.max_steps:
    task_idx, rows = data_lib.rows_at(run.tasks, step, cfg.batch_size, cfg.seed,
                                      cfg.length_window)
    batch = data_lib.batch_of(run.tasks[task_idx], rows)
    if cfg.length_window > 1:
      batch = data_lib.cut_batch(batch)
      share = data_lib.batch_share(run.tasks, step, cfg.batch_size, cfg.seed, cfg.length_window)
      batch[feature_step.SHARE_KEY] = np.float32(share)
    if run.states is not None:
      width = batch["decoder_input_tokens"].shape[1]
      batch[feature_step.STATES_KEY] = np.asarray(run.states[task_idx][rows, :width])
    state, metrics = run.step_fn(state, batch, run.frozen, target_params)
    step += 1
    if step % cfg.log_every == 0 or step == cfg.max_steps:
      last = {k: float(v) for k, v in jax.device_get(metrics).items()}
      if not np.isfinite(last["loss"]):
        raise FloatingPointError(f"feature draft training: loss {last['loss']} at step {step}")
      log.write(json.dumps({"step": step, **last}) + "\n")
      log.flush()
    over = (cfg.max_train_seconds is not None
            and time.perf_counter() - t0 > cfg.max_train_seconds)
    if step % cfg.checkpoint_every == 0 or step == cfg.max_steps or over:
      state = state.replace(seconds=jnp.float32(seconds0 + time.perf_counter() - t0))
      manager.save(step, args=ocp.args.StandardSave(state.to_checkpoint()))
      manager.wait_until_finished()
    if crash_after_step is not None and step >= crash_after_step:
      raise RuntimeError(f"simulated crash after step {step}")
    if over:
      return state, last, step < cfg.max_steps
  return state, last, False


def _finish(run: _Setup, state: TrainState, last: dict, stopped: bool, output_dir: str) -> dict:
  cfg = run.cfg
  summary = {"target": cfg.target, "steps": int(state.step), "max_steps": cfg.max_steps,
             "stopped_by_time_budget": stopped, "target_tokens_seen": int(state.tokens),
             "train_seconds": round(float(state.seconds), 1),
             "trainable_params": int(sum(np.size(x) for x in jax.tree.leaves(state.params))),
             "final_train_metrics": last, "draft_config": json.loads(run.draft.config.to_json())}
  if cfg.export_dir:  # under output_dir when relative, as TrainConfig.export_path
    export = paths.under_run(output_dir, cfg.export_dir)
    paths.check_writable(export)
    fd_ckpt.save(export, run.draft, state.params,
                 target_name=cfg.target, target_params=run.target_params,
                 dtype=jnp.dtype(cfg.export_dtype) if cfg.export_dtype else None)
    if run.ranking is not None:  # the ids it trained on: `draft_head_vocab = K` picks them
      # The mixture's ranking only: with per-task rankings a run on one task would restrict the
      # head to that task's K ids, some of which the training softmax never held down.
      head_ranking.write_ranking(
          export, run.ranking, run.draft.vocab_size,
          f"token frequencies of the training targets (FeatureTrainConfig.head_vocab = "
          f"{cfg.head_vocab}: the draft trained on the first {cfg.head_vocab} of this ranking)")
    summary["export_dir"] = export
  with open(os.path.join(output_dir, "train_summary.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
  return summary
