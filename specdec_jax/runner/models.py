"""Target and draft from a checkpoint path or a preset name (random init), as a run names them.

Why presets are sized here: a random-initialised preset has no vocabulary of its own, so when the
task has text to tokenize, the preset takes the run's vocabulary size (padded to 128); that lets
every local config run with presets before trained zoo checkpoints exist. The draft gets seed + 1
so a preset draft is not a copy of a preset target of the same shape.
"""
from __future__ import annotations

import os

import jax

from specdec_jax.models.config import PRESETS, get_preset
from specdec_jax.models.model import Model
from specdec_jax.runner.config import MODEL_DRAFT, DraftSpec
from specdec_jax.runner.inputs import resolve_path


def is_preset(spec: str) -> bool:
  return spec in PRESETS and not os.path.exists(spec)


def load_model(spec: str, *, vocab_size: int | None = None, dtype: str | None = None,
               seed: int = 0):
  """(Model, params) for a checkpoint path (any format `load_checkpoint` reads) or a preset."""
  overrides = {} if dtype is None else {"dtype": dtype}
  if is_preset(spec):
    if vocab_size is not None:
      overrides["vocab_size"] = vocab_size
    config = get_preset(spec, **overrides)
    model = Model(config)
    return model, jax.jit(model.init)(jax.random.key(seed))  # jit: one compile, not ~100
  path = resolve_path(spec)
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"checkpoint {spec!r} not found (also looked for {path}); give a checkpoint directory or "
        f"a preset name for random weights ({', '.join(sorted(PRESETS))})")
  from specdec_jax.checkpoints.loading import load_checkpoint  # heavy (orbax, tensorstore)
  config, params = load_checkpoint(path, dtype=dtype)
  if overrides:
    config = config.replace(**overrides)
  return Model(config), jax.device_put(params)


def load_draft(spec: DraftSpec, target: Model, target_params, *, vocab_size: int | None,
               dtype: str | None, seed: int):
  """(draft model, params) for a model draft or a non-model drafter over the target's ids."""
  if spec.kind == MODEL_DRAFT:
    return load_model(spec.checkpoint, vocab_size=vocab_size, dtype=dtype, seed=seed + 1)
  try:
    from specdec_jax.decoding import drafters  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ValueError(
        f"DRAFT={spec.kind!r} needs the non-model drafters (specdec_jax.decoding.drafters), "
        "which this installation does not have yet; use DRAFT='model'") from e
  return drafters.build(spec.kind, target=target, target_params=target_params)
