"""The decode is one compiled program: a `while` loop on device, no host work per iteration.

Why: the point of an on-device loop is that the host is not in it. A `jax.debug.print`, a
`pure_callback` or an `io_callback` left in the body would run once per iteration (a host round
trip each time); a Python loop around a jitted step would show up as several programs. The test
inspects both the lowered StableHLO and the compiled HLO text.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params, decode_program
from specdec_jax.decoding.drafter import FeatureDrafter
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.decoding.tree.dynamic import DynamicTreeScheme
from specdec_jax.decoding.tree.scheme import TreeScheme
from specdec_jax.testing import tiny_feature_pair, tiny_pair

HOST_OPS = re.compile(r"custom_call_target=\"[^\"]*(callback|host)[^\"]*\"|\b(outfeed|infeed|send|"
                      r"recv|send-done|recv-done)\b|xla_python_cpu_callback|xla_ffi_python",
                      re.IGNORECASE)


def _texts(fn, *args, **kwargs):
  lowered = fn.lower(*args, **kwargs)
  return lowered.as_text(), lowered.compile().as_text()


@pytest.mark.parametrize("kind", ["t5", "decoder"])
def test_speculative_loop_is_one_while_without_host_ops(kind):
  target, tp, draft, dp = tiny_pair(kind)
  inputs = jnp.asarray(np.array([[5, 6, 1, 0], [7, 8, 9, 1]]), jnp.int32)
  decoder = Decoder(target, draft, Chain(3), SamplingConfig(temperature=1.0), max_decode_len=8)
  stablehlo, hlo = _texts(decode_program, decoder, Params(tp, dp), inputs, jax.random.key(0),
                          None)
  assert "stablehlo.while" in stablehlo
  assert re.search(r"\bwhile\(", hlo), "the compiled program has no while loop"
  assert not HOST_OPS.search(hlo), HOST_OPS.search(hlo).group(0)


@pytest.mark.parametrize("scheme", ["tree", "dynamic_tree", "feature_chain", "feature_parallel",
                                    "feature_tree"])
def test_tree_and_feature_loops_are_one_while_without_host_ops(scheme):
  """The schemes added after the chain: a draft tree verified in one call (static, or dynamic:
  its rerank and per-row tables stay on device), and the drafts that read the target's hidden
  states (`FeatureDrafter`, and its parallel block); their per-iteration feature hand-off stays
  on device."""
  drafter = None  # the draft's default
  if scheme in ("tree", "dynamic_tree"):
    target, tp, draft, dp = tiny_pair("decoder")
    chosen = TreeScheme((2, 2)) if scheme == "tree" else DynamicTreeScheme(3, 2, 3, 8)
  else:
    target, tp, draft, dp = tiny_feature_pair("decoder", 64)
    chosen = TreeScheme((2, 2)) if scheme == "feature_tree" else Chain(3)
    drafter = FeatureDrafter(parallel=True) if scheme == "feature_parallel" else None
  inputs = jnp.asarray(np.array([[5, 6, 2, 0], [7, 8, 9, 3]]), jnp.int32)
  decoder = Decoder(target, draft, chosen, SamplingConfig(temperature=1.0), max_decode_len=8,
                    drafter=drafter)
  stablehlo, hlo = _texts(decode_program, decoder, Params(tp, dp), inputs, jax.random.key(0),
                          None)
  assert "stablehlo.while" in stablehlo
  assert not HOST_OPS.search(hlo), HOST_OPS.search(hlo).group(0)


def test_autoregressive_loop_is_one_while_without_host_ops():
  target, tp, _, _ = tiny_pair("decoder")
  inputs = jnp.asarray(np.array([[5, 6, 2, 0]]), jnp.int32)
  decoder = Decoder(target, sampling=SamplingConfig(temperature=0.0), max_decode_len=8)
  stablehlo, hlo = _texts(decode_program, decoder, Params(tp), inputs, jax.random.key(0), None)
  assert "stablehlo.while" in stablehlo
  assert not HOST_OPS.search(hlo)


def test_detector_catches_a_per_iteration_callback():
  """The pattern is not vacuous: a debug print inside a while body is found."""
  def f(x):
    def body(c):
      jax.debug.print("{c}", c=c)
      return c + 1
    return jax.lax.while_loop(lambda c: c < x, body, 0)
  hlo = jax.jit(f).lower(3).compile().as_text()
  assert HOST_OPS.search(hlo)
