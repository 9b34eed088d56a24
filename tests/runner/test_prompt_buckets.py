"""Prompt batches padded to width buckets (`runner.inputs.bucket_width`).

Why: a batch padded to the run's longest prompt made every request pay the target's encoder
and cross-attention over that width (en-de: 100 ids for prompts of 28 on average). Buckets
must never cut a prompt, must give a handful of shapes (each a compile), and must not change
what is decoded: the same prompt padded to its bucket or to the run's width decodes to the same
tokens (T5: the encoder masks the padding; decoder-only: the prompt's length is per row).
"""
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.runner.inputs import MIN_BUCKET, Prompts, bucket_width
from specdec_jax.testing import tiny_pair


def test_bucket_width_is_the_next_power_of_two_capped_at_the_run_width():
  assert [bucket_width(n, 100) for n in (1, 16, 17, 28, 33, 64, 65, 100)] == [
      16, 16, 32, 32, 64, 64, 100, 100]
  assert bucket_width(3, 5) == 5 and MIN_BUCKET == 16
  widths = {bucket_width(n, 100) for n in range(1, 101)}
  assert widths == {16, 32, 64, 100}  # four shapes, four compiles per program at most


def test_batches_pad_to_their_bucket_or_to_the_run_width():
  ids = [[5] * 3, [6] * 20, [7] * 70]
  on = Prompts([None] * 3, ids, None, width=70, pad_id=0)
  off = Prompts([None] * 3, ids, None, width=70, pad_id=0, buckets=False)
  assert on.batch([0]).shape == (1, 16) and on.batch([0, 1]).shape == (2, 32)
  assert on.batch([2]).shape == (1, 70) and off.batch([0]).shape == (1, 70)
  np.testing.assert_array_equal(on.batch([1])[0, :20], ids[1])
  assert not on.batch([1])[0, 20:].any()
  assert on.take([0]).buckets and not off.take([0]).buckets


@pytest.mark.parametrize("kind", ["t5", "decoder"])
def test_the_padded_width_does_not_change_the_decode(kind):
  target, tp, _, _ = tiny_pair(kind)
  rows = [[5, 6, 7, 8, 9, 1], [4, 3, 1]] if kind == "t5" else [[5, 6, 7, 8, 9], [4, 3]]
  prompts = Prompts([None] * 2, rows, None, width=40)
  narrow, wide = prompts.batch([0, 1]), Prompts([None] * 2, rows, None, 40, buckets=False).batch(
      [0, 1])
  assert narrow.shape[1] == 16 and wide.shape[1] == 40
  decoder = Decoder(target, max_decode_len=10)
  a = decoder.generate(Params(tp), jnp.asarray(narrow))
  b = decoder.generate(Params(tp), jnp.asarray(wide))
  np.testing.assert_array_equal(np.asarray(a.tokens_BxN), np.asarray(b.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(a.lengths_B), np.asarray(b.lengths_B))
