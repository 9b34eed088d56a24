"""Target and draft from a checkpoint path or a preset name (random init), as a run names them.

Why presets are sized here: a random-initialised preset has no vocabulary of its own, so when the
task has text to tokenize, the preset takes the run's vocabulary size (padded to 128); that lets
every local config run with presets before trained zoo checkpoints exist. The draft gets seed + 1
so a preset draft is not a copy of a preset target of the same shape.
"""
from __future__ import annotations

import os

import jax
from absl import logging

from specdec_jax.models.config import PRESETS, get_preset
from specdec_jax.models.model import Model
from specdec_jax.paths import resolve_path
from specdec_jax.runner.config import MODEL_DRAFT, DraftSpec


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
    if "assets/zoo" in path.replace(os.sep, "/"):
      raise FileNotFoundError(
          f"zoo checkpoint {spec!r} not found: the local zoo is trained by "
          "configs/local/train/*.gin (python -m specdec_jax.train ...). Until then run with random "
          "presets, e.g. --gin.TARGET_CHECKPOINT=zoo_t5_target --gin.DRAFT_CHECKPOINT=zoo_t5_draft_small")
    raise FileNotFoundError(
        f"checkpoint {spec!r} not found (also looked for {path}); give a checkpoint directory or "
        f"a preset name for random weights ({', '.join(sorted(PRESETS))})")
  from specdec_jax.checkpoints.loading import load_checkpoint  # heavy (orbax, tensorstore)
  config, params = load_checkpoint(path, dtype=dtype)
  if overrides:
    config = config.replace(**overrides)
  return Model(config), jax.device_put(in_compute_dtype(params, config.dtype))


def in_compute_dtype(params, dtype):
  """Floating weights cast to the model's compute dtype (the zoo stores bfloat16, computes float32).

  Why: weights in another dtype are cast inside every jitted call that takes them as an argument.
  The decode loops hoist that cast out of their while loop, but a lone `extend` (the cost
  calibration of GAMMA='auto') pays it per call: 27 ms instead of 3 ms for the zoo target on this
  CPU, which made c and v(T) wrong.
  """
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  target = np.dtype(dtype)

  def cast(x):  # jnp.issubdtype: numpy does not count bfloat16 as floating
    x = np.asarray(x)
    return x.astype(target) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != target else x
  return jax.tree_util.tree_map(cast, params)


def load_draft(spec: DraftSpec, target: Model, target_params, *, vocab_size: int | None,
               dtype: str | None, seed: int, tables_fn=None, target_name: str = "the target",
               head_vocab: int = 0, task: str | None = None):
  """(draft, params) for a model draft, or a model-free drafter over the target's ids.

  Model-free drafts (decoding/drafters.py) take their tables as params: `tables_fn()` supplies
  them (a saved .npz, or estimated on the task's train split: data/ngram_tables.py). Prompt lookup
  needs none (its fallback is uniform). A draft that cannot serve this target (another kind,
  another vocabulary, a shared-encoder draft trained on another target's encoder) is refused
  here, before anything is compiled. A random-preset shared-encoder draft belongs to no target
  and is only checked for the encoder's width. `head_vocab` > 0 restricts a model draft's output
  head to that many tokens of its checkpoint's ranking for `task` (`models.head_vocab`).
  """
  from specdec_jax import seam
  from specdec_jax.decoding import drafters  # pylint: disable=import-outside-toplevel
  if spec.kind == MODEL_DRAFT:
    draft, params = load_model(spec.checkpoint, vocab_size=vocab_size, dtype=dtype, seed=seed + 1)
    try:
      seam.check_pair(target, draft)
    except ValueError as e:
      raise ValueError(f"draft {spec.checkpoint!r}: {e}") from None
    if draft.shares_encoder and not is_preset(spec.checkpoint):
      from specdec_jax.checkpoints import pairing  # pylint: disable=import-outside-toplevel
      pairing.check(resolve_path(spec.checkpoint), draft_name=spec.checkpoint,
                    target_name=target_name, target_params=target_params)
    if head_vocab:
      from specdec_jax.models import head_vocab as hv  # pylint: disable=import-outside-toplevel
      if is_preset(spec.checkpoint):
        raise ValueError(f"draft_head_vocab = {head_vocab} needs a draft checkpoint with a token "
                         f"ranking; {spec.checkpoint!r} is a random preset")
      draft, params, counted = hv.restrict_to_ranking(draft, params, resolve_path(spec.checkpoint),
                                                      head_vocab, task)
      logging.info("draft %s: output head restricted to %d of %d tokens (ranking of the %s)",
                   spec.checkpoint, head_vocab, draft.vocab_size, counted)
    return draft, params
  draft = drafters.make_draft(spec.kind, target)
  if spec.kind == "prompt_lookup":
    return draft, {}
  if tables_fn is None:
    raise ValueError(f"DRAFT={spec.kind!r} needs n-gram tables (RunConfig.ngram_tables)")
  return draft, tables_fn()
