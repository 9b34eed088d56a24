"""What a training run is (`TrainConfig`): the one object gin binds for `specdec_jax.train`.

Why its own module: the trainer (training/trainer.py) is the loop; the settings, their defaults
and their validation are read by the run key (training/run_key.py), the generation and on-policy
code and the tests as well, and a setting is checked once, when the config is made.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from specdec_jax import paths
from specdec_jax.training import data as data_lib
from specdec_jax.training import divergences

OPTIMIZERS = ("adafactor", "adamw")
SCHEDULES = ("constant", "rsqrt", "cosine", "wsd")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything a training run needs (gin binds it in `specdec_jax.train`).

  Attributes:
    model: a preset name (random init, e.g. 't5_1_1_small') or a checkpoint path in any format
      `load_checkpoint` reads (fine-tuning).
    tasks: the mixture (`TaskSpec`s: task name or JSONL path, weight, lengths).
    max_steps: total optimizer steps (a resumed run continues up to it).
    batch_size: examples per step.
    optimizer: 'adafactor' (T5's) or 'adamw'.
    learning_rate: peak learning rate.
    schedule: 'constant', 'rsqrt' (T5: lr * sqrt(warmup / max(step, warmup))), 'cosine' or
      'wsd' (warm-up, stable, decay: constant, then a (1 - sqrt) cool-down to 0 over the last
      `decay_steps` steps; Hägele et al. 2024). 'wsd' suits a run resumed past its plan: keep
      training at the constant rate, then add the cool-down by raising max_steps.
    warmup_steps: linear warm-up steps (rsqrt: the constant phase length).
    decay_steps: 'wsd' only: the cool-down's length, ending at max_steps.
    weight_decay: AdamW's decoupled weight decay.
    z_loss: T5X's auxiliary log Z penalty.
    teacher: checkpoint of the model to distil from; None trains on data alone.
    distill_weight: loss = w * D(teacher || student) + (1 - w) * cross-entropy.
    distill_temperature: softmax temperature of both distributions in the divergence D.
    divergence: D: 'fkl' (forward KL, the zoo's first recipe), 'rkl' (reverse KL), 'jsd'
      (generalised JSD(jsd_beta)) or 'tvd' (total variation, = 1 - acceptance rate).
    jsd_beta: beta of JSD(beta) = beta KL(p || m) + (1 - beta) KL(q || m), m = beta p +
      (1 - beta) q; strictly between 0 and 1.
    on_policy_fraction: DistillSpec's lambda: the fraction of steps (chosen from (seed, step))
      whose decoder sequences are the student's own continuations of the batch's prompts,
      generated with its current parameters; needs a teacher and an encoder-decoder model.
    on_policy_temperature: the student's sampling temperature for those (0: greedy).
    seed: parameter init (for presets) and data order.
    checkpoint_every: steps between train-state checkpoints.
    keep_checkpoints: how many train-state checkpoints to keep.
    log_every: steps between TensorBoard / log lines.
    max_train_seconds: stop (with a checkpoint) once this much training time has passed in this
      process; None for no limit.
    export_dir: where the final weights are written as a specdec checkpoint (config beside them):
      a relative path lies under the run's output directory (the recipes' 'export' is
      OUTPUT_DIR/export), so no recipe can write over the shipped zoo; an absolute path or a URL
      as given; None exports nothing. `export_path` resolves it.
    export_dtype: dtype of the exported weights ('bfloat16' halves the size; load as float32).
    eval_examples: valid-split examples per task for the validation loss (0 to skip).
    eval_every: steps between validation losses written to TensorBoard while training (`valid/`
      per task, as the final one), so a long run shows its progress; 0 for the final one only.
    vocabulary: SentencePiece model file for local tasks, a Hugging Face tokenizer.json (or the
      checkpoint directory holding it, or a fetched checkpoint's name); None for the shipped 8k
      vocabulary
      (seqio tasks always use their own).
    mesh: a `sharding.MeshConfig` (gin/mesh/*.gin): train sharded with the target rules on that
      mesh; None trains on one device.
    num_microbatches: split each batch into this many slices and accumulate their gradients (one
      optimizer step per batch, as T5X's `num_microbatches`).
    dtype: activation dtype ('bfloat16' on TPU, as T5X); params and optimizer state stay float32.
    init_from: a checkpoint whose parameters initialise every parameter of `model` with the same
      path and shape (the rest keep their random init), on a fresh run: a shared-encoder draft
      starts from a standalone draft's decoder, embedding and head. None: `model`'s own weights.
  """
  model: str
  tasks: Sequence[data_lib.TaskSpec]
  max_steps: int
  batch_size: int = 32
  optimizer: str = "adafactor"
  learning_rate: float = 1e-2
  schedule: str = "constant"
  warmup_steps: int = 0
  decay_steps: int = 0
  weight_decay: float = 0.0
  z_loss: float = 1e-4
  teacher: str | None = None
  distill_weight: float = 1.0
  distill_temperature: float = 1.0
  seed: int = 0
  checkpoint_every: int = 200
  keep_checkpoints: int = 2
  log_every: int = 20
  max_train_seconds: float | None = None
  export_dir: str | None = None
  export_dtype: str | None = "bfloat16"
  eval_examples: int = 256
  eval_every: int = 0
  vocabulary: str | None = None
  mesh: Any = None
  num_microbatches: int = 1
  dtype: str = "float32"
  divergence: str = "fkl"
  jsd_beta: float = 0.5
  on_policy_fraction: float = 0.0
  on_policy_temperature: float = 1.0
  init_from: str | None = None

  def __post_init__(self):
    _check_numbers(self)
    if self.optimizer not in OPTIMIZERS:
      raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {OPTIMIZERS}")
    if self.schedule not in SCHEDULES:
      raise ValueError(f"unknown schedule {self.schedule!r}; choose one of {SCHEDULES}")
    if self.schedule == "wsd" and not 0 < self.decay_steps <= self.max_steps - self.warmup_steps:
      raise ValueError(f"schedule 'wsd' needs 0 < decay_steps <= max_steps - warmup_steps, got "
                       f"decay_steps={self.decay_steps}, max_steps={self.max_steps}, "
                       f"warmup_steps={self.warmup_steps}")
    if self.max_steps < 1 or self.batch_size < 1:
      raise ValueError(f"max_steps and batch_size must be >= 1, got {self.max_steps}, "
                       f"{self.batch_size}")
    if not 0.0 <= self.distill_weight <= 1.0:
      raise ValueError(f"distill_weight must lie in [0, 1], got {self.distill_weight}")
    divergences.check(self.divergence, self.jsd_beta)
    if not 0.0 <= self.on_policy_fraction <= 1.0:
      raise ValueError(f"on_policy_fraction must lie in [0, 1], got {self.on_policy_fraction}")
    if self.on_policy_fraction > 0.0 and not self.teacher:
      raise ValueError(f"on_policy_fraction is {self.on_policy_fraction} but no teacher is named: "
                       "on-policy distillation scores the student's sequences with the teacher")
    if not self.on_policy_temperature >= 0.0:
      raise ValueError(f"on_policy_temperature must be >= 0 (0: greedy), got "
                       f"{self.on_policy_temperature}")
    if not self.tasks:
      raise ValueError("TrainConfig.tasks is empty: name at least one TaskSpec")
    if self.eval_every < 0:
      raise ValueError(f"eval_every must be >= 0 (0: only the final validation), got "
                       f"{self.eval_every}")
    if self.num_microbatches < 1 or self.batch_size % self.num_microbatches:
      raise ValueError(f"num_microbatches ({self.num_microbatches}) must be >= 1 and divide "
                       f"batch_size ({self.batch_size})")

  def export_path(self, output_dir: str) -> str | None:
    """Where the export goes (`paths.under_run`), None without one."""
    return paths.under_run(output_dir, self.export_dir) if self.export_dir else None


