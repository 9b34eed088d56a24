"""The tree scheme, end to end in the Decoder loop, reproduces the target's processed law.

Why: `test_tree_distribution.py` checks one tree iteration on synthetic tables; this drives real
(tiny) models through everything the scheme adds around the verifier: the level-by-level draft
with Gumbel-top-k children from the processed q, the masked verify call, the path commit in both
caches, the draft's catch-up after a whole path, several iterations per sample. As the chain's
`test_distribution.py`: vocabulary 6, the exact law of every 3-token continuation enumerated from
the target's uncached forward pass, 100k samples, chi-square; seeds fixed (1e-3 is the
false-alarm rate with a fresh seed). The tree is (3, 2) (and (2, 1, 1), so a sample spans
iterations after a whole path); top-k 3 leaves the draft fewer tokens than the root's four
children. The fault `sibling_residual_from_p` (the next sibling tested against p instead of the
running residual) must fail at the same size.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.tree import Tree, TreeScheme
from specdec_jax.models.config import get_preset
from specdec_jax.models.model import Model
from specdec_jax.testing import (chi_square_gof, exact_joint, faulty_tree_verifier,
                                 sibling_residual_from_p)

V = 6
NUM_TOKENS = 3
NUM_SAMPLES = 100_000
PROMPT = np.array([3, 5, 2], np.int32)
CASES = {
    "t1_3x2": (SamplingConfig(temperature=1.0), (3, 2)),
    "t0.7_topk3_4x2": (SamplingConfig(temperature=0.7, top_k=3), (4, 2)),
    "topp0.8_2x1x1": (SamplingConfig(temperature=1.0, top_p=0.8), (2, 1, 1)),
}


@pytest.fixture(scope="module")
def models():
  """test_distribution.py's pair: a 1-layer target with doubled weights (sharp p) and a
  differently initialised draft, vocabulary 6, no EOS."""
  cfg = get_preset("decoder_test_draft", vocab_size=V, emb_dim=16, num_decoder_layers=1,
                   eos_id=-1)
  target, draft = Model(cfg), Model(cfg.replace(mlp_dim=16))
  tp = jax.tree_util.tree_map(lambda x: 2.0 * x, target.init(jax.random.key(11)))
  return target, tp, draft, draft.init(jax.random.key(12))


def _counts(models, sampling, scheme, seed=0):
  target, tp, draft, dp = models
  inputs = jnp.asarray(np.broadcast_to(PROMPT, (NUM_SAMPLES, len(PROMPT))))
  out = Decoder(target, draft, scheme, sampling, max_decode_len=NUM_TOKENS).generate(
      Params(tp, dp), inputs, jax.random.key(seed))
  assert np.all(np.asarray(out.lengths_B) == NUM_TOKENS)
  flat = np.ravel_multi_index(np.asarray(out.tokens_BxN).T, (V,) * NUM_TOKENS)
  return np.bincount(flat, minlength=V ** NUM_TOKENS), out


def _pvalue(models, sampling, scheme):
  counts, out = _counts(models, sampling, scheme)
  probs = exact_joint(models[0], models[1], PROMPT, NUM_TOKENS, sampling).ravel()
  return chi_square_gof(counts, probs)[2], out


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
