"""The decode loops with the kernel on: still one program, still exact.

Why: the kernel is an XLA custom call inside the jitted while loop; it must not add a host round
trip, and the loops' guarantees (greedy speculative == autoregressive; sampled speculative ==
the target's distribution) must hold with it as they do with XLA's dot.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params, decode_program
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.kernels import build
from specdec_jax.models import packed
from specdec_jax.testing import chi_square_gof, tiny_pair
from tests.decoding import test_distribution as dist
from tests.decoding.test_one_program import HOST_OPS

GREEDY = SamplingConfig(temperature=0.0)
INPUTS = {
    "t5": np.array([[5, 6, 7, 1, 0], [8, 9, 1, 0, 0], [4, 4, 4, 4, 1], [7, 1, 0, 0, 0]]),
    "decoder": np.array([[5, 6, 7, 2, 0], [8, 9, 3, 0, 0], [4, 4, 4, 4, 4], [7, 0, 0, 0, 0]]),
}
INPUTS["llama"] = INPUTS["decoder"]
CUSTOM_CALL = f'custom_call_target="{build.TARGET_NAME}"'


def _packed_pair(kind, matmul="kernel", draft_panels="auto"):
  """Packed tiny pair. "kernel" by default: every extend, T = 1 included, runs the kernel.
  `draft_panels='int8'`: the draft quantized (a different draft; the target untouched)."""
  target, tp, draft, dp = tiny_pair(kind)
  return (*packed.pack(target, tp, matmul), *packed.pack(draft, dp, matmul, draft_panels))


@pytest.mark.parametrize("kind", ["t5", "decoder"])
def test_speculative_loop_with_kernel_is_one_while_without_host_ops(kind):
  target, tp, draft, dp = _packed_pair(kind)
  inputs = jnp.asarray(INPUTS[kind][:2], jnp.int32)
  decoder = Decoder(target, draft, Chain(3), SamplingConfig(temperature=1.0), max_decode_len=8)
  hlo = decode_program.lower(decoder, Params(tp, dp), inputs, jax.random.key(0),
                             None).compile().as_text()
  assert re.search(r"\bwhile\(", hlo)
  assert CUSTOM_CALL in hlo
  assert not HOST_OPS.search(hlo), HOST_OPS.search(hlo).group(0)


def test_autoregressive_loop_with_kernel_is_one_while_without_host_ops():
  target, tp, _, _ = _packed_pair("decoder")
  inputs = jnp.asarray(INPUTS["decoder"][:1], jnp.int32)
  decoder = Decoder(target, sampling=GREEDY, max_decode_len=8)
  hlo = decode_program.lower(decoder, Params(tp), inputs, jax.random.key(0),
                             None).compile().as_text()
  assert re.search(r"\bwhile\(", hlo) and CUSTOM_CALL in hlo
  assert not HOST_OPS.search(hlo)


@pytest.mark.parametrize("kind,matmul,draft_panels", [
    ("t5", "kernel", "auto"), ("decoder", "kernel", "auto"), ("decoder", "hybrid", "auto"),
    ("llama", "hybrid", "auto"), ("t5", "hybrid", "int8"), ("llama", "kernel", "int8")])
def test_greedy_speculative_equals_autoregressive_with_kernel(kind, matmul, draft_panels):
  target, tp, draft, dp = _packed_pair(kind, matmul, draft_panels)
  inputs = jnp.asarray(INPUTS[kind], jnp.int32)
  ar = Decoder(target, sampling=GREEDY, max_decode_len=14).generate(Params(tp), inputs)
  spec = Decoder(target, draft, Chain(3), GREEDY, max_decode_len=14).generate(Params(tp, dp),
                                                                              inputs)
  np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(spec.lengths_B), np.asarray(ar.lengths_B))


@pytest.fixture(scope="module")
def dist_models():
  """tests/decoding/test_distribution's pair, packed (the draft also as int8 panels); the truth
  stays the unpacked target's."""
  target, tp, draft, dp = dist.models.__wrapped__()
  ptarget = packed.pack(target, tp, "kernel")
  return (target, tp), {"auto": (*ptarget, *packed.pack(draft, dp, "kernel")),
                        "int8": (*ptarget, *packed.pack(draft, dp, "kernel", "int8"))}


@pytest.mark.slow  # 100k samples per configuration: ~45 s each on the 2-core machine
@pytest.mark.parametrize("name,draft_panels", [(n, "auto") for n in dist.CONFIGS]
                         + [("t1", "int8"), ("t0.7_topk4", "int8")])
def test_speculative_with_kernel_matches_exact_target_distribution(dist_models, name,
                                                                   draft_panels):
  """With the kernel, and with an int8 draft: the target's distribution either way (the draft's
  q is whatever the quantized draft computes; acceptance uses that q)."""
  (target, tp), packed_models = dist_models
  sampling = dist.CONFIGS[name]
  probs = dist._exact((target, tp, None, None), sampling)  # pylint: disable=protected-access
  counts = dist._spec_counts(packed_models[draft_panels], sampling)  # pylint: disable=protected-access
  _, _, pvalue = chi_square_gof(counts, probs)
  assert pvalue > 1e-3


@pytest.mark.parametrize("kind,matmul", [("llama", "hybrid"), ("t5", "kernel")])
def test_greedy_with_a_q4_self_draft_equals_autoregressive(kind, matmul):
  """The target's own checkpoint in q4 panels drafting for it (`draft_panels='q4'`): a different,
  cheaper draft, the target's greedy tokens unchanged."""
  target, tp, _, _ = tiny_pair(kind)
  ptarget, ptp = packed.pack(target, tp, matmul)
  pdraft, pdp = packed.pack(target, tp, matmul, panels="q4")
  inputs = jnp.asarray(INPUTS[kind], jnp.int32)
  ar = Decoder(ptarget, sampling=GREEDY, max_decode_len=14).generate(Params(ptp), inputs)
  spec = Decoder(ptarget, pdraft, Chain(3), GREEDY, max_decode_len=14).generate(
      Params(ptp, pdp), inputs)
  np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(spec.lengths_B), np.asarray(ar.lengths_B))
  assert 0 < int(np.sum(spec.counters.accepted_B)) < int(np.sum(spec.counters.drafted_B))


@pytest.mark.slow  # 100k samples: ~45 s on the 2-core machine
def test_a_q4_self_draft_keeps_the_target_distribution():
  """tests/decoding/test_distribution's setting with a target 32 wide (q4 blocks are 32 inputs)
  drafted for by its own q4 panels, T = 1: the target's distribution, though q differs from p."""
  cfg = dist.get_preset("decoder_test_draft", vocab_size=dist.V, emb_dim=32, num_heads=4,
                        num_decoder_layers=1, eos_id=-1)
  target = dist.Model(cfg)
  tp = jax.tree_util.tree_map(lambda x: 2.0 * x, target.init(jax.random.key(11)))
  pair = (*packed.pack(target, tp, "kernel"), *packed.pack(target, tp, "kernel", "q4"))
  sampling = dist.CONFIGS["t1"]
  probs = dist._exact((target, tp, None, None), sampling)  # pylint: disable=protected-access
  counts = dist._spec_counts(pair, sampling)  # pylint: disable=protected-access
  _, _, pvalue = chi_square_gof(counts, probs)
  assert pvalue > 1e-3
