"""Which prompts calibrate a run and which prompts it reports: disjoint, seeded, representative.

Why: a run chooses gamma ('auto') and predicts its speedup from a calibration decode and timed
loops, then measures. When the calibration prompts were the first prompts of the measured set,
the choice and the prediction were fitted to the prompts they were judged on (and the first
prompts of the en-de split are easier than the split: alpha 0.788 on the first 24, 0.691 over
the split), so neither the prediction nor the reported speedup carried to new prompts. Here:
- `calibration='held_out'` (the default): the calibration prompts are drawn by the run's seed from
  the split and never reported; the measured prompts are drawn from the rest. A prediction is
  then made on other prompts than the measurement it is compared with.
- `sample=True` draws the measured prompts uniformly (seeded) from the split instead of taking the
  first ones, so NUM_EXAMPLES prompts stand for the split, not for its head.
- `calibration='in_sample'` reproduces the old behaviour (the first measured prompts calibrate):
  for tasks too small to spare prompts (the 6-prompt smoke task), and said so in the record.
Pure functions of positions, so the same config picks the same prompts on every process and on
resume.
"""
from __future__ import annotations

import dataclasses

import numpy as np

CALIBRATION_MODES = ("held_out", "in_sample")


@dataclasses.dataclass(frozen=True)
class PromptSets:
  """Positions (into the task's examples) of the measured and the calibration prompts."""

  measured: tuple[int, ...]
  calibration: tuple[int, ...]
  held_out: bool


def choose(total: int, *, num_examples: int | None, calibration_examples: int,
           calibration: str = "held_out", sample: bool = False, seed: int = 0) -> PromptSets:
  """The prompt sets of a split of `total` examples.

  held_out: `calibration_examples` positions drawn by `seed` are calibration only; the measured
  positions are the first `num_examples` of the others (all of them if None), or a seeded uniform
  draw of that many with `sample`, in task order. in_sample: the measured positions as above from
  the whole split, and the calibration positions are their first `calibration_examples`.
  """
  if calibration not in CALIBRATION_MODES:
    raise ValueError(f"calibration must be one of {CALIBRATION_MODES}, got {calibration!r}")
  if calibration_examples < 1:
    raise ValueError(f"calibration_examples must be >= 1, got {calibration_examples}")
  rng = np.random.default_rng([seed, 0x5EED])
  held_out = calibration == "held_out"
  cal = sorted(rng.choice(total, size=min(calibration_examples, total), replace=False).tolist()
               ) if held_out else []
  rest = np.setdiff1d(np.arange(total), cal)
  if rest.size == 0:
    raise ValueError(f"the task has {total} example(s), all taken by the {len(cal)} held-out "
                     "calibration prompts; lower RunConfig.auto_calibration_examples or use "
                     "RunConfig.calibration='in_sample'")
  n = rest.size if num_examples is None else min(num_examples, rest.size)
  measured = sorted(rng.choice(rest, size=n, replace=False).tolist()) if sample else \
      rest[:n].tolist()
  if not held_out:
    cal = measured[:calibration_examples]
  return PromptSets(tuple(int(i) for i in measured), tuple(int(i) for i in cal), held_out)
