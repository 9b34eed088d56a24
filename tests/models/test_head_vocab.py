"""A draft with a restricted (frequency-ranked) output head (`specdec_jax.models.head_vocab`).

Why these tests: the restriction changes the draft's distribution q (zero off its head), and the
whole claim is that speculative decoding stays exact for it: (1) its logits are the full head's
on the kept tokens and -inf elsewhere, packed for the CPU kernel too; (2) greedy speculative output
equals autoregressive token for token; (3) speculative sampling with it reproduces the target's
exact distribution, with a head that leaves out half the vocabulary, so the target's mass on the
tokens the draft cannot propose has to come from the residual; (4) the run's loading refuses bad
input with errors that name the problem (the ranking file itself: tests/checkpoints/
test_head_ranking.py).
"""
import contextlib
import json
import logging as _logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.checkpoints import head_ranking, orbax_io
from specdec_jax.models import head_vocab as hv
from specdec_jax.models import packed
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model
from specdec_jax.runner.run_config import DraftSpec, RunConfig
from specdec_jax.runner.drafts import DraftSettings, load_draft
from specdec_jax.testing import chi_square_gof, exact_joint, ragged_prompts, tiny_pair


@pytest.mark.parametrize("kind", ("t5", "decoder"))
@pytest.mark.parametrize("matmul", ("xla", "hybrid"))
def test_restricted_logits_are_the_full_heads_on_its_tokens(kind, matmul):
  _, _, draft, dp = tiny_pair(kind, vocab_size=64)
  ids = tuple(range(0, 64, 3))
  small, sp = hv.restrict(draft, dp, ids)
  assert sp["decoder"]["logits_dense"]["kernel"].shape[-1] == len(ids)
  if matmul != "xla":
    small, sp = packed.pack(small, sp, matmul)
  _, prompts = ragged_prompts([4, 2], extra=0)
  tokens = jnp.asarray([[0, 5, 7], [0, 9, 2]], jnp.int32)
  full, _ = draft.extend(dp, draft.prefill(dp, prompts, 8), tokens)
  got, _ = small.extend(sp, small.prefill(sp, prompts, 8), tokens)
  got, full = np.asarray(got), np.asarray(full)
  np.testing.assert_allclose(got[..., list(ids)], full[..., list(ids)], rtol=2e-5, atol=2e-5)
  off = np.setdiff1d(np.arange(64), ids)
  assert np.all(np.isneginf(got[..., off]))


@pytest.mark.parametrize("kind", ("t5", "decoder"))
def test_greedy_speculative_with_restricted_head_equals_autoregressive(kind):
  target, tp, draft, dp = tiny_pair(kind, vocab_size=64)
  draft, dp = hv.restrict(draft, dp, hv.select(list(range(64)), 16, draft.eos_id))
  _, prompts = ragged_prompts([6, 3, 5, 1], extra=0, seed=3)
  greedy = SamplingConfig(temperature=0.0)
  ar = Decoder(target, sampling=greedy, max_decode_len=12).generate(Params(tp), prompts)
  for gamma in (1, 3):
    sp = Decoder(target, draft, Chain(gamma), greedy, max_decode_len=12).generate(
        Params(tp, dp), prompts)
    np.testing.assert_array_equal(sp.tokens_BxN, ar.tokens_BxN)
    np.testing.assert_array_equal(sp.lengths_B, ar.lengths_B)


def test_speculative_sampling_with_restricted_head_is_exact():
  """The test_distribution setting (vocabulary 6, 3 tokens, 100k samples, chi-square against the
  enumerated truth) with a draft that can propose only tokens 0, 2 and 3."""
  v, n, num_samples, prompt = 6, 3, 100_000, np.array([3, 5, 2], np.int32)
  cfg = get_preset("decoder_test_draft", vocab_size=v, emb_dim=16, num_decoder_layers=1,
                   eos_id=-1)
  target, draft = Model(cfg), Model(cfg.replace(mlp_dim=16))
  tp = jax.tree_util.tree_map(lambda x: 2.0 * x, target.init(jax.random.key(11)))
  draft, dp = hv.restrict(draft, draft.init(jax.random.key(12)), (0, 2, 3))
  sampling = SamplingConfig(temperature=1.0)
  inputs = jnp.asarray(np.broadcast_to(prompt, (num_samples, len(prompt))))
  out = Decoder(target, draft, Chain(2), sampling, max_decode_len=n).generate(
      Params(tp, dp), inputs, jax.random.key(0))
  tokens = np.asarray(out.tokens_BxN[:, :n])
  counts = np.bincount(np.ravel_multi_index(tokens.T, (v,) * n), minlength=v ** n)
  probs = exact_joint(target, tp, prompt, n, sampling).ravel()
  head = [0, 2, 3]  # the residual has work to do: the target often writes another token
  assert 1.0 - probs.reshape((v,) * n)[np.ix_(head, head, head)].sum() > 0.2
  _, _, pvalue = chi_square_gof(counts, probs)
  assert pvalue > 1e-3


