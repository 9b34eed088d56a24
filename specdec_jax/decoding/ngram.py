"""Table math of the model-free drafts: n-gram tables as the dense matrices they stand for.

Why here and so little: the drafts (`drafters.py`) take their tables as params and read them with
`drafters.table_logits`; estimating, caching, saving and loading tables is data work and lives in
`specdec_jax.data.ngram_tables` (decoding never reads a file or a task). What stays is the math
on a table that tests and distribution checks of the decode loop need: the dense bigram a table
means, and tables that mean a given dense bigram exactly.

The tables (float32 / int32): log_unigram [V], next_ids [V, K], next_counts [V, K], backoff [V],
total [V]: the params of `drafters.UnigramDraft`, `BigramDraft` and `PromptLookupDraft`.
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
  """Tables whose bigram is exactly the row-stochastic `matrix_VxV` (K = V, no smoothing left).

  For small vocabularies: a `BigramDraft` over these params is a context-dependent model whose
  exact law is known, e.g. a cheap target for distribution tests of the whole loop.
  """
  m = np.asarray(matrix_VxV, np.float64)
  v = m.shape[0]
  if m.shape != (v, v) or np.any(m < 0) or not np.allclose(m.sum(1), 1.0, atol=1e-6):
    raise ValueError("need a row-stochastic [V, V] matrix")
  tiny = 1e-30  # the unigram's weight in each row: numerically nothing
  return {"log_unigram": np.full(v, -np.log(v), np.float32),
          "next_ids": np.tile(np.arange(v, dtype=np.int32), (v, 1)),
          "next_counts": m.astype(np.float32), "backoff": np.full(v, tiny, np.float32),
          "total": np.full(v, 1.0 + tiny, np.float32)}
