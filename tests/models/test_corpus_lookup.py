"""The corpus-lookup draft (REST-style retrieval) and its index.

Why these tests: like every model-free draft it cannot make an output wrong, but an index that
keeps the wrong continuation, a hash query that misses n-grams the corpus holds, or a history
lookup that loses to a shorter corpus match silently costs acceptance. So: the index answers as
direct counting does on random corpora, the longer match wins (the request's own at equal
length), greedy speculative decoding with it equals autoregressive decoding token for token and
accepts more than prompt lookup alone when the corpus holds the target's outputs, sampling keeps
the target's law (tests/models/test_model_free.py), and bad input is refused by name.
"""
import collections
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.data import corpus_index
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models import model_free as mf
from specdec_jax.models.model_config import get_preset
from specdec_jax.testing import tiny_pair

GREEDY = SamplingConfig(temperature=0.0)


def _reference(seqs, max_n, min_count):
  """gram (latest token first) -> (continuation, count): the most frequent, ties to the smaller."""
  counts = collections.defaultdict(collections.Counter)
  for s in seqs:
    for j in range(len(s) - 1):
      for n in range(1, min(max_n, j + 1) + 1):
        counts[tuple(s[j - k] for k in range(n))][s[j + 1]] += 1
  out = {}
  for gram, c in counts.items():
    top = max(c.values())
    if top >= min_count:
      out[gram] = (min(t for t, v in c.items() if v == top), top)
  return out


def _query(table, hist, pos, max_n):
  best = (0, 0)
  for n in range(1, max_n + 1):
    if pos - n + 1 < 0:
      break
    gram = tuple(int(hist[pos - k]) for k in range(n))
    if gram in table:
      best = (n, table[gram][0])
  return best


@pytest.mark.parametrize("vocab,max_n,min_count", [(5, 3, 1), (9, 4, 2), (40, 2, 1)])
def test_index_answers_as_direct_counting(vocab, max_n, min_count):
  rng = np.random.default_rng(vocab)
  seqs = [rng.integers(0, vocab, size=rng.integers(0, 40)).tolist() for _ in range(40)]
  index = corpus_index.build_corpus_index(seqs, vocab, max_ngram=max_n, min_count=min_count)
  table = _reference(seqs, max_n, min_count)
  assert index["corpus_keys"].shape[0] == len(table)  # no hash collision at this size
  assert np.all(np.diff(index["corpus_keys"].astype(np.int64)) > 0)
  for g, nxt, cnt in zip(index["corpus_grams"], index["corpus_next"], index["corpus_count"]):
    gram = tuple(int(t) for t in g if t >= 0)
    assert table[gram] == (nxt, cnt)
  hist = rng.integers(0, vocab, size=(4, 30)).astype(np.int32)
  pos = rng.integers(0, 30, size=(4, 7)).astype(np.int32)
  pos[0, 0] = 0  # the stream's first slot: only unigrams
  ngram, prop = jax.jit(mf.corpus_match, static_argnums=3)(
      jax.tree.map(jnp.asarray, index), jnp.asarray(hist), jnp.asarray(pos), max_n)
  hits = 0
  for b in range(4):
    for t in range(7):
      want = _query(table, hist[b], pos[b, t], max_n)
      assert (int(ngram[b, t]), int(prop[b, t])) == want, (b, t)
      hits += want[0] > 1
  assert hits > 0  # the random histories do meet longer corpus n-grams


def test_a_shorter_query_cap_uses_the_shorter_grams():
  index = corpus_index.build_corpus_index([[1, 2, 3, 4], [9, 2, 3, 7], [5, 3, 7]], 10,
                                          max_ngram=3)
  hist = jnp.asarray([[1, 2, 3, 0]], jnp.int32)
  pos = jnp.asarray([[2]], jnp.int32)
  idx = jax.tree.map(jnp.asarray, index)
  assert [int(x[0, 0]) for x in mf.corpus_match(idx, hist, pos, 3)] == [3, 4]  # 1 2 3 -> 4
  # n <= 1: "3" was followed by 4 once and by 7 twice
  assert [int(x[0, 0]) for x in mf.corpus_match(idx, hist, pos, 1)] == [1, 7]


def _draft_logits(draft, params, prompt):
  """The draft's proposal after `prompt` (its last token is fed as the loop feeds it)."""
  cache = draft.prefill(params, jnp.asarray([prompt], jnp.int32), 32)
  logits, _ = draft.extend(params, cache, jnp.asarray([prompt[-1:]], jnp.int32))
  return int(jnp.argmax(logits[0, 0])), int(jnp.sum(logits[0, 0] == 0)) == 1  # one-hot


def test_longer_match_wins_and_the_request_wins_ties():
  target = get_preset("decoder_test_draft", vocab_size=16)
  draft = mf.make_draft("corpus_lookup", target, max_ngram=3)
  # The corpus says "5 6 -> 7" and "6 -> 8" (twice); the prompt says "6 -> 9".
  index = jax.tree.map(jnp.asarray, corpus_index.build_corpus_index(
      [[5, 6, 7], [6, 8], [6, 8]], 16, max_ngram=3))
  # after "4 6": a 1-gram match in the request ("6 9") and in the corpus: the request's wins.
  assert _draft_logits(draft, index, [3, 6, 9, 4, 6]) == (9, True)
  # after "5 6": the corpus's 2-gram "5 6 -> 7" beats the request's 1-gram "6 -> 9".
  assert _draft_logits(draft, index, [3, 6, 9, 5, 6]) == (7, True)
  # nothing anywhere: the uniform fallback (no one-hot)
  assert not _draft_logits(draft, index, [3, 6, 9, 12, 13])[1]
  # prompt lookup alone proposes the request's continuation after "5 6" too
  assert _draft_logits(mf.make_draft("prompt_lookup", target), {}, [3, 6, 9, 5, 6]) == (9, True)


