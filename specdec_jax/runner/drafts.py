"""A run's drafts: a model draft checked against its target, or a model-free drafter's tables.

Why a module of its own: a draft is more than a model load (`checkpoints.loader`, the one door for
models). A draft that cannot serve this target (another kind, another vocabulary, a shared-encoder
draft trained on another target's encoder) is refused here, before anything is compiled; a head
restriction (`RunConfig.draft_head_vocab`) is applied here; and a model-free drafter takes n-gram
tables as its params. A preset draft gets seed + 1, so it is not a copy of a preset target of the
same shape.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import numpy as np
from absl import logging

from specdec_jax import seam
from specdec_jax.checkpoints import feature_draft_io as feature_ckpt
from specdec_jax.checkpoints import head_ranking, loader, pairing
from specdec_jax.data import corpus_index, tasks
from specdec_jax.models import model_free
from specdec_jax.models.model import Model
from specdec_jax.paths import resolve_path
from specdec_jax.runner import schedule
from specdec_jax.runner.run_config import (AUTO, FEATURE_DRAFT, MODEL_DRAFT, TREE, DraftSpec,
                                           RunConfig, as_list)


@dataclasses.dataclass(frozen=True)
class DraftSettings:
  """How a run loads its model drafts (`loader.load_model`'s arguments, and the head).

  Attributes:
    vocab_size: a random preset's vocabulary (the run's, padded); None keeps the preset's.
    dtype: the compute dtype; None keeps the checkpoint's.
    seed: the run's seed (a preset draft is initialised with seed + 1).
    head_vocab: > 0 restricts the draft's output head to that many tokens of its checkpoint's
      ranking (`checkpoints.head_ranking`); 0 keeps the full head, and so does a checkpoint
      with no ranking beside it (one warning line; a random preset is refused).
    task: whose ranking (the task the run's TASK stands for, `data.tasks.standing_for`; the
      mixture's if the file has none for it).
    feature_parallel: the run decodes a feature-level draft's chain in blocks (here:
      a warning when the draft was not block-trained; the drafter is `draft_schemes.plan`'s).
    lookup_corpus: DRAFT='corpus_lookup''s corpus index (.npz of scripts/corpus_index.py).
    panels: the run's `draft_panels` ('int8' / 'q4': a model draft reads a byte / 5 bits per
      weight, so even the target itself is a cheaper draft: the size warning compares bytes).
  """
  vocab_size: Optional[int] = None
  dtype: Optional[str] = None
  seed: int = 0
  head_vocab: int = 0
  task: Optional[str] = None
  feature_parallel: bool = False
  lookup_corpus: Optional[str] = None
  panels: str = "auto"

  @classmethod
  def for_run(cls, cfg: RunConfig, preset_vocab: Optional[int], examples=()) -> DraftSettings:
    """A run's settings; `examples` (the run's) tell which task a JSONL TASK stands for."""
    return cls(vocab_size=preset_vocab, dtype=cfg.dtype, seed=cfg.seed,
               head_vocab=cfg.draft_head_vocab, task=tasks.standing_for(cfg.task, examples),
               feature_parallel=cfg.feature.parallel, lookup_corpus=cfg.lookup_corpus,
               panels=cfg.draft_panels)


def load_draft(spec: DraftSpec, target: Model, target_params, settings: DraftSettings, *,
               tables_fn=None, target_name: str = "the target"):
  """(draft, params) for a model draft, or a model-free drafter over the target's ids.

  Model-free drafts (models/model_free.py) take their tables as params: `tables_fn()` supplies
  them (a saved .npz, or estimated on the task's train split; see `ngram_tables`). Prompt lookup
  needs none (its fallback is uniform). A random-preset shared-encoder draft belongs to no target
  and is only checked for the encoder's width.
  """
  if spec.kind == MODEL_DRAFT:
    return _model_draft(spec.checkpoint, target, target_params, settings, target_name)
  if spec.kind == FEATURE_DRAFT:
    return feature_draft(spec.checkpoint, target, target_params, settings, target_name)
  draft = model_free.make_draft(spec.kind, target)
  if spec.kind == "prompt_lookup":
    return draft, {}
  if spec.kind == "corpus_lookup":
    return draft, corpus_params(settings.lookup_corpus, target)
  if tables_fn is None:
    raise ValueError(f"DRAFT={spec.kind!r} needs n-gram tables (RunConfig.ngram_tables)")
  return draft, tables_fn()


def corpus_params(path: Optional[str], target) -> dict:
  """The corpus-lookup draft's params: its index, checked against the target's vocabulary."""
  if not path:
    raise ValueError("DRAFT='corpus_lookup' needs RunConfig.lookup_corpus: a corpus index "
                     "(.npz) written by scripts/corpus_index.py (api.load takes the .npz itself "
                     "as its draft)")
  resolved = resolve_path(path)
  try:
    index, meta = corpus_index.load_index(resolved)
  except (OSError, ValueError) as e:
    raise ValueError(f"RunConfig.lookup_corpus {path!r}: cannot read a corpus index ({e})") from None
  if meta.get("vocab_size", target.vocab_size) != target.vocab_size:
    raise ValueError(f"RunConfig.lookup_corpus {path!r} was built over a vocabulary of "
                     f"{meta['vocab_size']} ids; the target has {target.vocab_size}")
  try:
    corpus_index.check_index(index, target.vocab_size)
  except ValueError as e:
    raise ValueError(f"RunConfig.lookup_corpus {path!r}: {e}") from None
  logging.info("corpus lookup: %d n-grams (n <= %d) from %s", index["corpus_keys"].shape[0],
               index["corpus_grams"].shape[1], meta.get("source", path))
  return {k: jax.device_put(v) for k, v in index.items()}


def _model_draft(checkpoint: str, target: Model, target_params, settings: DraftSettings,
                 target_name: str):
  draft, params = loader.load_model(checkpoint, vocab_size=settings.vocab_size,
                                    dtype=settings.dtype, seed=settings.seed + 1)
  try:
    seam.check_pair(target, draft)
  except ValueError as e:
    raise ValueError(f"draft {checkpoint!r}: {e}") from None
  _warn_if_larger(checkpoint, params, target_name, target_params, settings.panels)
  if draft.shares_encoder and not loader.is_preset(checkpoint):
    pairing.check(resolve_path(checkpoint), draft_name=checkpoint, target_name=target_name,
                  target_params=target_params)
  if not settings.head_vocab:
    return draft, params
  if loader.is_preset(checkpoint):
    raise ValueError(f"draft_head_vocab = {settings.head_vocab} needs a draft checkpoint with a "
                     f"token ranking; {checkpoint!r} is a random preset")
  where = loader.local_path(checkpoint) or resolve_path(checkpoint)  # a fetched name: its cache
  if not head_ranking.has_ranking(where):
    # Swapping the draft is one binding: a checkpoint without a ranking (converted, or freshly
    # trained) decodes with its full head, exact either way, and says so in one line.
    logging.warning("draft %s has no %s beside it: decoding with its full output head, "
                    "draft_head_vocab = %d not applied (scripts/head_ranking.py writes one)",
                    checkpoint, head_ranking.RANKING_FILE, settings.head_vocab)
    return draft, params
  draft, params, counted = head_ranking.restrict_to_ranking(
      draft, params, where, settings.head_vocab, settings.task)
  logging.info("draft %s: output head restricted to %d of %d tokens (ranking of the %s)",
               checkpoint, settings.head_vocab, draft.vocab_size, counted)
  return draft, params


def feature_draft(checkpoint: str, target: Model, target_params, settings: DraftSettings,
                  target_name: str):
  """(FeatureDraft, params on the default device) of a feature-level draft's checkpoint, refused
  unless it was trained on this very target (`checkpoints.feature_draft_io.check_target`: a
  digest of every target parameter; another target of the same shape would run and draft noise).

  Its output head is a frozen copy of the target's whole head; `draft_head_vocab` = K restricts
  it to the K first ids of the `head_ranking.json` beside the checkpoint (`restrict_head`), as
  for a model draft; without a ranking it keeps the full head (one warning line)."""
  path = resolve_path(checkpoint)
  draft, params = feature_ckpt.load(path, target_params)
  try:
    seam.check_pair(target, draft)
    _check_feature_shapes(target, draft)
  except ValueError as e:
    raise ValueError(f"feature draft {checkpoint!r}: {e}") from None
  feature_ckpt.check_target(path, target_name, target_params)
  if settings.dtype is not None and settings.dtype != draft.config.dtype:
    draft = type(draft)(draft.config.replace(dtype=settings.dtype))
    params = loader.in_compute_dtype(params, settings.dtype)
  if settings.feature_parallel:
    if not draft.config.block_size:
      logging.warning("feature draft %s decodes with the parallel chain but was not trained for "
                      "it (no block_size in its config): exact, low acceptance past x_1",
                      checkpoint)
  if settings.head_vocab and not head_ranking.has_ranking(path):
    logging.warning("feature draft %s has no %s beside it: decoding with the target's full "
                    "head, draft_head_vocab = %d not applied", checkpoint,
                    head_ranking.RANKING_FILE, settings.head_vocab)
  elif settings.head_vocab:
    draft, params, counted = head_ranking.restrict_to_ranking(draft, params, path,
                                                              settings.head_vocab, settings.task)
    logging.info("feature draft %s: output head restricted to %d of %d tokens (ranking of the "
                 "%s)", checkpoint, settings.head_vocab, draft.vocab_size, counted)
  return draft, jax.device_put(params)


def _check_feature_shapes(target, draft) -> None:
  """The target must give the states the draft reads (`extend_with_hidden` at its layers, of
  its width)."""
  if not hasattr(target, "extend_with_hidden"):
    raise ValueError(f"the target ({type(target).__name__}) has no extend_with_hidden: a "
                     "feature-level draft reads the target's hidden states")
  cfg = getattr(target, "config", None)
  layers = getattr(cfg, "num_decoder_layers", None)
  if layers is not None and max(draft.feature_layers) > layers:
    raise ValueError(f"it reads the target's layer {max(draft.feature_layers)}, the target has "
                     f"{layers} decoder layers")
  if cfg is not None and draft.config.target_dim != cfg.emb_dim:
    raise ValueError(f"it reads states of width {draft.config.target_dim}, the target is "
                     f"{cfg.emb_dim} wide")


def chain_options(cfg: RunConfig) -> dict:
  """How the run builds a draft's chain: `draft_schemes.plan`'s options (a feature-level draft's
  parallel chain and prompt lookup where it matches; a token draft's prompt cache), the same at
  every program it builds."""
  return dict(dataclasses.asdict(cfg.feature), prompt_cache=cfg.draft_prompt_cache)


def check_feature_run(cfg: RunConfig, specs) -> None:
  """The run's question to `schedule.check`, before anything is loaded: its feature-level
  draft's chain options (`RunConfig.feature`) against its GAMMAs and the
  trees it decodes ('tree') or weighs ('auto')."""
  gammas = as_list(cfg.gamma)
  trees = ([cfg.tree_scheme()] if TREE in gammas else []) + list(
      cfg.tree_candidate_schemes() if AUTO in gammas else [])
  schedule.check(gammas, feature=next((s.name for s in specs if s.kind == FEATURE_DRAFT), None),
                 parallel=cfg.feature.parallel, lookup_gamma=cfg.feature.lookup_gamma,
                 trees=trees, model=any(s.kind == MODEL_DRAFT for s in specs))
  if cfg.feature.lookup_gamma and AUTO in gammas and not cfg.auto.each_gamma:
    # one decode at the calibration gamma has one lookup share and one mix of lookup and draft
    # acceptances: each candidate's prediction needs its own (runner/lookup_mix.py)
    raise ValueError("GAMMA='auto' with prompt lookup first (RunConfig.feature_lookup_gamma) "
                     "needs RunConfig.auto_each_gamma = True: each candidate gamma's lookup "
                     "share and acceptance come from its own calibration decode")


def _warn_if_larger(checkpoint: str, params, target_name: str, target_params,
                    panels: str = "auto") -> None:
  """One warning when the draft's weights are at least as many bytes as its target's (int8
  panels: a quarter of a float32 draft's, q4 5/32; the quantized target itself is a draft, the
  int8 or q4 self-draft).

  Why: a swapped pair (the target named as the draft) ran silently at c = 11.9 and a predicted
  0.03x; the cost calibration warns later, this says it before anything is compiled.
  """
  count = lambda tree: sum(int(np.size(x)) for x in jax.tree.leaves(tree))
  n_draft, n_target = count(params), count(target_params)
  if n_draft * {"int8": 8 / 32, "q4": 5 / 32}.get(panels, 1.0) >= n_target:
    logging.warning("draft %s has %s parameters, at least as many as target %s (%s): each "
                    "draft step will cost about as much as a target step, so speculation cannot "
                    "pay; were the two swapped?", checkpoint, f"{n_draft:,}", target_name,
                    f"{n_target:,}")
