"""Table math of the model-free drafts: n-gram tables as the dense matrices they stand for.

Estimating, caching and loading tables is data work (`specdec_jax.data.ngram_tables`; decoding
never reads a file) and the drafts read them as params (`model_free.table_logits`). What stays is
the math tests of the loop need: the dense bigram a table means, and tables meaning a given one.

The tables (float32 / int32): log_unigram [V], next_ids [V, K], next_counts [V, K], backoff [V],
total [V]: the params of `model_free.UnigramDraft`, `BigramDraft` and `PromptLookupDraft`.
"""
from __future__ import annotations

import numpy as np


def bigram_matrix(tables: dict[str, np.ndarray]) -> np.ndarray:
  """The dense [V, V] bigram q(x | prev) of `tables` (tests and small vocabularies)."""
  v = tables["log_unigram"].shape[0]
  u = np.exp(tables["log_unigram"].astype(np.float64))
  m = tables["backoff"][:, None].astype(np.float64) * u[None, :]
  np.add.at(m, (np.arange(v)[:, None], tables["next_ids"]), tables["next_counts"])
  return m / tables["total"][:, None]


def dense_bigram_params(matrix_VxV: np.ndarray) -> dict[str, np.ndarray]:
  """Tables whose bigram is exactly the row-stochastic `matrix_VxV` (K = V, no smoothing left):
  a `BigramDraft` over them is a context-dependent model of known law (distribution tests)."""
  m = np.asarray(matrix_VxV, np.float64)
  v = m.shape[0]
  if m.shape != (v, v) or np.any(m < 0) or not np.allclose(m.sum(1), 1.0, atol=1e-6):
    raise ValueError("need a row-stochastic [V, V] matrix")
  tiny = 1e-30  # the unigram's weight in each row: numerically nothing
  return {"log_unigram": np.full(v, -np.log(v), np.float32),
          "next_ids": np.tile(np.arange(v, dtype=np.int32), (v, 1)),
          "next_counts": m.astype(np.float32), "backoff": np.full(v, tiny, np.float32),
          "total": np.full(v, 1.0 + tiny, np.float32)}
