"""The trainer's state as one typed pytree, and its on-disk layout.

Why a type: the jitted train step, the checkpoint, the on-policy sampler, the evaluator and the
summary all read the same five fields; a `flax.struct` dataclass names them once (a misspelt
field is an error, not a silent new dict entry) and is still a pytree, so the step jits, donates
and shards it leaf by leaf exactly as it did the dict it replaces.
Why the checkpoint stays a dict: Orbax checkpoints written before this type existed hold
{"params", "opt_state", "step", "tokens", "seconds"}, runs resume from them, and tools read them
by key; `to_checkpoint` / `from_checkpoint` keep that layout.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax


@flax.struct.dataclass
class TrainState:
  """Everything a resumed run needs to continue bit for bit (the data order is (seed, step)).

  Attributes:
    params: the trained model's parameters (float32).
    opt_state: the optimizer's state (sharded like the parameter each leaf belongs to).
    step: int32 scalar, optimizer updates applied so far.
    tokens: int32 scalar, target tokens trained on so far.
    seconds: float32 scalar, wall-clock training seconds over every resume, as of the last
      checkpoint.
  """
  params: Any
  opt_state: Any
  step: jax.Array
  tokens: jax.Array
  seconds: jax.Array

  def to_checkpoint(self) -> dict[str, Any]:
    """The Orbax checkpoint's tree: a dict keyed by field name, in field order."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

  @classmethod
  def from_checkpoint(cls, tree: dict[str, Any]) -> TrainState:
    names = {f.name for f in dataclasses.fields(cls)}
    if set(tree) != names:
      raise ValueError(f"a train-state checkpoint holds {sorted(tree)}; expected {sorted(names)}")
    return cls(**tree)