def test_index_refuses_bad_input(tmp_path):
  with pytest.raises(ValueError, match="out of range"):
    corpus_index.build_corpus_index([[1, 2, 99]], 16)
  with pytest.raises(ValueError, match="nothing to index"):
    corpus_index.build_corpus_index([[1], []], 16)
  with pytest.raises(ValueError, match="max_ngram"):
    corpus_index.build_corpus_index([[1, 2]], 16, max_ngram=0)
  good = corpus_index.build_corpus_index([[1, 2, 3]], 16)
  with pytest.raises(ValueError, match="no corpus_next"):
    corpus_index.check_index({k: v for k, v in good.items() if k != "corpus_next"}, 16)
  with pytest.raises(ValueError, match="another tokenizer"):
    corpus_index.check_index(good, 3)
  d = tmp_path / "code_complete"
  d.mkdir()
  (d / "sequences.jsonl").write_text(json.dumps({"input_ids": [1], "output_ids": [2, 3]}) + "\n")
  (d / "index.json").write_text(json.dumps({"complete": False}))
  with pytest.raises(ValueError, match="has not finished"):
    corpus_index.distill_sequences(str(d))
  (d / "index.json").write_text(json.dumps({"complete": True}))
  assert corpus_index.distill_sequences(str(d)) == [[2, 3]]
  assert corpus_index.distill_sequences(str(d), with_prompts=True) == [[1, 2, 3]]


def test_save_and_load_round_trip(tmp_path):
  index = corpus_index.build_corpus_index([[1, 2, 3, 1, 2, 4]], 16, max_ngram=2)
  path = str(tmp_path / "c.npz")
  corpus_index.save_index(path, index, {"vocab_size": 16})
  loaded, meta = corpus_index.load_index(path)
  assert meta == {"vocab_size": 16} and sorted(os.listdir(tmp_path)) == ["c.npz"]
  for k in mf.CORPUS_KEYS:
    np.testing.assert_array_equal(loaded[k], index[k])
    assert loaded[k].dtype == index[k].dtype


# ---- the loop ------------------------------------------------------------------------------------
def test_greedy_speculative_equals_autoregressive_and_the_corpus_is_used():
  """The corpus holds the target's greedy outputs for other prompts' continuations: the draft
  then accepts more than prompt lookup alone, and the output is the autoregressive one."""
  target, tp, _, _ = tiny_pair("decoder")
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, target.vocab_size, size=(8, 5)).astype(np.int32)
  max_len = 16
  ar = Decoder(target, sampling=GREEDY, max_decode_len=max_len).generate(
      Params(tp), jnp.asarray(prompts))
  # The corpus: these very outputs (a target's replies to "training" prompts); the measured
  # prompts share their first 4 tokens with the corpus's, so the continuations recur.
  corpus = [list(p) + [int(t) for t in o] for p, o in zip(prompts, np.asarray(ar.tokens_BxN))]
  index = jax.tree.map(jnp.asarray, corpus_index.build_corpus_index(
      corpus, target.vocab_size, max_ngram=4))
  accepted = {}
  for name, params in (("corpus_lookup", index), ("prompt_lookup", {})):
    draft = mf.make_draft(name, target.config)
    spec = Decoder(target, draft, Chain(3), GREEDY, max_decode_len=max_len).generate(
        Params(tp, params), jnp.asarray(prompts))
    np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN))
    np.testing.assert_array_equal(np.asarray(spec.lengths_B), np.asarray(ar.lengths_B))
    accepted[name] = int(np.asarray(spec.counters.accepted_B).sum())
  assert accepted["corpus_lookup"] > accepted["prompt_lookup"] + 20, accepted


# ---- the script --------------------------------------------------------------------------------
def _script(args):
  import importlib.util
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  spec = importlib.util.spec_from_file_location("corpus_index_script",
                                                os.path.join(root, "scripts", "corpus_index.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.main(args)


def test_script_writes_an_index_once_and_refuses_bad_input(tmp_path, capsys):
  d = tmp_path / "code_complete"
  d.mkdir()
  rows = [{"input_ids": [5, 6], "output_ids": [7, 8, 9, 7, 8, 3]},
          {"input_ids": [5], "output_ids": [7, 8, 9]}]
  (d / "sequences.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (d / "index.json").write_text(json.dumps({"complete": True}))
  out = str(tmp_path / "c.npz")
  args = ["--distill_dir", str(d), "--target", "decoder_test_target", "--output", out,
          "--max_ngram", "2"]
  assert _script(args) == 0
  index, meta = corpus_index.load_index(out)
  assert meta["sequences"] == 2 and meta["tokens"] == 9 and meta["vocab_size"] > 9
  assert _query(_reference([r["output_ids"] for r in rows], 2, 1), [7, 8], 1, 2) == (2, 9)
  np.testing.assert_array_equal(  # "7 8" (latest first: 8 7) -> 9, seen twice
      index["corpus_next"][np.all(index["corpus_grams"] == [8, 7], axis=1)], [9])
  assert _script(args) == 1 and "exists" in capsys.readouterr().err  # never overwritten
  (d / "index.json").write_text(json.dumps({"complete": False}))
  bad_out = str(tmp_path / "d.npz")
  assert _script(args[:5] + [bad_out]) == 1 and "has not finished" in capsys.readouterr().err
  assert not os.path.exists(bad_out)
