"""The dynamic tree scheme, end to end in the Decoder loop, reproduces the target's processed law.

Why: test_tree_dynamic_verify.py checks the verifier and the node tables on synthetic tables; this
drives real (tiny) models through everything the dynamic scheme adds: the beam expansion by
cumulative draft log q (windowed draft calls), the rerank that prunes, the per-row masked verify
call, kept pruned children emitted as the next token, the draft commit from the beam's slots and
its pending flag, several iterations per sample. As test_tree_scheme_distribution.py: vocabulary
6, the exact law of every 3-token continuation from the target's uncached forward pass, 100k
samples, chi-square; seeds fixed. Every budget prunes (N - 1 below the candidates); top-k 3
leaves the draft fewer tokens than the four children per node; top-p with W < k. The fault
`sibling_residual_from_p` must fail at the same size.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.tree import DynamicTreeScheme
from specdec_jax.models.config import get_preset
from specdec_jax.models.model import Model
from specdec_jax.testing import (chi_square_gof, exact_joint, faulty_tree_verifier,
                                 sibling_residual_from_p)

V = 6
NUM_TOKENS = 3
NUM_SAMPLES = 100_000
PROMPT = np.array([3, 5, 2], np.int32)
CASES = {  # (depth, width, branch, nodes)
    "t1_d2w2k3n5": (SamplingConfig(temperature=1.0), (2, 2, 3, 5)),
    "t0.7_topk3_d2w2k4n6": (SamplingConfig(temperature=0.7, top_k=3), (2, 2, 4, 6)),
    "topp0.8_d3w1k2n4": (SamplingConfig(temperature=1.0, top_p=0.8), (3, 1, 2, 4)),
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


# Top-k and top-p run with the slow suite (~17-20 s each on 2 cores); the verifier under top-k /
# top-p is checked in the fast one by test_tree_dynamic_verify.py.
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n.startswith("t1_") else
                                               pytest.mark.slow) for n in CASES])
def test_dynamic_tree_matches_exact_target_distribution(models, name):
  sampling, budget = CASES[name]
  pvalue, out = _pvalue(models, sampling, DynamicTreeScheme(*budget))
  assert pvalue > 1e-3, f"{name}: p={pvalue:.2e}"
  c = out.counters
  assert int(np.sum(c.accepted_B)) > 0
  # walks that ended on a kept pruned child (accepted, no bonus): emitted = accepted in a call
  gap = np.asarray(c.target_calls_B) - (np.asarray(c.emitted_B) - np.asarray(c.accepted_B))
  assert gap.sum() > 0.01 * np.sum(c.target_calls_B)


def test_sibling_residual_from_p_is_detected(models):
  sampling, budget = CASES["t1_d2w2k3n5"]
  faulty = DynamicTreeScheme(*budget, verifier=faulty_tree_verifier(sibling_residual_from_p))
  pvalue, _ = _pvalue(models, sampling, faulty)
  assert pvalue < 1e-6, f"p={pvalue:.2e}"