def test_select_keeps_eos():
  ranking = [4, 2, 7, 0, 1, 3, 5, 6]
  assert hv.select(ranking, 3, eos_id=1) == (1, 2, 4)  # EOS replaces the 3rd
  assert hv.select(ranking, 3, eos_id=2) == (2, 4, 7)
  for bad in (0, 9, 2.5, True):
    with pytest.raises(ValueError, match="draft_head_vocab must be an integer"):
      hv.select(ranking, bad, eos_id=1)


def test_restrict_refuses_misuse():
  _, _, draft, dp = tiny_pair("t5", vocab_size=64)
  for bad in ((), (3, 1), (1, 1), (0, 64)):
    with pytest.raises(ValueError, match="sorted, distinct token ids"):
      hv.restrict(draft, dp, bad)
  small, sp = hv.restrict(draft, dp, (1, 2))
  with pytest.raises(ValueError, match="already restricted"):
    hv.restrict(small, sp, (1,))
  pm, pp = packed.pack(draft, dp, "kernel")
  with pytest.raises(ValueError, match="before packing"):
    hv.restrict(pm, pp, (1, 2))


@contextlib.contextmanager
def _warnings():
  """The warning lines absl logs inside the block."""
  from absl import logging as absl_logging
  lines = []
  handler = _logging.Handler(_logging.WARNING)
  handler.emit = lambda record: lines.append(record.getMessage())
  absl_logging.get_absl_logger().addHandler(handler)
  try:
    yield lines
  finally:
    absl_logging.get_absl_logger().removeHandler(handler)


def test_run_config_and_load_draft(tmp_path):
  with pytest.raises(ValueError, match="DRAFT_HEAD_VOCAB must be an integer >= 0"):
    RunConfig(draft_head_vocab=-1)
  assert "draft_head_vocab" not in RunConfig().fingerprint()
  assert RunConfig(draft_head_vocab=8).fingerprint()["draft_head_vocab"] == 8
  target, tp, _, _ = tiny_pair("t5")
  head8 = DraftSettings(head_vocab=8)
  with pytest.raises(ValueError, match="random preset"):  # asked for a head it cannot have
    load_draft(DraftSpec("model", "t5_test_draft"), target, tp, head8)
  # A checkpoint without a ranking (converted, freshly trained) decodes with its full head and
  # says so in one warning line; with one, its head is restricted.
  _, _, draft, dp = tiny_pair("t5")
  ckpt = str(tmp_path / "draft")
  orbax_io.save(ckpt, draft.config, dp)
  with _warnings() as lines:
    d, p = load_draft(DraftSpec("model", ckpt), target, tp, head8)
  assert d.head_ids is None and len(lines) == 1 and "head_ranking.json" in lines[0]
  assert "full output head" in lines[0]
  assert p["decoder"]["logits_dense"]["kernel"].shape[-1] == draft.vocab_size
  v = draft.vocab_size
  head_ranking.write_ranking(ckpt, head_ranking.ranking_from_counts(np.arange(v)), v, "t",
                             tasks={"summarize": list(range(v))})
  d, p = load_draft(DraftSpec("model", ckpt), target, tp, head8)
  assert len(d.head_ids) == 8 and draft.eos_id in d.head_ids
  assert d.head_ids[-1] == v - 1  # the mixture ranks the highest ids first
  d, _ = load_draft(DraftSpec("model", ckpt), target, tp,
                    DraftSettings(head_vocab=8, task="summarize"))
  assert d.head_ids == tuple(range(8))  # the task's own ranking
  assert p["decoder"]["logits_dense"]["kernel"].shape[-1] == 8
  assert json.load(open(os.path.join(ckpt, head_ranking.RANKING_FILE)))["source"] == "t"
