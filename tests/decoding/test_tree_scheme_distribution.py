"""The tree scheme, end to end in the Decoder loop, reproduces the target's processed law.

Why: `test_tree_distribution.py` checks one tree iteration on synthetic tables; this drives real
(tiny) models through everything the scheme adds around the verifier: the level-by-level draft
with children drawn without replacement from q, the masked verify call, the path commit in both
caches, the draft's catch-up after a whole path, several iterations per sample. As the chain's
`test_distribution.py`: vocabulary 6, the exact law of every 3-token continuation enumerated from
the target's uncached forward pass, 100k samples, chi-square; seeds fixed (1e-3 is the
false-alarm rate with a fresh seed). The tree is (3, 2) (and (2, 1, 1), so a sample spans
iterations after a whole path); top-k 3 leaves the draft fewer tokens than the root's four
children. The fault `sibling_residual_from_p` (the next sibling tested against p instead of the
running residual) must fail at the same size.
"""
import numpy as np
import pytest

from specdec_jax.decoding.tree import Tree, TreeScheme
from specdec_jax.testing import (TREE_LAW_CASES, TREE_LAW_PROMPT, TREE_LAW_SAMPLES,
                                 TREE_LAW_TOKENS, TREE_LAW_VOCAB, faulty_tree_verifier,
                                 law_pvalue, sharp_tiny_pair, sibling_residual_from_p)

V, NUM_TOKENS, NUM_SAMPLES = TREE_LAW_VOCAB, TREE_LAW_TOKENS, TREE_LAW_SAMPLES
PROMPT, CASES = TREE_LAW_PROMPT, TREE_LAW_CASES


@pytest.fixture(scope="module")
def models():
  """test_distribution.py's pair (`testing.sharp_tiny_pair`): a sharp target, vocabulary 6."""
  return sharp_tiny_pair(V)


def _pvalue(models, sampling, scheme):
  return law_pvalue(models, sampling, scheme, PROMPT, NUM_TOKENS, NUM_SAMPLES)


# Top-k and top-p through the whole Decoder run with the slow suite (~14 s each); the verifiers
# under top-k / top-p are checked in the fast one by tests/decoding/test_tree_distribution.py.
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "t1_3x2" else pytest.mark.slow)
                                  for n in CASES])
def test_tree_matches_exact_target_distribution(models, name):
  sampling, branching = CASES[name]
  pvalue, out = _pvalue(models, sampling, TreeScheme.from_branching(branching))
  assert pvalue > 1e-3, f"{name}: p={pvalue:.2e}"
  kept = np.asarray(out.stats.kept_rank_DxK)
  assert kept[0, 1:].sum() > 0  # later siblings were kept: the sibling logic was exercised


def test_sibling_residual_from_p_is_detected(models):
  sampling, branching = CASES["t1_3x2"]
  faulty = TreeScheme(Tree.from_branching(branching),
                      verifier=faulty_tree_verifier(sibling_residual_from_p))
  pvalue, _ = _pvalue(models, sampling, faulty)
  assert pvalue < 1e-6, f"p={pvalue:.2e}"
