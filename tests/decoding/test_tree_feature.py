"""The trees with a feature-level draft (`TreeScheme` / `DynamicTreeScheme` with `FeatureDrafter`,
`decoding/drafter.py`): a tree drafted from the target's states, verified in one target call that
returns the nodes' states.

Why each test:
- greedy tree decoding equals greedy autoregressive decoding (T5 and decoder-only, two tree
  shapes, batch 4 with ragged prompts): any slip in the masked verify-with-states call, the path
  commit in the target's cache or the draft's rollback changes a token;
- a one-branch tree (1, 1, 1) drafts exactly what the feature chain drafts at gamma 3: the same
  accepted counts per row. Greedy equality alone cannot see the draft's inputs (any proposal is
  verified away); this catches a parent's feature, a level's positions or the pending entries
  (the kept path's target states) going to the wrong place, which only lowers acceptance;
- the chi-square test at T > 0 (and top-k / top-p in the slow suite): the sampled law of every
  3-token continuation equals the target's, and the faulty verifier that tests the next sibling
  against p instead of the residual fails at the same size;
- the dynamic tree (`DynamicTreeScheme`, EAGLE-2's expansion): greedy equality, the
  chi-square law with kept pruned children exercised (walks that end on one: the case a verifier
  skipping pruned siblings gets wrong);
- refusals by name: a feature drafter with a token draft and a token drafter with a feature
  draft, the prompt-lookup tree with a feature draft; the default drafter follows the draft.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.drafter import FeatureDrafter, TokenDrafter
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.decoding.tree import Tree, TreeScheme
from specdec_jax.decoding.tree.dynamic import DynamicTreeScheme
from specdec_jax.decoding.tree.lookup_scheme import LookupTreeScheme
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model
from specdec_jax.testing import (TREE_LAW_CASES, TREE_LAW_PROMPT, TREE_LAW_SAMPLES,
                                 TREE_LAW_TOKENS, TREE_LAW_VOCAB, faulty_tree_verifier,
                                 law_pvalue, sharp_feature_pair, sibling_residual_from_p,
                                 tiny_feature_pair)

GREEDY = SamplingConfig(temperature=0.0)
INPUTS = {
    "t5": np.array([[5, 6, 7, 1, 0], [3, 4, 1, 0, 0], [4, 4, 4, 4, 1], [7, 1, 0, 0, 0]]),
    "decoder": np.array([[5, 6, 7, 2, 0], [3, 4, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]]),
}


@pytest.mark.parametrize("kind,vocab", [("t5", 64), ("decoder", 8)])
def test_greedy_feature_tree_equals_autoregressive(kind, vocab):
  target, tp, draft, dp = tiny_feature_pair(kind, vocab)
  inputs = jnp.asarray(np.minimum(INPUTS[kind], vocab - 1), jnp.int32)
  ar = Decoder(target, sampling=GREEDY, max_decode_len=12).generate(Params(tp), inputs)
  for branching in ((2, 1, 1), (3, 2), DynamicTreeScheme(depth=3, width=2, branch=3, nodes=8)):
    scheme = (branching if isinstance(branching, DynamicTreeScheme)
              else TreeScheme.from_branching(branching))
    decoder = Decoder(target, draft, scheme, GREEDY, max_decode_len=12)
    assert isinstance(decoder.drafter, FeatureDrafter)  # the feature draft's default drafter
    spec = decoder.generate(Params(tp, dp), inputs)
    np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN))
    np.testing.assert_array_equal(np.asarray(spec.lengths_B), np.asarray(ar.lengths_B))
    assert int(np.sum(spec.counters.emitted_B)) == int(np.sum(ar.lengths_B))
    if vocab == 8:  # a random draft over 8 tokens is kept now and then, siblings included
      assert int(np.sum(spec.counters.accepted_B)) > 0


@pytest.mark.parametrize("kind,vocab", [("t5", 8), ("decoder", 8)])
def test_one_branch_tree_drafts_what_the_feature_chain_drafts(kind, vocab):
  target, tp, draft, dp = tiny_feature_pair(kind, vocab)
  inputs = jnp.asarray(np.minimum(INPUTS[kind], vocab - 1), jnp.int32)
  params = Params(tp, dp)
  chain = Decoder(target, draft, Chain(3), GREEDY, max_decode_len=16).generate(params, inputs)
  tree = Decoder(target, draft, TreeScheme.from_branching((1, 1, 1)), GREEDY,
                 max_decode_len=16).generate(params, inputs)
  np.testing.assert_array_equal(np.asarray(tree.tokens_BxN), np.asarray(chain.tokens_BxN))
  for name in ("accepted_B", "target_calls_B", "emitted_B"):
    np.testing.assert_array_equal(np.asarray(getattr(tree.counters, name)),
                                  np.asarray(getattr(chain.counters, name)), err_msg=name)
  assert int(np.sum(chain.counters.accepted_B)) > 0  # the comparison saw kept drafts


# ---- exactness at temperature > 0 ---------------------------------------------------------------
# The token tree's cases (`testing.TREE_LAW_CASES`, test_tree_scheme_distribution.py's).
V, NUM_TOKENS, NUM_SAMPLES = TREE_LAW_VOCAB, TREE_LAW_TOKENS, TREE_LAW_SAMPLES
PROMPT, CASES = TREE_LAW_PROMPT, TREE_LAW_CASES


@pytest.fixture(scope="module")
def sharp_pair():
  """A sharp 2-layer decoder-only target over 6 tokens (no EOS) and a sharp feature draft."""
  return sharp_feature_pair(Model(get_preset("decoder_test_draft", vocab_size=V, emb_dim=16,
                                             num_decoder_layers=2, eos_id=-1)))


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "t1_3x2" else pytest.mark.slow)
                                  for n in CASES])
def test_feature_tree_matches_exact_target_distribution(sharp_pair, name):
  sampling, branching = CASES[name]
  scheme = TreeScheme.from_branching(branching)
  pvalue, out = law_pvalue(sharp_pair, sampling, scheme, PROMPT, NUM_TOKENS, NUM_SAMPLES)
  assert pvalue > 1e-3, f"{name}: p={pvalue:.2e}"
  kept = np.asarray(out.stats.kept_rank_DxK)
  assert kept[0, 1:].sum() > 0  # later siblings were kept: the sibling logic was exercised


@pytest.mark.slow  # the verifier is the drafter's no matter: test_tree_scheme_distribution's twin
def test_feature_tree_sibling_residual_from_p_is_detected(sharp_pair):  # stays in the fast run
  sampling, branching = CASES["t1_3x2"]
  faulty = TreeScheme(Tree.from_branching(branching),
                      faulty_tree_verifier(sibling_residual_from_p))
  pvalue, _ = law_pvalue(sharp_pair, sampling, faulty, PROMPT, NUM_TOKENS, NUM_SAMPLES)
  assert pvalue < 1e-6, f"p={pvalue:.2e}"


def test_feature_dynamic_tree_matches_exact_target_distribution(sharp_pair):
  """T = 1, depth 2, beam 2, branch 3, 5 nodes (tests/decoding/test_tree_dynamic_distribution.py's
  budget): pruned children are drawn and some walks end on one."""
  scheme = DynamicTreeScheme(depth=2, width=2, branch=3, nodes=5)
  pvalue, out = law_pvalue(sharp_pair, SamplingConfig(temperature=1.0), scheme, PROMPT,
                           NUM_TOKENS, NUM_SAMPLES)
  assert pvalue > 1e-3, f"p={pvalue:.2e}"
  c = out.counters
  # walks that ended on a kept pruned child (accepted, no bonus): emitted = accepted in a call
  gap = np.asarray(c.target_calls_B) - (np.asarray(c.emitted_B) - np.asarray(c.accepted_B))
  assert gap.sum() > 0.01 * np.sum(c.target_calls_B)


# ---- refusals -----------------------------------------------------------------------------------
def test_refusals_name_the_problem():
  target, tp, draft, dp = tiny_feature_pair("decoder", 8)
  with pytest.raises(TypeError, match="model-free draft"):  # the lookup tree drafts from tokens
    Decoder(target, draft, LookupTreeScheme(branches=2, length=2), GREEDY, max_decode_len=4)
  token_draft = Model(get_preset("decoder_test_draft", vocab_size=8))
  for scheme in (TreeScheme((2, 1)), DynamicTreeScheme(depth=2, width=2, branch=2, nodes=4)):
    # token drafts: their own drafter, the scheme as is
    assert isinstance(Decoder(target, token_draft, scheme, GREEDY).drafter, TokenDrafter)
    with pytest.raises(TypeError, match="feature-level draft"):
      Decoder(target, token_draft, scheme, GREEDY, max_decode_len=4, drafter=FeatureDrafter())
    with pytest.raises(TypeError, match="is a feature-level draft"):
      Decoder(target, draft, scheme, GREEDY, max_decode_len=4, drafter=TokenDrafter())
