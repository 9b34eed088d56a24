"""N-gram tables: estimation equals direct counting, the disk cache, and the run's and the
scripts' ways in.

Why these tests: a wrong count or a stale cache never makes an output wrong (the drafts are only
proposals), it silently costs acceptance; and the run and the scripts must get the same tables
from the same data, so both ways in are checked against `tables_for_examples`.
"""
import types

import numpy as np
import pytest

from specdec_jax.data import local_tasks, ngram_tables as nt
from specdec_jax.models import ngram

DECODER = types.SimpleNamespace(kind="decoder", vocab_size=16, pad_id=0, eos_id=1)


def test_tables_equal_direct_counts():
  rng = np.random.default_rng(0)
  v = 9
  seqs = [rng.integers(2, v, size=rng.integers(1, 12)).tolist() for _ in range(40)]
  t = nt.build_ngram_tables(seqs, v, top_k=v, add_alpha=0.5, prior=2.0, bos_id=0, eos_id=1)
  streams = [[0] + s + [1] for s in seqs]
  uni = np.zeros(v)
  big = np.zeros((v, v))
  for s in streams:
    for a, b in zip(s[:-1], s[1:]):
      big[a, b] += 1
    for x in s[1:]:
      uni[x] += 1
  u = (uni + 0.5) / (uni.sum() + 0.5 * v)
  np.testing.assert_allclose(np.exp(t["log_unigram"]), u, rtol=1e-6)
  want = (big + 2.0 * u[None, :]) / (big.sum(1, keepdims=True) + 2.0)
  np.testing.assert_allclose(ngram.bigram_matrix(t), want, rtol=1e-5, atol=1e-7)
  # Truncated rows (top 2 continuations kept) still sum to one and keep the two most frequent.
  t2 = nt.build_ngram_tables(seqs, v, top_k=2, bos_id=0, eos_id=1)
  np.testing.assert_allclose(ngram.bigram_matrix(t2).sum(1), 1.0, rtol=1e-5)
  for a in range(v):
    if big[a].sum():
      assert big[a, t2["next_ids"][a, 0]] == big[a].max()


def _ids_task(tmp_path):
  path = tmp_path / "ids.jsonl"
  path.write_text('{"input_ids": [5, 6, 7, 5, 6]}\n{"input_ids": [5, 6, 9]}\n')
  return path


def test_draft_params_from_a_task_file_are_cached(tmp_path, monkeypatch):
  monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
  path = _ids_task(tmp_path)
  params = nt.draft_params(DECODER, task=str(path))
  m = ngram.bigram_matrix({k: np.asarray(x) for k, x in params.items()})
  assert np.argmax(m[5]) == 6 and np.argmax(m[6]) == 7
  assert list((tmp_path / "cache" / "ngram").glob("*.npz"))  # cached for the next run
  again = nt.draft_params(DECODER, task=str(path))
  np.testing.assert_array_equal(np.asarray(again["next_ids"]), np.asarray(params["next_ids"]))
  uniform = nt.draft_params(DECODER, task=str(path), needs_tables=False)
  np.testing.assert_allclose(ngram.bigram_matrix({k: np.asarray(x) for k, x in uniform.items()}),
                             1.0 / 16, rtol=1e-5)


def test_draft_params_from_an_npz_and_the_vocabulary_check(tmp_path):
  tables = nt.tables_for_examples(local_tasks.load_examples(_ids_task(tmp_path)), None, DECODER)
  nt.save_tables(tmp_path / "t.npz", tables)
  params = nt.draft_params(DECODER, tables=str(tmp_path / "t.npz"))
  np.testing.assert_array_equal(np.asarray(params["next_ids"]), tables["next_ids"])
  with pytest.raises(ValueError, match="draft tables have vocabulary 16, the target 32"):
    nt.draft_params(types.SimpleNamespace(**{**vars(DECODER), "vocab_size": 32}), tables=tables)


def test_tables_for_run_estimates_or_loads(tmp_path):
  examples = local_tasks.load_examples(_ids_task(tmp_path))
  logged = []
  tables = nt.tables_for_run(None, lambda: (examples, "two lines"), None, DECODER,
                             log=logged.append)
  assert logged == ["n-gram tables estimated on 2 examples of two lines"]
  want = nt.tables_for_examples(examples, None, DECODER)
  np.testing.assert_array_equal(np.asarray(tables["next_ids"]), want["next_ids"])
  nt.save_tables(tmp_path / "t.npz", want)
  loaded = nt.tables_for_run(str(tmp_path / "t.npz"), None, None, DECODER)
  np.testing.assert_array_equal(np.asarray(loaded["next_counts"]), want["next_counts"])
  text_only = [local_tasks.Example(index=0, inputs="no ids, no reference")]
  with pytest.raises(ValueError, match=r"no token streams .* \(the run's own prompts\)"):
    nt.tables_for_run(None, lambda: (text_only, "the run's own prompts"), None, DECODER)
