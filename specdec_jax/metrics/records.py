"""Typed records of what a run measured, batch by batch (what `batches.jsonl` holds, one per line).

Why typed: the published numbers are recomputed from these records (runner/collect.py), after a
resume too, so every reader must agree on what a record holds; a dataclass says it once. The JSON
form (`to_json` / `from_json`) is the on-disk format: unchanged from the untyped records, so a run
written before still resumes.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional

AR = "ar"  # the JSON key of a batch's autoregressive program


@dataclasses.dataclass(frozen=True)
class ProgramRecord:
  """One timed program on one batch.

  seconds: median wall time of one call (compile excluded, `specdec_jax.timing`).
  counters: the decode's counter totals over the batch's real rows (`acceptance_stats.counters_to_dict`).
  gamma: the gamma the program ran with (speculative points; None for the baseline).
  """

  seconds: float
  counters: Mapping[str, Any]
  gamma: Optional[int] = None

  @property
  def emitted(self) -> int:
    return int(self.counters["emitted"])

  def to_json(self) -> dict[str, Any]:
    out = {"seconds": self.seconds, "emitted": self.emitted, "counters": dict(self.counters)}
    if self.gamma is not None:
      out["gamma"] = self.gamma
    return out

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> "ProgramRecord":
    counters = dict(d.get("counters") or {})
    counters.setdefault("emitted", d["emitted"])
    return cls(seconds=float(d["seconds"]), counters=counters, gamma=d.get("gamma"))


@dataclasses.dataclass(frozen=True)
class BatchRecord:
  """One decoded batch: which examples, and each program's record (points by run key)."""

  group: str
  indices: tuple[int, ...]
  points: Mapping[str, ProgramRecord]
  autoregressive: Optional[ProgramRecord] = None

  def to_json(self) -> dict[str, Any]:
    return {"group": self.group, "indices": list(self.indices),
            "points": {k: p.to_json() for k, p in self.points.items()},
            AR: None if self.autoregressive is None else self.autoregressive.to_json()}

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> "BatchRecord":
    return cls(group=d["group"], indices=tuple(d["indices"]),
               points={k: ProgramRecord.from_json(p) for k, p in d.get("points", {}).items()},
               autoregressive=None if d.get(AR) is None else ProgramRecord.from_json(d[AR]))
