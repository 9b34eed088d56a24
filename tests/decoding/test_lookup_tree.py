"""The lookup-tree scheme (`decoding.tree.lookup_scheme`): branch proposal from the history, and
greedy lookup-tree decoding equal to greedy autoregressive decoding token for token.

Why: at temperature 0 the verifier keeps the longest path of offered target argmaxes, so any
difference points at the branch proposal's coordinates (the root written at its slot, stale slots
invisible), the masked verify call, the path commit into consecutive slots, the kept tokens
written into the history, or EOS / length handling. T5 and decoder-only, ragged batches of
repetitive prompts (so branches match and whole paths are kept), and a target that follows a
fixed cycle on a few tokens with decoy prompts (the latest match is wrong, an earlier one right:
rank-1 branches must be kept, their paths leaving consecutive slots).
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.models import model_free
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.tree.lookup import find_branches, lookup_tree, node_arrays
from specdec_jax.decoding.tree.lookup_scheme import LookupTreeScheme
from specdec_jax.testing import WrappedModel, tiny_pair

MAX_LEN = 24
CYCLE = (2, 3, 4, 5, 6, 7)  # the Follow target's forced successors: 2 -> 3 -> ... -> 7


@dataclasses.dataclass(frozen=True)
class Follow(WrappedModel):
  """The base model, except that after a token of CYCLE[:-1] (and the T5 start token 0) its
  argmax is forced to the next one; after any other token the model decides."""

  def _bias(self, tokens_BxT, logits_BxTxV):
    table = np.full(logits_BxTxV.shape[-1], -1, np.int32)
    table[list(CYCLE[:-1])] = CYCLE[1:]
    table[0] = CYCLE[0]
    nxt_BxT = jnp.asarray(table)[tokens_BxT]
    hot = jax.nn.one_hot(jnp.maximum(nxt_BxT, 0), logits_BxTxV.shape[-1])
    return logits_BxTxV + 1e3 * hot * (nxt_BxT >= 0)[..., None]

  def extend(self, params, cache, tokens_BxT):
    logits, cache = self.base.extend(params, cache, tokens_BxT)
    return self._bias(tokens_BxT, logits), cache

  def extend_with_mask(self, params, cache, tokens_BxT, offsets, visible):
    logits, cache = self.base.extend_with_mask(params, cache, tokens_BxT, offsets, visible)
    return self._bias(tokens_BxT, logits), cache


def _repetitive(kind, rows=5, width=24, seed=0):
  """Prompts over the tokens 2..6 (n-grams recur with several continuations), ragged."""
  x = np.random.default_rng(seed).integers(2, 7, size=(rows, width)).astype(np.int32)
  for b in range(1, rows, 2):
    x[b, width - 3 * b:] = 0
  if kind == "t5":
    lengths = (x != 0).sum(1)
    x[np.arange(rows), lengths - 1] = 1  # T5 sources end in EOS
  return x


def _decoy(kind):
  """Rows whose last token (decoder) / first output after 2 (T5) matches twice: latest wrong."""
  if kind == "decoder":
    return np.array([[20, 2, 3, 4, 5, 6, 7, 30, 31, 4, 40, 41, 42, 4],
                     [21, 3, 4, 5, 6, 7, 22, 3, 9, 9, 3, 23, 9, 3],
                     [2, 3, 4, 5, 30, 2, 31, 0, 0, 0, 0, 0, 0, 0]], np.int32)
  return np.array([[20, 2, 3, 4, 5, 6, 7, 30, 2, 40, 41, 1],
                   [2, 3, 4, 33, 2, 9, 2, 35, 1, 0, 0, 0],
                   [44, 45, 2, 3, 4, 5, 6, 7, 1, 0, 0, 0]], np.int32)


def _run(target, tp, inputs, scheme, max_len=MAX_LEN):
  ar = Decoder(target, max_decode_len=max_len).generate(Params(tp), inputs)
  draft = model_free.make_draft("prompt_lookup", target)
  out = Decoder(target, draft, scheme, max_decode_len=max_len).generate(Params(tp, {}), inputs)
  np.testing.assert_array_equal(np.asarray(out.tokens_BxN), np.asarray(ar.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(out.lengths_B), np.asarray(ar.lengths_B))
  _assert_counters(out, scheme)
  return out


def _assert_counters(out, scheme):
  c = {k: np.asarray(v) for k, v in vars(out.counters).items()}
  gap = c["target_calls_B"] - (c["emitted_B"] - c["accepted_B"])
  assert np.all((gap == 0) | (gap == 1)), gap
  hist = c["accepted_length_hist_BxG1"]
  np.testing.assert_array_equal(hist.sum(axis=1), c["target_calls_B"])
  np.testing.assert_array_equal((hist * np.arange(hist.shape[1])).sum(axis=1), c["accepted_B"])
  np.testing.assert_array_equal(c["accepts_per_position_BxG"].sum(axis=0)[:scheme.length],
                                np.asarray(out.stats.kept_rank_DxK).sum(axis=1))
  assert np.all(c["accepts_per_position_BxG"][:, scheme.length:] == 0)


@pytest.fixture(scope="module", params=["decoder", "t5"])
def pair(request):
  target, tp, _, _ = tiny_pair(request.param)
  return request.param, target, tp


def test_greedy_equals_autoregressive_on_repetitive_prompts(pair):
  kind, target, tp = pair
  out = _run(target, tp, _repetitive(kind), LookupTreeScheme(branches=3, length=4))
  kept = np.asarray(out.stats.kept_rank_DxK)
  assert kept[1:].sum() > 0  # tokens kept at depth >= 2: whole branches matched
  assert int(np.asarray(out.counters.accepted_B).sum()) > 0


def test_decoy_rows_keep_rank_one_branches(pair):
  kind, target, tp = pair
  scheme = LookupTreeScheme(branches=3, length=4)
  out = _run(Follow(target), tp, _decoy(kind), scheme)
  kept = np.asarray(out.stats.kept_rank_DxK)
  assert kept[0, 1:].sum() > 0, kept  # a later sibling (an earlier occurrence) was kept
  # Row 0's first lookup (after the forced 2 on T5): the latest match is the decoy (rank 0), the
  # earlier one continues the cycle (rank 1), kept at depth 1 and below it.
  calls = 1 if kind == "decoder" else 2
  draft = model_free.make_draft("prompt_lookup", target)
  first = Decoder(Follow(target), draft, scheme, max_decode_len=MAX_LEN).generate(
      Params(tp, {}), _decoy(kind), max_iterations=calls)
  assert int(np.asarray(first.counters.accepted_B)[0]) >= 3
  assert np.asarray(first.stats.kept_rank_DxK)[0, 1] >= 1


def test_one_branch_of_one_token(pair):
  """The smallest tree (one chain of one token) is greedy prompt lookup with gamma 1."""
  kind, target, tp = pair
  _run(target, tp, _repetitive(kind, rows=3, seed=1), LookupTreeScheme(branches=1, length=1),
       max_len=12)


def test_history_holds_the_committed_stream(pair):
  """After the loop, the history's slots base .. base + num - 2 are the buffer's committed tokens
  and its index is the last token's slot, as the chain's draft cache (what the lookups read)."""
  kind, target, tp = pair
  draft = model_free.make_draft("prompt_lookup", target)
  dec = Decoder(target, draft, LookupTreeScheme(branches=3, length=4), max_decode_len=MAX_LEN)
  params = Params(tp, {})
  state = jax.jit(lambda x: dec.run(params, dec.init(params, x, jax.random.key(0))))(
      jnp.asarray(_repetitive(kind)))
  hist, index = np.asarray(state.draft_cache.tokens_BxS), np.asarray(state.draft_cache.index_B)
  tokens, num, base = (np.asarray(a) for a in (state.tokens_BxL, state.num_B, state.base_B))
  np.testing.assert_array_equal(index, base + num - 1)
  np.testing.assert_array_equal(index, np.asarray(state.target_cache.index_B))
  for b in range(len(num)):
    np.testing.assert_array_equal(hist[b, base[b]:base[b] + num[b] - 1], tokens[b, :num[b] - 1])
  assert int(np.asarray(state.counters.accepted_B).sum()) > 0


def test_loop_is_one_while_without_host_ops():
  """As tests/decoding/test_one_program.py for the other schemes: the branch lookup, the point-mass
  walk and both commits stay inside the one on-device while loop, no host op per iteration."""
  import re  # pylint: disable=import-outside-toplevel

  from specdec_jax.decoding.decoder import decode_program  # pylint: disable=import-outside-toplevel
  from specdec_jax.decoding.sampling import SamplingConfig  # pylint: disable=import-outside-toplevel
  host_ops = re.compile(r"custom_call_target=\"[^\"]*(callback|host)[^\"]*\"|\b(outfeed|infeed|"
                        r"send|recv)\b|xla_python_cpu_callback|xla_ffi_python", re.IGNORECASE)
  target, tp, _, _ = tiny_pair("decoder")
  draft = model_free.make_draft("prompt_lookup", target)
  decoder = Decoder(target, draft, LookupTreeScheme(2, 3), SamplingConfig(temperature=1.0),
                    max_decode_len=8)
  inputs = jnp.asarray(np.array([[5, 6, 5, 6], [7, 8, 9, 3]]), jnp.int32)
  hlo = decode_program.lower(decoder, Params(tp, {}), inputs, jax.random.key(0),
                             None).compile().as_text()
  assert re.search(r"\bwhile\(", hlo), "the compiled program has no while loop"
  assert not host_ops.search(hlo), host_ops.search(hlo).group(0)


# ---- the branch proposal ------------------------------------------------------------------------
def _history(tokens, context=None):
  t = jnp.asarray([tokens], jnp.int32)
  c = jnp.zeros((1, 0), jnp.int32) if context is None else jnp.asarray([context], jnp.int32)
  return model_free.HistoryCache(t, jnp.zeros((1,), jnp.int32), c)


def test_branches_are_best_first_and_distinct_at_depth_one():
  # query: the n-gram ending at slot 10 ("5 6"); "5 6" matches ending at 2 (-> 7 8 5) and 6
  # (-> 9 6 5), the 1-gram "6" also at 8 (-> 5 6, then periodic: 5): longest first, then
  # latest; the stale slots past 10 are never read.
  hist = _history([4, 5, 6, 7, 8, 5, 6, 9, 6, 5, 6, 7, 7, 7])
  toks, valid = find_branches(hist, jnp.asarray([10]), branches=4, length=3, max_ngram=2)
  np.testing.assert_array_equal(np.asarray(toks)[0], [[9, 6, 5], [7, 8, 5], [5, 6, 5], [0, 0, 0]])
  np.testing.assert_array_equal(np.asarray(valid)[0].sum(-1), [3, 3, 3, 0])


def test_branches_in_a_loop_repeat_it():
  """A match ending `period` slots before the query is copied periodically past the query (the
  chain's lookup, re-run on its own proposals, does the same); stale slots (9) never show."""
  hist = _history([3, 7, 8, 7, 8, 7, 8, 9, 9, 9, 9, 9, 9, 9])
  toks, valid = find_branches(hist, jnp.asarray([6]), branches=2, length=5)
  np.testing.assert_array_equal(np.asarray(toks)[0], [[7, 8, 7, 8, 7], [0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(np.asarray(valid)[0].sum(-1), [5, 0])


def test_branches_read_the_source_within_its_segment():
  # T5: source [3, 4, 5, 9, pad]; the stream [0, 3, 4] matches "3 4" in the source (-> 5 9, and
  # the source ends there: no third token, pads never copied) and nothing in the history.
  hist = _history([0, 3, 4, 0, 0, 0], context=[3, 4, 5, 9, -1])
  toks, valid = find_branches(hist, jnp.asarray([2]), branches=2, length=3)
  np.testing.assert_array_equal(np.asarray(toks)[0], [[5, 9, 0], [0, 0, 0]])
  np.testing.assert_array_equal(np.asarray(valid)[0].sum(-1), [2, 0])


def test_node_arrays_offer_only_valid_children():
  toks = jnp.asarray([[[5, 6], [7, 0]]], jnp.int32)
  valid = jnp.asarray([[[True, True], [True, False]]])
  tokens, offered = node_arrays(jnp.asarray([3]), toks, valid, vocab=10)
  assert lookup_tree(2, 2).parents == (-1, 0, 1, 0, 3)
  np.testing.assert_array_equal(np.asarray(tokens), [[3, 5, 6, 7, 0]])
  got = {n: tuple(np.flatnonzero(np.asarray(offered)[0, n])) for n in range(5)}
  assert got == {0: (5, 7), 1: (6,), 2: (), 3: (), 4: ()}


def test_scheme_refuses_bad_settings_and_model_drafts():
  with pytest.raises(ValueError, match="branches"):
    LookupTreeScheme(branches=0)
  with pytest.raises(ValueError, match="min_ngram"):
    LookupTreeScheme(max_ngram=2, min_ngram=3)
  with pytest.raises(ValueError, match="verifier"):
    LookupTreeScheme(verifier="recursive_rejection")
  target, _, draft, _ = tiny_pair("decoder")
  with pytest.raises(TypeError, match="model-free"):
    Decoder(target, draft, LookupTreeScheme())
  with pytest.raises(TypeError, match="corpus would be ignored"):
    Decoder(target, model_free.make_draft("corpus_lookup", target.config), LookupTreeScheme())
