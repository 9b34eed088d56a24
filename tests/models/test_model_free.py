"""Model-free drafts (unigram, bigram, prompt lookup) behind the decoding seam.

Why these tests: a model-free draft can never make the output wrong (the acceptance rule sees the
q it sampled from), but a wrong table or a lookup that peeks at stale cache slots silently costs
acceptance, and a draft whose cache coordinates disagree with the target's would break the loop's
rollback. So: a draft's logits are its tables (which equal direct counting:
tests/data/test_ngram_tables.py), the lookup equals a plain-Python reference, and greedy
speculative decoding with each draft equals greedy autoregressive decoding token for token
inside the unchanged on-device loop; sampling with a prompt-lookup draft follows the target's
exact distribution.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.data.corpus_index import build_corpus_index
from specdec_jax.data.ngram_tables import build_ngram_tables
from specdec_jax.models import model_free as dr
from specdec_jax.models import ngram
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model
from specdec_jax.testing import chi_square_gof, exact_joint, tiny_pair

GREEDY = SamplingConfig(temperature=0.0)
MAX_LEN = 14
INPUTS = {
    "t5": np.array([[5, 6, 7, 1, 0], [8, 9, 1, 0, 0], [4, 4, 4, 4, 1], [7, 1, 0, 0, 0]]),
    "decoder": np.array([[5, 6, 7, 2, 0], [8, 9, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]]),
}


# ---- tables ------------------------------------------------------------------------------------
def test_draft_logits_are_the_tables():
  cfg = dict(kind="decoder", vocab_size=64)
  rng = np.random.default_rng(1)
  tables = build_ngram_tables([rng.integers(1, 64, 30).tolist() for _ in range(20)], 64, top_k=4)
  params = {k: jnp.asarray(x) for k, x in tables.items()}
  inputs = jnp.asarray(INPUTS["decoder"], jnp.int32)
  for name in ("unigram", "bigram"):
    draft = dr.make_draft(name, Model(get_preset("decoder_test_draft", vocab_size=64)))
    cache = draft.prefill(params, inputs, 16)
    logits, _ = jax.jit(draft.extend)(params, cache, jnp.asarray([[3, 4]] * 4, jnp.int32))
    probs = np.asarray(jax.nn.softmax(logits, axis=-1))
    want = (np.exp(tables["log_unigram"])[None, None] if name == "unigram"
            else ngram.bigram_matrix(tables)[np.array([[3, 4]] * 4)])
    np.testing.assert_allclose(probs, np.broadcast_to(want, probs.shape), rtol=1e-4, atol=1e-7)


def test_needs_tables():
  target = get_preset("decoder_test_draft", vocab_size=64)
  assert dr.needs_tables(dr.make_draft("unigram", target))
  assert dr.needs_tables(dr.make_draft("prompt_lookup", target, fallback="bigram"))
  assert not dr.needs_tables(dr.make_draft("prompt_lookup", target))

# ---- prompt lookup -------------------------------------------------------------------------------
def _lookup_reference(context, hist, pos, max_n, min_n):
  """Longest match (<= max_n) of the n-gram ending at hist[pos]; latest end wins; history
  matches beat context ones of the same length. Returns the proposed token or None."""
  best = None  # (length, segment, end) -> proposal
  segments = [(0, [t for t in context]), (1, list(hist[:pos + 1]))]
  query = list(hist[:pos + 1])
  for seg, seq in segments:
    for j in range(len(seq) - 1):
      if seg == 0 and seq[j + 1] < 0:
        continue
      n = 0
      while n < max_n and j - n >= 0 and pos - n >= 0 and seq[j - n] == query[pos - n]:
        n += 1
      if n >= min_n:
        key = (n, seg, j)
        if best is None or key > best[0]:
          best = (key, seq[j + 1])
  return None if best is None else best[1]


@pytest.mark.parametrize("with_context", [False, True])
def test_lookup_matches_reference(with_context):
  rng = np.random.default_rng(2 + with_context)
  b, s, c = 24, 14, 6 if with_context else 0
  hist = rng.integers(0, 3, size=(b, s)).astype(np.int32)
  context = rng.integers(0, 3, size=(b, c)).astype(np.int32)
  context[:4, -2:] = -1  # padded sources
  pos = rng.integers(0, s, size=(b, 3)).astype(np.int32)
  for max_n, min_n in [(3, 1), (2, 2)]:
    found, prop = jax.jit(dr.lookup, static_argnums=(3, 4))(
        jnp.asarray(context), jnp.asarray(hist), jnp.asarray(pos), max_n, min_n)
    for i in range(b):
      for t in range(3):
        want = _lookup_reference(context[i], hist[i], pos[i, t], max_n, min_n)
        assert bool(found[i, t]) == (want is not None), (i, t)
        if want is not None:
          assert int(prop[i, t]) == want, (i, t, max_n, min_n)


# ---- the loop ------------------------------------------------------------------------------------
def _tables(vocab=64, seed=0):
  rng = np.random.default_rng(seed)
  t = build_ngram_tables([rng.integers(2, vocab, size=30).tolist() for _ in range(50)], vocab,
                         top_k=8)
  return {k: jnp.asarray(x) for k, x in t.items()}


_AR = {}


def _setup(kind):
  if kind not in _AR:
    target, tp, _, _ = tiny_pair(kind)
    inputs = jnp.asarray(INPUTS[kind], jnp.int32)
    ar = Decoder(target, sampling=GREEDY, max_decode_len=MAX_LEN).generate(Params(tp), inputs)
    _AR[kind] = (target, tp, inputs, ar)
  return _AR[kind]


@pytest.mark.parametrize("kind,name", [
    ("decoder", "prompt_lookup"), ("decoder", "bigram"),
    pytest.param("decoder", "unigram", marks=pytest.mark.slow),
    pytest.param("t5", "prompt_lookup", marks=pytest.mark.slow),
    pytest.param("t5", "unigram", marks=pytest.mark.slow),
    pytest.param("t5", "bigram", marks=pytest.mark.slow)])
def test_greedy_speculative_equals_autoregressive(kind, name):
  target, tp, inputs, ar = _setup(kind)
  draft = dr.make_draft(name, target.config)
  spec = Decoder(target, draft, Chain(3), GREEDY, max_decode_len=MAX_LEN).generate(
      Params(tp, _tables()), inputs)
  np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(spec.lengths_B), np.asarray(ar.lengths_B))
  assert int(spec.counters.iterations) <= MAX_LEN
  if name == "prompt_lookup":  # the random targets repeat themselves; the lookup catches it
    assert int(np.asarray(spec.counters.accepted_B).sum()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["prompt_lookup", "corpus_lookup"])
def test_prompt_lookup_sampling_matches_exact_target_distribution(name):
  """Temperature 1 with a one-hot (deterministic) prompt-lookup draft, alone or with a corpus
  holding paths of the target: 100k samples of the first 3 tokens against the enumerated target
  law (V = 6, chi-square)."""
  v, n, num = 6, 100_000, 3
  cfg = get_preset("decoder_test_draft", vocab_size=v, emb_dim=16, num_decoder_layers=1,
                   eos_id=-1)
  target = Model(cfg)
  tp = jax.tree_util.tree_map(lambda x: 2.0 * x, target.init(jax.random.key(11)))
  prompt = np.array([3, 5, 3, 2], np.int32)
  sampling = SamplingConfig(temperature=1.0)
  draft = dr.make_draft(name, cfg)
  params = {} if name == "prompt_lookup" else jax.tree.map(jnp.asarray, build_corpus_index(
      [[3, 2, 1, 4, 0], [2, 1, 1], [1, 4, 4, 0]], v, max_ngram=2))
  inputs = jnp.asarray(np.broadcast_to(prompt, (n, len(prompt))))
  out = Decoder(target, draft, Chain(2), sampling, max_decode_len=num).generate(
      Params(tp, params), inputs, jax.random.key(5))
  assert int(np.asarray(out.counters.accepted_B).sum()) > 0.05 * n  # the draft does get used
  flat = np.ravel_multi_index(np.asarray(out.tokens_BxN[:, :num]).T, (v,) * num)
  counts = np.bincount(flat, minlength=v ** num)
  _, _, pvalue = chi_square_gof(counts, exact_joint(target, tp, prompt, num, sampling).ravel())
  assert pvalue > 1e-3
