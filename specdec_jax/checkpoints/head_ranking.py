"""A draft checkpoint's token ranking (`head_ranking.json`): written, read, and applied at load.

Why here and not in models/: the ranking is a file stored beside a checkpoint, like the pairing
record (`checkpoints.pairing`); models/ holds the pure restriction (`models.head_vocab.select`,
`restrict`) and does no file I/O.

The file: {"ranking": [every token id, most frequent first], "tasks": {task: its own ranking},
"source": "...", "vocab_size": V}, counted over the draft's training targets
(`scripts/head_ranking.py`; for a distilled draft those are the target's own outputs): "ranking"
over the whole training mixture, "tasks" per task of it. A run restricts with
`RunConfig.draft_head_vocab = K` (0 keeps the full head): the K first ids of its TASK's ranking
(the mixture's for a task the draft was not trained on), EOS always among them. Per task because a
mixture ranking spends head rows on the other tasks' tokens: the zoo's shared draft at K = 2048
kept alpha 0.626 on en-de with the en-de ranking and 0.606 with the mixture's (full head 0.637).
Checkpoint digests leave the file out (`checkpoints.identity.SIDECARS`), so writing one later does
not stop a run that started from that checkpoint from resuming.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np

from specdec_jax import paths
from specdec_jax.models import head_vocab

RANKING_FILE = "head_ranking.json"
Params = Any


def ranking_from_counts(counts_V: np.ndarray) -> list[int]:
  """Every token id, most frequent first (ties, and tokens never seen, by id)."""
  counts_V = np.asarray(counts_V, np.float64)
  if counts_V.ndim != 1 or np.any(counts_V < 0):
    raise ValueError(f"counts must be a 1-D array of non-negative counts, got {counts_V.shape}")
  ids_V = np.arange(counts_V.shape[0])
  return np.lexsort((ids_V, -counts_V)).tolist()


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
  Everything is validated first: nothing is written on bad input, nor into the shipped assets."""
  paths.check_writable(directory, "a head ranking")
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


def has_ranking(directory: str) -> bool:
  """Whether a checkpoint directory has its ranking beside it (a run restricts the head only
  then; without one it decodes with the full head)."""
  return os.path.isfile(os.path.join(directory, RANKING_FILE))


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


def restrict_to_ranking(model, params: Params, directory: str, k: int, task: Optional[str] = None):
  """`head_vocab.restrict` to the K first ids of the ranking stored in `directory` for `task`
  (EOS kept); returns (model, params, what the ranking counts). A feature-level draft restricts
  its own head (`FeatureDraft.restrict_head`: the same columns of the target's head)."""
  ranking, counted = read_ranking(directory, model.vocab_size, task)
  ids = head_vocab.select(ranking, k, model.eos_id)
  if hasattr(model, "restrict_head"):
    return (*model.restrict_head(params, ids), counted)
  return (*head_vocab.restrict(model, params, ids), counted)
