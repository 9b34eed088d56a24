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
import numpy as np
import pytest

from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.tree import DynamicTreeScheme
from specdec_jax.testing import (faulty_tree_verifier, law_pvalue, sharp_tiny_pair,
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
  """test_distribution.py's pair (`testing.sharp_tiny_pair`): a sharp target, vocabulary 6."""
  return sharp_tiny_pair(V)


def _pvalue(models, sampling, scheme):
  return law_pvalue(models, sampling, scheme, PROMPT, NUM_TOKENS, NUM_SAMPLES)


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