# (name, lower bound, whether the bound itself is allowed): every float setting must be finite.
_FLOAT_RANGES = (("learning_rate", 0.0, False), ("weight_decay", 0.0, True),
                 ("z_loss", 0.0, True), ("distill_temperature", 0.0, False),
                 ("on_policy_temperature", 0.0, True))
_INT_MINIMA = (("warmup_steps", 0), ("decay_steps", 0), ("checkpoint_every", 1),
               ("keep_checkpoints", 1), ("log_every", 1), ("eval_examples", 0))


def _check_numbers(cfg: TrainConfig) -> None:
  """Every numeric setting finite and in range, before anything is loaded or written.

  Why: a learning rate of NaN or inf trained "successfully" (loss NaN), exported NaN weights,
  and that export then drafted with alpha NaN (`x > 0` is False for NaN, so each check is
  written to fail on it).
  """
  for name, low, closed in _FLOAT_RANGES:
    value = float(getattr(cfg, name))
    ok = math.isfinite(value) and (value >= low if closed else value > low)
    if not ok:
      raise ValueError(f"TrainConfig.{name} must be finite and {'>=' if closed else '>'} {low}, "
                       f"got {value}")
  for name, low in _INT_MINIMA:
    if int(getattr(cfg, name)) < low:
      raise ValueError(f"TrainConfig.{name} must be >= {low}, got {getattr(cfg, name)}")
  if cfg.max_train_seconds is not None and not (math.isfinite(cfg.max_train_seconds)
                                                and cfg.max_train_seconds > 0):
    raise ValueError(f"TrainConfig.max_train_seconds must be None or finite and > 0, got "
                     f"{cfg.max_train_seconds}")
