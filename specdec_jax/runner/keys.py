"""Run keys: the names a run files its results under (batch records and prediction lines in the
store, TensorBoard runs, the remembered choice of GAMMA='auto').

Why one module: these strings are written to disk and must be the same in every place that makes
them, for a resumed run to find what an earlier process wrote. They are built here from typed
values and never parsed back: whatever needs the temperature or the draft reads it from the typed
point the key was made from.
"""
from __future__ import annotations


def group(temperature: float) -> str:
  """The batches decoded at one temperature (the AR baseline and every point share them)."""
  return f"temperature={temperature:g}"


def autoregressive(temperature: float) -> str:
  """The autoregressive run of an autoregressive-only configuration."""
  return f"autoregressive,temperature={temperature:g}"


def point(draft_name: str, gamma, temperature: float) -> str:
  """One speculative point; `gamma` is an int, 'auto' or 'adaptive' as the configuration says."""
  return f"draft={draft_name},gamma={gamma},temperature={temperature:g}"


def calibration(draft_name: str, temperature: float) -> str:
  """Where the calibration decode's acceptance of a draft and temperature is remembered."""
  return f"draft={draft_name},temperature={temperature:g}"


def auto_choice(draft_name: str, temperature: float) -> str:
  """Where the gamma chosen by GAMMA='auto' for a draft and temperature is remembered."""
  return f"draft={draft_name},temperature={temperature:g}"
