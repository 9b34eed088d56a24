"""Whether a token draft reads the target's cache (`TokenDrafter.prompt_cache`).

'own': the draft prefills the prompt itself. 'target': it starts from the target's cache, its own
entries only from the first generated token on. 'shared': it has no cache of its own and drafts
in the target's, a chain only (`speculative.handoff`): each iteration it reads every verified
position's target entries and writes its drafts into the slots the verify call then overwrites,
so it is never behind (no pending token, nothing to catch up after an iteration it did not
draft: `lookup_token`) and the loop carries one cache. 'auto' (the default): 'target' for a
self-draft (`is_self_draft`: the target's architecture; in practice its own checkpoint in a
cheaper layout such as int8 panels, whose cache has the target's shapes and nearly its values),
else 'own'.
Why: a draft's prefill is as many weights times as many prompt tokens as the target's; a
self-draft's doubled each summary's prompt (SmolLM2, ~1,600-token documents: 383 ms a request
before the first token against 192) and 'auto' declined it on the held-out documents. The
target's values are the better context (the function the draft approximates); exactness never
depends on what the draft read (the verifier uses the q it drew from).
"""
from __future__ import annotations

import dataclasses

from specdec_jax.decoding.feature_entries import is_feature_draft

PROMPT_CACHES = ("auto", "own", "target", "shared")


def _cache_layout(model):
  """(kind, layers, key-value heads, head width, dtype, scan) of a model's decode cache; None for
  a draft without one of that kind (model-free, feature-level)."""
  cfg = getattr(model, "config", None)
  if not hasattr(cfg, "kv_heads") or is_feature_draft(model):
    return None
  return (cfg.kind, cfg.num_decoder_layers, cfg.kv_heads, cfg.head_dim, cfg.dtype,
          cfg.scan_layers)


def has_cache(draft) -> bool:
  """Whether `draft` is a model token draft (a decode cache of keys and values; not a
  model-free or feature-level draft)."""
  return draft is not None and _cache_layout(draft) is not None


def same_cache(target, draft) -> bool:
  """Whether `draft`'s decode cache is laid out as `target`'s (so it can start from it)."""
  layout = _cache_layout(draft)
  return layout is not None and layout == _cache_layout(target)


def is_self_draft(target, draft) -> bool:
  """Whether `draft` has `target`'s architecture (its `ModelConfig`, a tied head counted as
  untied: int8 panels untie it, `models.packed`): a draft of the target's own size is worth
  running only as the target's own weights in a cheaper layout."""
  if not same_cache(target, draft):
    return False
  untied = lambda cfg: dataclasses.replace(cfg, tie_embeddings=False)
  return untied(target.config) == untied(draft.config)


def check(mode: str, target, draft) -> None:
  """Refuses an unknown mode, and 'target' / 'shared' for a draft laid out otherwise."""
  if mode not in PROMPT_CACHES:
    raise ValueError(f"TokenDrafter.prompt_cache must be one of {PROMPT_CACHES}, got {mode!r}")
  if mode in ("target", "shared") and not same_cache(target, draft):
    raise ValueError(f"prompt_cache={mode!r} needs a model draft whose cache is laid out as the "
                     "target's (a self-draft: the target's checkpoint in another weight layout); "
                     f"(kind, layers, kv heads, head width, dtype, scan): target "
                     f"{_cache_layout(target)}, draft {_cache_layout(draft)}")


def reads_target_cache(mode: str, target, draft) -> bool:
  """Whether a decode in `mode` starts `draft` from `target`'s cache of the prompt."""
  return is_self_draft(target, draft) if mode == "auto" else mode in ("target", "shared")


def target_start(target_cache, cache_len: int):
  """The draft's cache after the prompt: the target's, whose slots must be the draft's."""
  if target_cache.length != cache_len:
    raise ValueError(f"prompt_cache='target': the target's cache has {target_cache.length} "
                     f"slots, the draft needs {cache_len}")
  return target_cache
