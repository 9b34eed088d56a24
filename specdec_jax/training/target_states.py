"""The frozen target's states of every training sequence, computed once and read by every epoch.

Why: a feature draft's training step ran the whole target on its batch (SmolLM2-135M: 8 x 320
tokens, ~0.7 TFLOP of the ~1.6 a step cost on 2 cores), and the same 2,048 sequences came back
every 256 steps: a 3,000-step run paid for the same target passes twelve times. This is
SpecForge's "offline" mode for EAGLE-3: the target runs once per sequence, its states at the
draft's feature layers and at its last layer are stored, and a step reads them
(`feature_trainer`: the teacher's next-token logits come from the stored last-layer state through
the draft's copy of the target's final norm and head, which are the target's own arrays).

The store (a directory): one float32 array per task, `task<i>.npy` [N, T, n, D] (T = the task's
decoder inputs, n = the layers of `stored_layers`), memory-mapped, so a batch reads its rows
and the page cache keeps what fits; `meta.json`, what the states are of (target, layers, each
task's name, shape and the SHA-256 of its token ids): a store made from other data is refused
by name, never read; `progress.json`, how many rows of each task are written. Filling resumes
from `progress.json` (rows are written, flushed, then counted), so a killed fill loses at most
one batch and duplicates nothing; the directory's lock refuses a second writer.

The fill runs the rows shortest first, each batch cut to its longest row (`fill_order`,
rounded up by `data.cut_width`), and leaves zeros past the batch's width (at or after each of
its rows' last token). Why: the target is causal, so a row's states do not depend on the padding
after it, and no loss reads a padded position (`loss_weights` is 0 there, and a position's draft
output depends only on earlier ones). SmolLM2's code replies (640 tokens wide, median 313) cost
~38 % fewer target positions sorted and cut (widths in multiples of 64) than in row order at
full width; the states of real positions are the full pass's up to float rounding (a matmul of
another width may sum in another order).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from typing import Any, Callable, Optional

import numpy as np

from specdec_jax import lock
from specdec_jax.training import data as data_lib

META_FILE = "meta.json"
PROGRESS_FILE = "progress.json"
ORDER = "length"  # `fill_order`'s; an earlier store filled in row order says "index" (or nothing)
Params = Any


def stored_layers(feature_layers: Sequence[int], num_layers: int) -> tuple[int, ...]:
  """The draft's feature layers, then the last layer's output if it is not one of them (the
  teacher's logits are computed from it)."""
  layers = tuple(int(i) for i in feature_layers)
  return layers if num_layers in layers else layers + (num_layers,)


def describe(target_name: str, target_digest: str, layers: Sequence[int], tasks,
             width: int) -> dict:
  """What a store holds: the fingerprint `meta.json` keeps and `open_store` checks (the
  target's weights by digest: a target re-converted or fine-tuned under the same name would
  otherwise be trained against its old states)."""
  return {"target": target_name, "target_digest": target_digest,
          "layers": [int(i) for i in layers], "width": int(width), "order": ORDER,
          "tasks": [{"name": t.spec.name, "rows": int(t.size),
                     "length": int(t.targets_NxL.shape[1]) - 1,
                     "sha256": hashlib.sha256(np.ascontiguousarray(t.targets_NxL)).hexdigest()}
                    for t in tasks]}


def fill_order(targets_NxL: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(rows shortest first, each row's length in decoder inputs): a row's length runs to its
  last non-pad token (pad = 0, as `data.batch_of`'s loss weights read it), at most T = L - 1;
  the sort is stable, so the order is a function of the data `meta.json` fingerprints."""
  lengths_N = np.clip(data_lib.row_lengths(targets_NxL), 1, targets_NxL.shape[1] - 1)
  return np.argsort(lengths_N, kind="stable"), lengths_N


def _array_path(directory: str, i: int) -> str:
  return os.path.join(directory, f"task{i}.npy")


def _write_json(path: str, value: Any) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=1)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def _check_meta(directory: str, meta: dict) -> None:
  with open(os.path.join(directory, META_FILE), encoding="utf-8") as f:
    have = json.load(f)
  for key in ("target", "target_digest", "layers", "width", "tasks"):
    if have.get(key) != meta[key]:  # "order" is checked where it matters: a partial fill
      raise ValueError(f"target states in {directory} were computed for another {key} "
                       f"({have.get(key)!r}, this run: {meta[key]!r}); give the run another "
                       "target_states directory or delete this one")


def fill(directory: str, meta: dict, tasks, states_fn: Callable[[np.ndarray], np.ndarray],
         batch_size: int, progress: Optional[Callable[[int], None]] = None
         ) -> list[np.ndarray]:
  """Computes what is missing of the store and returns its arrays (read-only memory maps).

  `states_fn(decoder_inputs [B, T]) -> [B, T, n, width]` float32: the target's states at the
  stored layers (the caller jits it). `progress(rows)` is called after each written batch."""
  os.makedirs(directory, exist_ok=True)
  with lock.hold(directory, "target-state fill"):
    meta_path = os.path.join(directory, META_FILE)
    if os.path.exists(meta_path):
      _check_meta(directory, meta)
    else:
      leftovers = sorted(f for f in os.listdir(directory)
                         if f == PROGRESS_FILE or (f.startswith("task") and f.endswith(".npy")))
      if leftovers:
        raise ValueError(f"{directory} holds {leftovers} but no {META_FILE}: states of unknown "
                         "data; delete them or give the run another target_states directory")
      _check_space(directory, meta)
      _write_json(meta_path, meta)
    done = _read_progress(directory, len(tasks))
    _check_resumable_order(directory, meta, done)
    for i, task in enumerate(tasks):
      path, shape = _array_path(directory, i), _shape(meta, i)
      if os.path.exists(path):
        out = _check_array(np.lib.format.open_memmap(path, mode="r+"), shape, path)
      else:
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
      order_N, lengths_N = fill_order(task.targets_NxL)
      for start in range(done[i], shape[0], batch_size):
        rows_B = np.sort(order_N[start:start + batch_size])
        width = data_lib.cut_width(int(lengths_N[rows_B].max()), shape[1])
        inputs_BxW = task.targets_NxL[rows_B, :width]
        out[rows_B, :width] = np.asarray(states_fn(inputs_BxW), np.float32)
        out.flush()
        done[i] = start + len(rows_B)
        _write_json(os.path.join(directory, PROGRESS_FILE), done)
        if progress is not None:
          progress(len(rows_B))
      del out
  return open_store(directory, meta)


def _check_resumable_order(directory: str, meta: dict, done: list[int]) -> None:
  """A partial store filled in another order cannot be resumed in this one (its counts are
  prefixes of that order); a full one is the same data in either."""
  with open(os.path.join(directory, META_FILE), encoding="utf-8") as f:
    have = json.load(f).get("order", "index")
  if have != meta["order"] and any(d != t["rows"] for d, t in zip(done, meta["tasks"])):
    raise ValueError(f"target states in {directory} were partly filled in {have} order by an "
                     f"earlier version; this one fills in {meta['order']} order: delete the "
                     "directory and let the run fill it again")


def open_store(directory: str, meta: dict) -> list[np.ndarray]:
  """The store's arrays, read-only memory maps; refuses a store of other data or one not full."""
  if not os.path.exists(os.path.join(directory, META_FILE)):
    raise FileNotFoundError(f"no target states in {directory} (training fills them first)")
  _check_meta(directory, meta)
  done = _read_progress(directory, len(meta["tasks"]))
  arrays = []
  for i, task in enumerate(meta["tasks"]):
    if done[i] != task["rows"]:
      raise ValueError(f"target states in {directory}: task {task['name']!r} has {done[i]} of "
                       f"{task['rows']} rows (re-run the training command to finish the fill)")
    path = _array_path(directory, i)
    arrays.append(_check_array(np.load(path, mmap_mode="r"), _shape(meta, i), path))
  return arrays


def _shape(meta: dict, i: int) -> tuple[int, int, int, int]:
  task = meta["tasks"][i]
  return (task["rows"], task["length"], len(meta["layers"]), meta["width"])


def _check_array(array: np.ndarray, shape: tuple, path: str) -> np.ndarray:
  if array.shape != shape or array.dtype != np.float32:
    raise ValueError(f"{path} holds {array.dtype} {array.shape}, not float32 {shape} as its "
                     f"{META_FILE} says; delete the store and let the run fill it again")
  return array


def rows_to_fill(directory: str, meta: dict) -> int:
  """How many rows a fill of `directory` still has to compute (all of them for a new store)."""
  if not os.path.exists(os.path.join(directory, META_FILE)):
    return sum(t["rows"] for t in meta["tasks"])
  _check_meta(directory, meta)
  done = _read_progress(directory, len(meta["tasks"]))
  return sum(t["rows"] - d for t, d in zip(meta["tasks"], done))


def _read_progress(directory: str, count: int) -> list[int]:
  path = os.path.join(directory, PROGRESS_FILE)
  if not os.path.exists(path):
    return [0] * count
  with open(path, encoding="utf-8") as f:
    done = json.load(f)
  if not isinstance(done, list) or len(done) != count:
    raise ValueError(f"{path} is not a list of {count} row counts: {done!r}")
  return [int(d) for d in done]


def _check_space(directory: str, meta: dict) -> None:
  need = (sum(t["rows"] * t["length"] for t in meta["tasks"]) * len(meta["layers"])
          * meta["width"] * 4)
  free = shutil.disk_usage(directory).free
  if need > free:
    raise OSError(f"target states need {need / 2**30:.1f} GiB in {directory}, which has "
                  f"{free / 2**30:.1f} GiB free; point target_states at a larger disk")
