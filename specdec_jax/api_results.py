"""What the public API's calls return: `Generation` (one decode of a list of prompts) and
`Benchmark` (the same prompts decoded by the target alone and speculatively, timed interleaved).

Why a module of its own: these are plain records with derived figures (alpha, tokens per call,
speedup), read by callers and by `api.Pair`; keeping them apart leaves `api.py` to loading and
decoding. `specdec_jax.api` re-exports both.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from specdec_jax.metrics import acceptance_stats


@dataclasses.dataclass(frozen=True)
class Generation:
  """What `Pair.generate` returns; lists follow the order of the prompts given.

  Attributes:
    texts: the generated text per prompt, detokenized up to EOS; None when the target's ids are
      not the vocabulary's (a model of another vocabulary, fed ids).
    ids: the generated token ids per prompt, EOS included when it was generated.
    counters: the loop's on-device counters summed over the prompts
      (`metrics.acceptance_stats.counters_to_dict`): drafted, accepted, emitted, target_calls,
      beta_sum and beta_count (alpha's sums), iterations, accepts_per_position,
      accepted_length_hist.
    seconds: wall time of the decode, compilation excluded (from `Pair.benchmark`: the sum over
      batches of the median of its interleaved repeats, as a run reports it).
    compile_seconds: time spent compiling new programs in this call (None from `benchmark`).
    gamma: draft tokens per target call (0: the target alone; the adaptive maximum; a tree's
      node count less the root, its `TreeScheme.gamma`).
    temperature: the sampling temperature (0: greedy).
  """

  texts: Optional[list[str]]
  ids: list[list[int]]
  counters: dict
  seconds: float
  compile_seconds: Optional[float]
  gamma: int
  temperature: float

  @property
  def summary(self) -> dict:
    """alpha, acceptance_rate, tokens_per_target_call, accepts_per_position, ... (as a run's
    metrics.json names them; None where undefined, e.g. alpha without a draft)."""
    return acceptance_stats.summarize(self.counters)

  @property
  def alpha(self) -> Optional[float]:
    """Mean over generated positions of sum_x min(p, q) (Leviathan et al.'s alpha)."""
    return self.summary["alpha"]

  @property
  def acceptance_rate(self) -> Optional[float]:
    """Accepted draft tokens / drafted tokens."""
    return self.summary["acceptance_rate"]

  @property
  def tokens_per_call(self) -> Optional[float]:
    """Tokens written per target call (1.0 for the target alone)."""
    return self.summary["tokens_per_target_call"]


@dataclasses.dataclass(frozen=True)
class Benchmark:
  """What `Pair.benchmark` returns: both decodes of the same prompts, timed interleaved."""

  autoregressive: Generation
  speculative: Generation

  @property
  def speedup(self) -> float:
    """Autoregressive wall time / speculative wall time (a run's `speedup`)."""
    return self.autoregressive.seconds / self.speculative.seconds

  @property
  def greedy_match_rate(self) -> float:
    """Fraction of prompts whose speculative output equals the autoregressive one (1.0 at
    temperature 0 for an exact decode)."""
    pairs = list(zip(self.speculative.ids, self.autoregressive.ids))
    return sum(a == b for a, b in pairs) / len(pairs)
