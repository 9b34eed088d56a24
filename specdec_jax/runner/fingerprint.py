"""A run's fingerprint: the settings and file contents its outputs depend on.

Why apart from `RunConfig`: resuming a killed run onto a changed configuration, checkpoint or
task file would mix results of two experiments in one metrics.json; the store (runner/store.py)
refuses a directory whose fingerprint differs. What enters is a decision about reproducibility,
not about configuration, and it grows with every knob that changes outputs (later knobs enter
only when set, so directories written before them still resume).
"""
from __future__ import annotations

import json
from typing import Any

from specdec_jax.checkpoints import identity
from specdec_jax.data import chat, tasks
from specdec_jax.paths import resolve_path


def of(cfg) -> dict[str, Any]:
  """What must not change between a killed run and its resumption (outputs depend on it)."""
  keep = ("target_checkpoint", "draft_checkpoint", "draft", "task", "split", "batch_size",
          "gamma", "temperature", "top_k", "top_p", "seed", "max_decode_length",
          "max_input_length", "vocabulary", "dtype", "rule", "mode", "ngram_tables",
          "ngram_train_examples", "calibration")
  fingerprint = {k: getattr(cfg, k) for k in keep}
  if cfg.calibration == "held_out":  # which prompts are measured depends on them
    fingerprint["auto_calibration_examples"] = cfg.auto.calibration_examples
  if cfg.sample_examples:
    fingerprint["sample_examples"] = True
  # Later knobs enter only when set, so run directories written before them still resume.
  if cfg.adaptive is not None:
    fingerprint["adaptive"] = cfg.adaptive
  if cfg.tree is not None:
    fingerprint["tree"] = cfg.tree
  if cfg.auto.each_gamma:  # the choice and the prediction come from other decodes
    fingerprint["auto_each_gamma"] = True
  if cfg.auto.trees:  # the key names its old shorthand, so earlier runs still resume
    fingerprint["tree_candidates"] = list(cfg.auto.trees)
  if cfg.matmul != "auto":
    fingerprint["matmul"] = cfg.matmul
  if cfg.draft_panels != "auto":
    fingerprint["draft_panels"] = cfg.draft_panels
  if cfg.draft_prompt_cache != "auto":
    fingerprint["draft_prompt_cache"] = cfg.draft_prompt_cache
  if cfg.draft_head_vocab:
    fingerprint["draft_head_vocab"] = cfg.draft_head_vocab
  if cfg.feature.parallel:
    fingerprint["feature_parallel"] = True
  if cfg.prompt_format != "plain":
    fingerprint["prompt_format"] = cfg.prompt_format
    fingerprint["chat_revision"] = chat.REVISION  # the turns' wording (`data.chat.REVISION`)
  if _corpus(cfg):
    fingerprint["lookup_corpus"] = cfg.lookup_corpus
  if cfg.feature.lookup_gamma:
    fingerprint["feature_lookup"] = [cfg.feature.lookup_gamma, cfg.feature.lookup_ngram]
  fingerprint["contents"] = _contents(cfg)
  task_digest = tasks.content_digest(cfg.task, cfg.split)
  if task_digest is not None:
    fingerprint["task_contents"] = task_digest
  return json.loads(json.dumps(fingerprint, default=str))


def _corpus(cfg) -> str | None:
  """The corpus index where a decoded draft reads it. Why: a config may name one for a draft it
  does not run (the HumanEval config with `--gin.DRAFT="'prompt_lookup'"`), which must resume
  the runs of that draft made without it."""
  drafts = cfg.draft if isinstance(cfg.draft, (list, tuple)) else [cfg.draft]
  return cfg.lookup_corpus if "corpus_lookup" in drafts else None


def _contents(cfg) -> dict[str, str]:
  """Digest of every local file the outputs depend on, by path: a checkpoint retrained to
  the same directory must not resume onto results of the old weights."""
  paths = [cfg.target_checkpoint, cfg.vocabulary, cfg.ngram_tables, _corpus(cfg)]
  drafts = cfg.draft_checkpoint
  paths += list(drafts) if isinstance(drafts, (list, tuple)) else [drafts]
  # Resolved as `checkpoints.loader` resolves them (a repo-relative zoo path works anywhere).
  digests = {p: identity.content_digest(resolve_path(p)) for p in paths if isinstance(p, str)}
  return {p: d for p, d in sorted(digests.items()) if d is not None}
