"""alpha counts every generated position, the bonus position after a fully accepted block too.

Why: alpha = E[sum_x min(p, q)] over generated positions (Leviathan's definition) is what 'auto'
and `speedup_predicted` rest on. When a block is fully accepted, the token after it is a bonus
sample of p whose q the draft only computes in the next iteration's first call; leaving those
positions out made a draft that always agrees on one row and never on the other read 0.333 /
0.400 / 0.455 / 0.478 at gamma 1 / 2 / 4 / 8 instead of 0.5.
"""
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.metrics import acceptance_stats
from specdec_jax.models.model import Model
from specdec_jax.testing import WrongOnRows, tiny_pair


# 31 tokens: not a multiple of gamma + 1 for any gamma below, so row 0's last block is cut by the
# length limit and every one of its positions has a q (no bonus token at the very end).
@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
def test_two_row_draft_reads_one_half(gamma):
  target, tp, _, _ = tiny_pair("decoder", seed=11)
  target = Model(target.config.replace(eos_id=-1))  # no early stop: 31 tokens on both rows
  inputs = np.array([[5, 6, 7], [9, 4, 2]], np.int32)
  decoder = Decoder(target, WrongOnRows(target, rows=(1,)), Chain(gamma), SamplingConfig(),
                    max_decode_len=31)
  res = decoder.generate(Params(tp, tp), inputs)
  c = res.counters
  assert np.asarray(c.beta_count_B).tolist() == [31, 31]  # every generated position, both rows
  assert np.asarray(c.beta_sum_B).tolist() == pytest.approx([31.0, 0.0])
  assert acceptance_stats.alpha_of(c) == pytest.approx(0.5)
