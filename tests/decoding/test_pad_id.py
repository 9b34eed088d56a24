"""Prompts right-padded with a model's own pad id, and a real token 0 inside them.

Why: Llama-3's id 0 is '!'. With the pad fixed at 0, a prompt holding it was cut there (or
refused at the front door); an HF checkpoint now pads with an id no text encodes to
(`checkpoints.hf_decoder.choose_pad_id`), and every prompt length, start token and prompt
lookup reads the model's `pad_id`. These tests fail if any of them still counts zeros.
"""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.models import model_free
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model import Model
from specdec_jax.testing import tiny_pair

GREEDY = SamplingConfig(temperature=0.0)
PAD = 63
# Rows of real tokens holding id 0 (Llama-3's '!'), right-padded with PAD.
ROWS = [[5, 0, 7, 0, 9], [0, 8, 3], [4, 0]]


def _padded(rows, pad):
  width = max(len(r) for r in rows) + 2
  return jnp.asarray([r + [pad] * (width - len(r)) for r in rows], jnp.int32)


def _with_pad(model, pad):
  return Model(dataclasses.replace(model.config, pad_id=pad))


@pytest.fixture(scope="module")
def pair():
  target, tp, draft, dp = tiny_pair("llama")
  return _with_pad(target, PAD), tp, _with_pad(draft, PAD), dp


def _ar(target, tp, inputs):
  return Decoder(target, sampling=GREEDY, max_decode_len=10).generate(Params(tp), inputs)


def test_a_padded_batch_decodes_each_prompt_whole(pair):
  """Each row of the padded batch decodes as that prompt alone, unpadded: the zeros inside it
  are read as tokens (a pad-0 reading would cut row 0 after 5 and give another output)."""
  target, tp, _, _ = pair
  batch = np.asarray(_ar(target, tp, _padded(ROWS, PAD)).tokens_BxN)
  for b, row in enumerate(ROWS):
    alone = np.asarray(_ar(target, tp, jnp.asarray([row], jnp.int32)).tokens_BxN)[0]
    np.testing.assert_array_equal(batch[b], alone)
  cut = np.asarray(_ar(target, tp, jnp.asarray([[5, PAD, PAD, PAD, PAD]], jnp.int32)).tokens_BxN)
  assert not np.array_equal(batch[0], cut[0])


@pytest.mark.parametrize("draft_kind", ["model", "prompt_lookup"])
def test_greedy_speculative_equals_autoregressive(pair, draft_kind):
  target, tp, draft, dp = pair
  if draft_kind == "prompt_lookup":
    draft, dp = model_free.make_draft("prompt_lookup", target), {}
  inputs = _padded(ROWS, PAD)
  spec = Decoder(target, draft, Chain(3), GREEDY, max_decode_len=10).generate(
      Params(tp, dp), inputs)
  ar = _ar(target, tp, inputs)
  np.testing.assert_array_equal(np.asarray(spec.tokens_BxN), np.asarray(ar.tokens_BxN))
  np.testing.assert_array_equal(np.asarray(spec.lengths_B), np.asarray(ar.lengths_B))


def test_start_tokens_and_history_read_the_pad_id(pair):
  target, _, _, _ = pair
  inputs = _padded(ROWS, PAD)
  np.testing.assert_array_equal(np.asarray(target.start_tokens(inputs)), [9, 3, 0])
  lookup = model_free.make_draft("prompt_lookup", target)
  np.testing.assert_array_equal(np.asarray(lookup.start_tokens(inputs)), [9, 3, 0])
  cache = lookup.prefill({}, inputs, 16)
  np.testing.assert_array_equal(np.asarray(cache.index_B), [4, 2, 1])
