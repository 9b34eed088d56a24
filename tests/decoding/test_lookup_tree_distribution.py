"""The lookup-tree scheme, end to end in the Decoder loop, reproduces the target's processed law.

Why: `test_lookup_tree_verify.py` checks one verification on fixed tables; this drives a real
(tiny) target through everything the scheme adds around the verifier: branches looked up in a
history that holds the sampled tokens of earlier iterations, the masked verify call, the path
commit, several iterations per sample. As `test_tree_scheme_distribution.py`: vocabulary 6, the
exact law of every 3-token continuation from the target's uncached forward pass, 100k samples,
chi-square, seeds fixed (1e-3 is the false-alarm rate with a fresh seed). The prompt repeats
"3 5" with two continuations, so the first lookup offers two branches (and later ones whatever
the sampled history offers). The fault (a rejected sibling left in the running distribution)
must fail at the same size.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.models import model_free
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig, sample
from specdec_jax.decoding.tree import lookup_verify as lv
from specdec_jax.decoding.tree import verify
from specdec_jax.decoding.tree.lookup_scheme import LookupTreeScheme
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model
from specdec_jax.testing import chi_square_gof, exact_joint

V = 6
NUM_TOKENS = 3
NUM_SAMPLES = 100_000
PROMPT = np.array([3, 5, 2, 3, 5, 4, 1, 3, 5], np.int32)
CASES = {
    "t1_3x2": (SamplingConfig(temperature=1.0), (3, 2)),
    "topp0.8_2x1": (SamplingConfig(temperature=1.0, top_p=0.8), (2, 1)),
    "t0.7_topk3_4x3": (SamplingConfig(temperature=0.7, top_k=3), (4, 3)),
}


@pytest.fixture(scope="module")
def target():
  """test_distribution.py's target: 1 layer, doubled weights (sharp p), vocabulary 6, no EOS."""
  cfg = get_preset("decoder_test_draft", vocab_size=V, emb_dim=16, num_decoder_layers=1,
                   eos_id=-1)
  model = Model(cfg)
  return model, jax.tree_util.tree_map(lambda x: 2.0 * x, model.init(jax.random.key(11)))


def _pvalue(target, sampling, scheme, seed=0):
  model, tp = target
  inputs = jnp.asarray(np.broadcast_to(PROMPT, (NUM_SAMPLES, len(PROMPT))))
  draft = model_free.make_draft("prompt_lookup", model)
  out = Decoder(model, draft, scheme, sampling, max_decode_len=NUM_TOKENS).generate(
      Params(tp, {}), inputs, jax.random.key(seed))
  assert np.all(np.asarray(out.lengths_B) == NUM_TOKENS)
  flat = np.ravel_multi_index(np.asarray(out.tokens_BxN).T, (V,) * NUM_TOKENS)
  counts = np.bincount(flat, minlength=V ** NUM_TOKENS)
  probs = exact_joint(model, tp, PROMPT, NUM_TOKENS, sampling).ravel()
  return chi_square_gof(counts, probs)[2], out


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow if n.startswith("t0.7") else ())
                                  for n in CASES])
def test_lookup_tree_matches_exact_target_distribution(target, name):
  sampling, (k, l) = CASES[name]
  pvalue, out = _pvalue(target, sampling, LookupTreeScheme(branches=k, length=l))
  assert pvalue > 1e-3, f"{name}: p={pvalue:.2e}"
  kept = np.asarray(out.stats.kept_rank_DxK)
  assert kept[0, 1:].sum() > 0  # later siblings were kept: the sibling logic was exercised
  assert kept[1:].sum() > 0 or l == 1  # and paths below depth 1


def _left_in_residual(key, tree, tokens, offered, p):
  """A faulty verifier: a rejected sibling stays in the running distribution."""
  def sibling(u_B, x_B, p_node_BxV, p_cur_BxV, offered_BxV):
    accept_B, valid_B, _, offered_next = lv.point_mass_sibling(u_B, x_B, p_node_BxV, p_cur_BxV,
                                                              offered_BxV)
    return accept_B, valid_B, p_cur_BxV, offered_next
  k_walk, k_next = jax.random.split(key)
  verdict, final_BxV = verify.descend(k_walk, tree, tokens, offered, p, sibling)
  return verdict.replace(next_token_B=sample(k_next, final_BxV))


def test_sibling_left_in_residual_is_detected(target):
  sampling, (k, l) = CASES["t1_3x2"]
  pvalue, _ = _pvalue(target, sampling, LookupTreeScheme(k, l, verifier=_left_in_residual))
  assert pvalue < 1e-6, f"p={pvalue:.2e}"
