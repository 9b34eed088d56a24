"""Results written as they go, and resumption of a killed run without losing or duplicating work.

Why two append-only files: `predictions.jsonl` holds one line per (run, example) and
`batches.jsonl` one line per completed batch (its example indices, timings and counter totals).
A batch counts as done only once its `batches.jsonl` line is on disk; it is written (flushed and
fsynced) after the batch's predictions. On resume, a torn last line is dropped, predictions of
batches without a record (killed in between) or seen twice are dropped, and the run continues
with the examples no record names. Metrics are always computed from these files, so a resumed
run's metrics cover every example exactly once.

`run_state.json` pins what must not change between the two processes (the config fingerprint,
and the gamma chosen by GAMMA='auto', which depends on timings that differ between processes),
and records that the run finished (`finished`, once metrics.json is written): a re-run of a
finished run prints its stored results instead of re-measuring costs beside the first run's
decode (`collect.finished_metrics`).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from specdec_jax.metrics.records import BatchRecord

PREDICTIONS = "predictions.jsonl"
BATCHES = "batches.jsonl"
STATE = "run_state.json"


def _read_lines(path: str) -> list[dict[str, Any]]:
  """Parsed JSON lines; a torn (unparsable) line, e.g. from a kill mid-write, is skipped."""
  if not os.path.exists(path):
    return []
  out = []
  with open(path) as f:
    for line in f:
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return out


def _rewrite(path: str, records: Iterable[Mapping[str, Any]]) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  os.replace(tmp, path)


class ResultStore:
  """Append-only results of one output directory."""

  def __init__(self, output_dir: str, fingerprint: Mapping[str, Any], resume: bool = True):
    self.output_dir = output_dir
    os.makedirs(output_dir, exist_ok=True)
    self._paths = {n: os.path.join(output_dir, n) for n in (PREDICTIONS, BATCHES, STATE)}
    if not resume:
      for p in self._paths.values():
        if os.path.exists(p):
          os.remove(p)
    self.state = self._load_state(dict(fingerprint))
    self.batches = _read_lines(self._paths[BATCHES])
    done = {(b["group"], i) for b in self.batches for i in b["indices"]}
    seen, kept = set(), []
    for p in _read_lines(self._paths[PREDICTIONS]):
      key = (p.get("run"), p.get("index"))
      if (p.get("group"), p.get("index")) in done and key not in seen:
        seen.add(key)
        kept.append(p)
    self.predictions = kept
    _rewrite(self._paths[BATCHES], self.batches)
    _rewrite(self._paths[PREDICTIONS], self.predictions)
    self._save_state()

  # ---- state ------------------------------------------------------------------------------------
  def _load_state(self, fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The directory's state, or a new one (`self.fresh`: nothing of an earlier run is kept)."""
    path = self._paths[STATE]
    self.fresh = True
    if os.path.exists(path):
      with open(path) as f:
        state = json.load(f)
      old = state.get("fingerprint", {})
      if "task_contents" not in old:  # written before runs recorded their data's digest
        fingerprint = {k: v for k, v in fingerprint.items() if k != "task_contents"}
      if old != fingerprint and not _read_lines(self._paths[BATCHES]):
        # The run that wrote this state finished no batch (it failed first): no result to
        # protect, so it has no claim on the directory; start over with this configuration.
        return {"fingerprint": fingerprint, "gammas": {}, "calibration": {}}
      if old != fingerprint:
        changed = sorted(k for k in set(fingerprint) | set(old) if fingerprint.get(k) != old.get(k))
        why = ""
        if "contents" in changed and "contents" not in old:
          why = (" (written before runs recorded their checkpoints' contents, so it cannot be "
                 "checked that the weights are the same)")
        elif "task_contents" in changed:
          why = " (the task's data changed at the same path)"
        elif "contents" in changed:
          why = " (the files of a checkpoint, vocabulary or n-gram table changed at the same path)"
        raise ValueError(
            f"{self.output_dir} holds results of a different configuration (changed: {changed})"
            f"{why}; use a new --output_dir, or --gin.RunConfig.resume=False to start over")
      self.fresh = False
      return state
    return {"fingerprint": fingerprint, "gammas": {}, "calibration": {}}

  def _save_state(self) -> None:
    tmp = self._paths[STATE] + ".tmp"
    with open(tmp, "w") as f:
      json.dump(self.state, f, indent=2, sort_keys=True)
    os.replace(tmp, self._paths[STATE])

  def snapshot(self) -> dict[str, Any]:
    """The state and batch records (what `restore` needs to continue where this store is)."""
    return {"state": self.state, "batches": self.batches}

  def restore(self, snapshot: Mapping[str, Any]) -> None:
    """Adopts another store's `snapshot` (a multi-host follower mirrors process 0's store)."""
    self.state = dict(snapshot["state"])
    self.batches = [dict(b) for b in snapshot["batches"]]
    _rewrite(self._paths[BATCHES], self.batches)
    self._save_state()

  def remember(self, section: str, key: str, value: Any) -> None:
    self.state.setdefault(section, {})[key] = value
    self._save_state()

  def recall(self, section: str, key: str, default: Any = None) -> Any:
    return self.state.get(section, {}).get(key, default)

  # ---- results ----------------------------------------------------------------------------------
  def done_indices(self, group: str) -> set[int]:
    return {i for b in self.batches if b["group"] == group for i in b["indices"]}

  def add_batch(self, record: BatchRecord, predictions: Iterable[Mapping[str, Any]]) -> None:
    """Appends the batch's predictions, then (durably) its record, which marks it done."""
    predictions = list(predictions)
    record = record.to_json()
    with open(self._paths[PREDICTIONS], "a") as f:
      for p in predictions:
        f.write(json.dumps(p) + "\n")
      f.flush()
    with open(self._paths[BATCHES], "a") as f:
      f.write(json.dumps(record) + "\n")
      f.flush()
      os.fsync(f.fileno())
    self.predictions.extend(predictions)
    self.batches.append(dict(record))

  def group_batches(self, group: str) -> list[BatchRecord]:
    return [BatchRecord.from_json(b) for b in self.batches if b["group"] == group]

  def run_predictions(self, run: str) -> list[dict[str, Any]]:
    return sorted((p for p in self.predictions if p.get("run") == run), key=lambda p: p["index"])
