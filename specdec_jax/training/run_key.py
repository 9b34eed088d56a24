"""What a resumed training run must share with the run it continues, checked before any step.

Why: resuming is exact only if the batches (tasks, batch size, seed, vocabulary, the contents
of generated-sequence tasks, the on-policy fraction and sampling temperature) and the loss
(teacher and its weights, distillation weight, temperature and divergence) are the ones the
checkpoint was trained with; a changed seed or a teacher re-exported to the same path would
otherwise continue silently with other data or another target. Those refuse to resume, as do another model or
optimizer (whose state would not restore). Budgets, export, evaluation, mesh and microbatching (the
same update) may change freely; the learning-rate schedule, weight decay, z-loss and activation
dtype may change too (lowering the learning rate of a resumed run is common) but are logged as a
warning.

The key is `run_key.json` in the output directory, written when the run starts without a
checkpoint. Settings added after runs were started (`_DEFAULTS`) compare against their default
when an older key lacks them: such a run was trained with the default.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from absl import logging

from specdec_jax.checkpoints import identity
from specdec_jax.data import vocabulary
from specdec_jax.training import seqdata

FILE = "run_key.json"
_STRICT = ("model", "tasks", "batch_size", "seed", "vocabulary", "teacher", "distill_weight",
           "distill_temperature", "optimizer", "divergence", "jsd_beta", "on_policy_fraction",
           "on_policy_temperature", "init_from")
# What a key written before these settings existed implies: the behaviour of that time.
_DEFAULTS = {"divergence": "fkl", "jsd_beta": 0.5, "on_policy_fraction": 0.0,
             "on_policy_temperature": 1.0, "tasks_contents": None, "init_from": None,
             "init_from_contents": None, "decay_steps": 0}
_LOGGED = ("learning_rate", "schedule", "warmup_steps", "decay_steps", "weight_decay", "z_loss",
           "dtype")


# A feature draft's run (`FeatureTrainConfig`): its target, data and loss (the rolled-out steps,
# the start and block losses, the restricted head, the length windows) and its block's shape.
FEATURE_STRICT = ("target", "tasks", "batch_size", "seed", "vocabulary", "optimizer",
                  "init_from", "emb_dim", "num_heads", "head_dim", "mlp_dim", "feature_layers",
                  "head", "ttt_steps", "ttt_weight", "start_weight", "block_size",
                  "block_weight", "mask_id", "head_vocab", "length_window")
FEATURE_LOGGED = ("learning_rate", "schedule", "warmup_steps", "decay_steps", "weight_decay")


def run_key(cfg, strict: tuple = _STRICT, logged: tuple = _LOGGED) -> dict[str, Any]:
  """The resume key of a `TrainConfig` (JSON-able); a `FeatureTrainConfig`'s with
  `FEATURE_STRICT` / `FEATURE_LOGGED`."""
  key = {k: getattr(cfg, k) for k in strict + logged}
  key["tasks"] = [dataclasses.asdict(t) for t in cfg.tasks]
  for task in key["tasks"]:  # added later: a key without it was trained with its default
    if task.get("loss_on") == "all":
      del task["loss_on"]
  key["teacher_contents"] = identity.content_digest(getattr(cfg, "teacher", None))
  key["init_from_contents"] = identity.content_digest(cfg.init_from)
  generated = [seqdata.content_digest(t.name) if seqdata.is_generated(t.name) else None
               for t in cfg.tasks]
  key["tasks_contents"] = generated if any(g is not None for g in generated) else None
  key["vocabulary_contents"] = identity.content_digest(
      str(cfg.vocabulary or vocabulary.DEFAULT_VOCAB_PATH))
  return json.loads(json.dumps(key, default=str))


def check_or_write(cfg, output_dir: str, *, resuming: bool, write: bool,
                   strict: tuple = _STRICT, logged: tuple = _LOGGED) -> None:
  """Raises if a resumed run's strict keys differ; logs the changed tolerated ones (`logged`).

  A run started before keys existed has no file: it is resumed unchecked and its key written.
  """
  path = os.path.join(output_dir, FILE)
  key = run_key(cfg, strict, logged)
  if resuming and os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      old = json.load(f)
    old = {**{k: v for k, v in _DEFAULTS.items() if k in key}, **old}
    changed = sorted(k for k in set(key) | set(old) if key.get(k) != old.get(k))
    refused = [k for k in changed if k not in logged]
    if refused:
      raise ValueError(
          f"{output_dir} holds a run trained with different {refused} (now "
          f"{ {k: key.get(k) for k in refused} }, was { {k: old.get(k) for k in refused} }); "
          "resuming would not continue the same data or loss: use a new --output_dir")
    for k in changed:
      logging.warning("resuming %s with %s = %r (was %r)", output_dir, k, key.get(k), old.get(k))
  if write and (not resuming or not os.path.exists(path)):
    os.makedirs(output_dir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(key, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
