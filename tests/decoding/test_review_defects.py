"""Defects found in review of the decoding core; each test failed before its fix.

1. Token-wise acceptance accepted a token the target gives probability 0 when the uniform draw
   was exactly 0 (`r * q <= p`).
2. A decoder-only prompt holding id 0 was silently cut at that 0 (lengths counted non-zero ids).
4. A T5 target with a decoder-only draft (or the reverse) ran to the end with alpha 0.
5. Counters counted draft tokens thrown away at EOS or the length limit as accepted.
(3, two drafts with the same folder name, is a run-configuration defect: tests/runner.)
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding import acceptance, start
from specdec_jax.decoding.adaptive import AdaptiveConfig
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.models.model import Model
from specdec_jax.testing import tiny_pair

GREEDY = SamplingConfig(temperature=0.0)


# ---- 1. probability-0 tokens are never accepted ------------------------------------------------
def test_accept_test_rejects_zero_probability_even_for_r_zero():
  r = jnp.asarray([0.0, 0.0, 0.5, 0.999999], jnp.float32)
  p = jnp.asarray([0.0, 0.3, 0.3, 0.3], jnp.float32)
  q = jnp.asarray([1.0, 0.6, 0.6, 0.3], jnp.float32)
  # p = 0: never; r = 0 < p/q: yes; 0.5 < 0.5: no (strict); p >= q: always, whatever r.
  assert acceptance.accept_test(r, p, q).tolist() == [False, True, False, True]


def test_tokenwise_never_emits_a_target_zero_token():
  """One-hot q on token 0, one-hot p on token 2: every row must reject and emit 2. Key 2 draws an
  exact 0.0 for one of the 2^20 rows (asserted below, so the test keeps testing what it says)."""
  rows, v = 1 << 20, 4
  key = jax.random.key(2)
  r = jax.random.uniform(jax.random.split(key)[0], (rows, 1), jnp.float32)
  assert int(jnp.sum(r == 0.0)) >= 1, "the key no longer draws r = 0: pick another"
  q = jnp.zeros((rows, 1, v), jnp.float32).at[:, :, 0].set(1.0)
  p = jnp.zeros((rows, 2, v), jnp.float32).at[:, :, 2].set(1.0)
  n_B, next_B = jax.jit(acceptance.tokenwise)(key, jnp.zeros((rows, 1), jnp.int32), q, p)
  assert int(jnp.max(n_B)) == 0
  assert bool(jnp.all(next_B == 2))


# ---- 2. a pad id inside a prompt is refused ----------------------------------------------------
@pytest.mark.parametrize("kind", ["decoder", "t5"])
def test_prompt_with_inner_zero_is_refused(kind):
  target, tp, draft, dp = tiny_pair(kind)
  bad = np.array([[5, 0, 7, 9], [5, 6, 0, 0]], np.int32)
  with pytest.raises(ValueError, match=r"row 0 holds the pad id 0 at position 1"):
    Decoder(target, sampling=GREEDY, max_decode_len=4).generate(Params(tp), bad)
  with pytest.raises(ValueError, match="pad id 0"):
    Decoder(target, draft, Chain(2), GREEDY, max_decode_len=4).generate(Params(tp, dp), bad)
  start.check_prompts(bad[1:])  # trailing pads are padding, not content


def test_jsonl_input_ids_with_inner_zero_are_refused(tmp_path):
  from specdec_jax.data import local_tasks
  path = tmp_path / "p.jsonl"
  path.write_text('{"input_ids": [5, 7]}\n{"input_ids": [5, 0, 7, 9]}\n')
  with pytest.raises(ValueError, match=r"line 2: `input_ids` holds the pad id 0 at position 1"):
    local_tasks.load_examples(str(path))


# ---- 4. a draft of the other kind is refused before anything is compiled -----------------------
def test_draft_of_the_other_kind_is_refused():
  t5, t5p, _, _ = tiny_pair("t5", vocab_size=64)
  lm, lmp, _, _ = tiny_pair("decoder", vocab_size=64)
  inputs = np.array([[5, 6, 1]], np.int32)
  for target, tp, draft, dp in ((t5, t5p, lm, lmp), (lm, lmp, t5, t5p)):
    with pytest.raises(ValueError, match=r"draft is .*kind '(decoder|t5)'.*target is .*kind"):
      Decoder(target, draft, Chain(2), GREEDY, max_decode_len=4).generate(Params(tp, dp), inputs)
    with pytest.raises(ValueError, match="kind"):
      Decoder(target, draft, AdaptiveConfig(gamma_max=2), GREEDY, max_decode_len=4).generate(
          Params(tp, dp), inputs)


# ---- 5. counters count written tokens only -----------------------------------------------------
@pytest.mark.parametrize("kind", ["decoder", pytest.param("t5", marks=pytest.mark.slow)])
def test_counters_count_only_written_tokens(kind):
  """Draft = target, max_decode_len 7, gamma 4: the second call's block is cut by the length
  limit. Before the fix: accepted 8, emitted 7."""
  target, tp, _, _ = tiny_pair(kind)
  target = Model(target.config.replace(eos_id=-1))  # no early EOS: the length limit cuts
  inputs = np.array([[5, 6, 7, 1]], np.int32)
  res = Decoder(target, target, Chain(4), GREEDY, max_decode_len=7).generate(Params(tp, tp),
                                                                              inputs)
  c = res.counters
  accepted, drafted = int(c.accepted_B[0]), int(c.drafted_B[0])
  emitted, calls = int(c.emitted_B[0]), int(c.target_calls_B[0])
  assert emitted == 7 and calls == 2
  assert accepted == drafted == emitted - 1  # 4 + next, then 2 of the 4 kept (no next token)
  assert int(np.asarray(c.accepts_per_position_BxG).sum()) == accepted
  hist = np.asarray(c.accepted_length_hist_BxG1)[0]
  assert hist.tolist() == [0, 0, 1, 0, 1]


def test_registered_rule_is_scoped():
  """The exactness checker's fault rule exists inside its block only (it used to be written into
  the global registry for the rest of the process), and never replaces a real rule."""
  def wrong(key, x, q, p):
    return acceptance.tokenwise(key, x, q, p)
  before = dict(acceptance.ACCEPTANCE_RULES)
  with pytest.raises(RuntimeError):
    with acceptance.registered_rule("_test_wrong", wrong) as name:
      assert acceptance.get_rule(name) is wrong
      raise RuntimeError("the check failed half way")
  assert acceptance.ACCEPTANCE_RULES == before
  with pytest.raises(ValueError, match="already exists"):
    with acceptance.registered_rule("tokenwise", wrong):
      pass
  assert acceptance.ACCEPTANCE_RULES == before
