"""A draft checkpoint's token ranking file (`specdec_jax.checkpoints.head_ranking`).

Why these tests: a run restricts a draft's head to the K first ids of the ranking stored beside
its checkpoint, so the file must give a run its task's own ranking (the mixture's otherwise),
refuse a ranking that does not list every token exactly once, write nothing on bad input, and
say how to make one when it is missing. The restriction itself: tests/models/test_head_vocab.py.
"""
import os

import numpy as np
import pytest

from specdec_jax.checkpoints import head_ranking as hr
from specdec_jax.testing import tiny_pair


def test_ranking_from_counts_orders_ties_by_id():
  assert hr.ranking_from_counts(np.array([1, 5, 0, 5, 2])) == [1, 3, 4, 0, 2]
  with pytest.raises(ValueError, match="non-negative counts"):
    hr.ranking_from_counts(np.array([1, -1]))


def test_write_and_read(tmp_path):
  ranking = [4, 2, 7, 0, 1, 3, 5, 6]
  own = [1, 0, 2, 3, 4, 5, 6, 7]
  hr.write_ranking(str(tmp_path), ranking, 8, "test", tasks={"translate_en_de": own})
  # A run on a task the file ranks gets that task's ranking, any other task the mixture's.
  got, what = hr.read_ranking(str(tmp_path), 8, "translate_en_de")
  np.testing.assert_array_equal(got, own)
  assert what == "task translate_en_de"
  for task in ("summarize", None):
    got, what = hr.read_ranking(str(tmp_path), 8, task)
    np.testing.assert_array_equal(got, ranking)
    assert what == "training mixture"
  with pytest.raises(ValueError, match="every token id 0..8"):
    hr.read_ranking(str(tmp_path), 9)
  sub = tmp_path / "sub"
  sub.mkdir()
  with pytest.raises(ValueError, match="exactly once"):
    hr.write_ranking(str(sub), [0, 0, 1], 3, "test")
  with pytest.raises(ValueError, match="task x"):
    hr.write_ranking(str(sub), [0, 1, 2], 3, "test", tasks={"x": [0, 1]})
  assert not os.listdir(sub)  # nothing written on bad input
  with pytest.raises(FileNotFoundError, match="scripts/head_ranking.py"):
    hr.read_ranking(str(tmp_path / "none"), 8)


def test_restrict_to_ranking_keeps_eos(tmp_path):
  _, _, draft, dp = tiny_pair("t5", vocab_size=64)
  hr.write_ranking(str(tmp_path), list(range(63, -1, -1)), 64, "test")
  small, sp, counted = hr.restrict_to_ranking(draft, dp, str(tmp_path), 4)
  assert counted == "training mixture"
  assert small.head_ids == tuple(sorted((61, 62, 63, draft.eos_id)))
  assert sp["decoder"]["logits_dense"]["kernel"].shape[-1] == 4
