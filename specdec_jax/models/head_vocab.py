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

Where the ranking comes from: a file `head_ranking.json` in the draft's checkpoint directory,
{"ranking": [every token id, most frequent first], "tasks": {task: its own ranking}, "source":
"..."}, counted over the draft's training targets (`scripts/head_ranking.py`; for a distilled
draft those are the target's own outputs): "ranking" over the whole training mixture, "tasks" per
task of it. A run restricts with `RunConfig.draft_head_vocab = K` (0 keeps the full head): the K
first ids of its TASK's ranking (the mixture's for a task the draft was not trained on), EOS
always among them. Per task because a mixture ranking spends head rows on the other tasks'
tokens: the zoo's shared draft at K = 2048 kept alpha 0.626 on en-de with the en-de ranking and
0.606 with the mixture's (full head 0.637). The restriction is a load-time transformation
(`restrict`): the checkpoint keeps its full head, and training never sees a restricted one.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

RANKING_FILE = "head_ranking.json"
Params = Any


def ranking_from_counts(counts_V: np.ndarray) -> list[int]:
  """Every token id, most frequent first (ties, and tokens never seen, by id)."""
  counts_V = np.asarray(counts_V, np.float64)
  if counts_V.ndim != 1 or np.any(counts_V < 0):
    raise ValueError(f"counts must be a 1-D array of non-negative counts, got {counts_V.shape}")
  ids = np.arange(counts_V.shape[0])
  return np.lexsort((ids, -counts_V)).tolist()


def _check_ranking(ranking: Sequence[int], vocab_size: int, where: str) -> np.ndarray:
  r = np.asarray(ranking)
  if r.ndim != 1 or r.shape[0] != vocab_size or not np.array_equal(np.sort(r),
                                                                   np.arange(vocab_size)):
    raise ValueError(f"{where}: a head ranking must list every token id 0..{vocab_size - 1} "
                     f"exactly once (got {r.shape[0] if r.ndim == 1 else r.shape} entries)")
  return r.astype(np.int64)


def write_ranking(directory: str, ranking: Sequence[int], vocab_size: int, source: str,
                  tasks: Optional[Mapping[str, Sequence[int]]] = None) -> str:
  """Writes `directory/head_ranking.json`: the mixture's ranking and (optionally) one per task.
  Everything is validated first: nothing is written on bad input."""
  r = _check_ranking(ranking, vocab_size, "write_ranking")
  per_task = {str(t): _check_ranking(v, vocab_size, f"write_ranking (task {t})").tolist()
              for t, v in (tasks or {}).items()}
  path = os.path.join(directory, RANKING_FILE)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump({"vocab_size": vocab_size, "source": source, "ranking": r.tolist(),
               "tasks": per_task}, f)
  os.replace(tmp, path)
  return path


def read_ranking(directory: str, vocab_size: int, task: Optional[str] = None
                 ) -> tuple[np.ndarray, str]:
  """(ranking, what it counts) stored with a checkpoint: `task`'s own if the file has one, else
  the training mixture's; a clear error if there is no file or it does not fit."""
  path = os.path.join(directory, RANKING_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"draft_head_vocab needs the draft checkpoint's token ranking {path}, which does not "
        "exist; write one from the draft's training targets with scripts/head_ranking.py, or set "
        "draft_head_vocab = 0 (the full head)")
  with open(path) as f:
    record = json.load(f)
  per_task = record.get("tasks") or {}
  if task is not None and task in per_task:
    return _check_ranking(per_task[task], vocab_size, f"{path} (task {task})"), f"task {task}"
  return _check_ranking(record.get("ranking", ()), vocab_size, path), "training mixture"


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
  becomes [D, K]; everything else is the same array. Apply it before packing or sharding.
  """
  from specdec_jax.models import packed  # pylint: disable=import-outside-toplevel
  if packed.is_packed(model):
    raise ValueError("restrict the head before packing the model (models.packed.pack)")
  if model.head_ids is not None:
    raise ValueError("this model's head is already restricted")
  ids = tuple(int(t) for t in head_ids)
  v = model.vocab_size
  if not ids or list(ids) != sorted(set(ids)) or ids[0] < 0 or ids[-1] >= v:
    raise ValueError(f"head_ids must be sorted, distinct token ids in [0, {v}), got {len(ids)} ids")
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


def scatter_logits(logits_BxTxK: jax.Array, head_ids: Sequence[int], vocab_size: int) -> jax.Array:
  """[..., K] head logits -> [..., V] with -inf off the head's tokens."""
  ids_K = jnp.asarray(head_ids, jnp.int32)
  full = jnp.full(logits_BxTxK.shape[:-1] + (vocab_size,), -jnp.inf, logits_BxTxK.dtype)
  return full.at[..., ids_K].set(logits_BxTxK, indices_are_sorted=True, unique_indices=True)


def restrict_to_ranking(model, params: Params, directory: str, k: int, task: Optional[str] = None):
  """`restrict` to the K first ids of the ranking stored in `directory` for `task` (EOS kept);
  returns (model, params, what the ranking counts)."""
  ranking, counted = read_ranking(directory, model.vocab_size, task)
  return (*restrict(model, params, select(ranking, k, model.eos_id)), counted)
