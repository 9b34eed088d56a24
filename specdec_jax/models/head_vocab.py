"""A draft's output head restricted to the tokens its target writes (a frequency-ranked head).

Why: a small draft's output head is most of its decode step. The zoo's shared draft multiplies a
128 x 8192 head (4 MB of its 5.5 MB of decode weights) at every proposal, yet its target writes few
of the 8192 tokens: on the en-de training prompts its outputs use 2,482 distinct ids, and the 2,048
most frequent cover 99.7 % of its output tokens. FR-Spec (Zhao et al. 2025) restricts the draft's
head to the most frequent tokens; the draft step shrinks with the head, the target is untouched.

Exactness: the rejection sampler is exact for ANY draft distribution q (Leviathan et al., Theorem
3.5). A restricted draft's q is its softmax over the kept tokens and exactly 0 elsewhere (logit
-inf): it never proposes a token off its head, and where the target wants one, the residual
norm(max(0, p - q)) still carries all of p's mass there. Only alpha changes: a target token the
head cannot propose is a rejection.

Which tokens: the K first ids of a token ranking (`select`, EOS always among them). The rankings
are files beside a draft's checkpoint, read and written by `checkpoints.head_ranking`; this module
does no file I/O. The restriction is a load-time transformation (`restrict`): the checkpoint keeps
its full head (a feature draft may train with its frozen head restricted:
`FeatureTrainConfig.head_vocab`). The forward pass maps a restricted head's
logits back to the vocabulary with `layers.scatter_logits`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from specdec_jax.models import packed

Params = Any


def select(ranking: Sequence[int], k: int, eos_id: int) -> tuple[int, ...]:
  """The K most frequent ids, sorted; EOS replaces the K-th if the ranking put it lower (a draft
  that can never propose EOS would be rejected at the end of every sequence)."""
  vocab_size = len(ranking)
  if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= vocab_size:
    raise ValueError(f"draft_head_vocab must be an integer in [1, {vocab_size}] (or 0 for the "
                     f"full head), got {k!r}")
  ids = [int(t) for t in ranking[:k]]
  if 0 <= eos_id < vocab_size and eos_id not in ids:
    ids[-1] = eos_id
  return tuple(sorted(ids))


def restrict(model, params: Params, head_ids: Sequence[int]):
  """(model, params) whose head computes the `head_ids` columns only (the rest: logit -inf).

  A load-time transformation of a `Model` and its T5X-layout params: the head kernel [D, V]
  becomes [D, K]; everything else is the same array. Apply it before packing or sharding. A
  tied head (`config.tie_embeddings`) keeps its params: the embedding stays whole for the input
  side, and the head takes the ids' rows of it.
  """
  if packed.is_packed(model):
    raise ValueError("restrict the head before packing the model (models.packed.pack)")
  if model.head_ids is not None:
    raise ValueError("this model's head is already restricted")
  ids = tuple(int(t) for t in head_ids)
  v = model.vocab_size
  if not ids or list(ids) != sorted(set(ids)) or ids[0] < 0 or ids[-1] >= v:
    raise ValueError(f"head_ids must be sorted, distinct token ids in [0, {v}), got {len(ids)} ids")
  if model.config.tie_embeddings:  # the head is the embedding: the model reads the ids' rows
    return dataclasses.replace(model, head_ids=ids), params
  try:
    kernel_DxV = params["decoder"]["logits_dense"]["kernel"]
  except (KeyError, TypeError):
    raise ValueError("restrict: params have no decoder/logits_dense/kernel (a T5X-layout tree "
                     "is needed)") from None
  if kernel_DxV.shape[-1] != v:
    raise ValueError(f"restrict: the head kernel {kernel_DxV.shape} does not end in the "
                     f"vocabulary size {v}")
  kernel_DxK = jnp.take(jnp.asarray(kernel_DxV), jnp.asarray(ids, jnp.int32), axis=-1)
  head = dict(params["decoder"]["logits_dense"], kernel=kernel_DxK)
  decoder = dict(params["decoder"], logits_dense=head)
  return dataclasses.replace(model, head_ids=ids), dict(params, decoder=decoder)
