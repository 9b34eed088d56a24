"""A lookup-first row's prediction (`collect.lookup_prediction`, `theory.mixed_iteration`).

Why: a lookup-first iteration is the lookup's or the draft's, in a mix that differs by prompt;
the loop timed on a few prompts is moved to the calibration decode's lookup share before the
formula, and a row missing a piece gets no prediction rather than one chain's.
"""
import jax
import jax.numpy as jnp
import pytest

from specdec_jax import timing
from specdec_jax.decoding.decoder import Decoder
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.metrics import theory
from specdec_jax.runner import costs


def test_a_lookup_first_row_is_predicted_from_its_share_of_lookups():
  """A lookup-first iteration is one of two (the lookup's, the draft's): the loop timed on a few
  prompts is moved to the calibration decode's lookup share before the formula
  (`theory.mixed_iteration`, `collect.lookup_prediction`); the timed loop records its own share,
  and a row missing a piece has no prediction rather than the chain's."""
  from types import SimpleNamespace
  from specdec_jax.models.model import Model
  from specdec_jax.models.model_config import get_preset
  from specdec_jax.runner import collect
  target = Model(get_preset("decoder_test_target", vocab_size=16, eos_id=-1))
  tp = target.init(jax.random.key(0))
  template = Decoder(target, sampling=SamplingConfig(), rule="tokenwise", max_decode_len=12)
  batches = [jnp.asarray([[5, 6, 7, 5, 6]], jnp.int32), jnp.asarray([[3, 4, 3, 4, 3]], jnp.int32)]
  options = dict(parallel=False, lookup_gamma=3, lookup_ngram=1, prompt_cache="auto")
  lc = costs.measure_loops(template, tp, {"d": (target, tp, [2])}, batches, seed=0, repeats=1,
                           chain_options=options)["d"]
  assert 0.0 < lc.lookup_share[2] < 1.0 and lc.to_json()["lookup_share"] == {"2": lc.lookup_share[2]}
  plain = costs.measure_loops(template, tp, {"d": (target, tp, [2])}, batches, seed=0,
                              repeats=1)["d"]
  assert plain.lookup_share == {} and "lookup_share" not in plain.to_json()
  # The prediction, by hand: timed at share 0.25, calibrated at 0.75, draft step 2 ms, gamma 2.
  loop = costs.LoopCosts(ar_ms=10.0, ar_fixed_ms=50.0, tokens=40.0, iteration_ms={2: 30.0},
                         fixed_ms={2: 60.0}, tokens_per_iteration={2: 2.0}, batches=1, rows=1,
                         lookup_share={2: 0.25})
  cal = {"gamma": 2, "alpha": 0.9, "accept_at_least": [0.8, 0.6, 0.5], "lookup_share": 0.75}
  point = SimpleNamespace(loop=loop, calibration=cal, gamma=2)
  draft = timing.Costs(target_ms=10.0, draft_ms=2.0, c=0.2, v={})
  counters = {"drafted": 30, "accepted": 20, "emitted": 30, "target_calls": 10, "beta_sum": 0.0,
              "beta_count": 0, "iterations": 10, "accepts_per_position": [7, 5, 3],
              "accepted_length_hist": [3, 2, 2, 3]}
  records = [SimpleNamespace(counters=counters)]
  out = collect.lookup_prediction(point, draft, records, 0.5)
  ms = theory.mixed_iteration(30.0, 0.25, 0.75, 2 * 2.0)
  assert ms == pytest.approx(28.0)
  assert out["expected_tokens_per_iteration"] == pytest.approx(2.9)
  assert out["speedup_predicted"] == pytest.approx((50 + 40 * 10) / (60 + 40 / 2.9 * 28.0))
  assert out["expected_tokens_per_iteration_in_sample"] == pytest.approx(2.5)
  assert out["iteration_ms"] == pytest.approx(29.0)  # the measured share, 0.5
  assert out["speedup_predicted_from"] == "loop, lookup share"
  for broken in (dict(calibration={**cal, "gamma": 3}), dict(calibration={"gamma": 2}),
                 dict(loop=None), dict(loop=plain)):
    assert collect.lookup_prediction(SimpleNamespace(**{**vars(point), **broken}), draft,
                                     records, 0.5) == {}
  with pytest.raises(ValueError, match="lookup shares"):
    theory.mixed_iteration(30.0, 1.5, 0.5, 4.0)


def test_auto_chooses_a_lookup_first_gamma_at_each_candidates_own_lookup_share():
  """GAMMA='auto' with prompt lookup first: each candidate's loop is moved to its own calibration
  decode's lookup share (`lookup_mix.at_shares`) and its E counts every kept token of the mixed
  profile (a lookup iteration keeps up to lookup_gamma = 4 drafts, past draft gamma 2). At the
  timed prompts' 20 % share gamma 2 leads; at the calibration's 80 % most iterations skip the
  longer chain's extra draft steps and gamma 4 wins. The chosen gamma's curve value is the record's
  `speedup_predicted` (`collect.lookup_prediction` reads the same move)."""
  from types import SimpleNamespace
  from specdec_jax.runner import calibrate, collect
  from specdec_jax.runner.run_config import DraftSpec, Point
  from specdec_jax.testing import MemoryStore
  draft = timing.Costs(target_ms=10.0, draft_ms=5.0, c=0.5, v={g: 1.0 for g in range(1, 6)})
  loop = costs.LoopCosts(ar_ms=10.0, ar_fixed_ms=0.0, tokens=40.0,
                         iteration_ms={2: 20.0, 3: 24.0, 4: 25.0},
                         fixed_ms={2: 0.0, 3: 0.0, 4: 0.0},
                         tokens_per_iteration={2: 2.0, 3: 2.0, 4: 2.0}, batches=1, rows=1,
                         lookup_share={2: 0.2, 3: 0.2, 4: 0.2})
  own = {g: {"alpha": 0.9, "accept_at_least": a, "gamma": g, "lookup_share": 0.8}
         for g, a in ((2, [0.9, 0.8, 0.6, 0.5]), (3, [0.9, 0.8, 0.7, 0.5]),
                      (4, [0.9, 0.8, 0.7, 0.6]))}
  point, store = Point(DraftSpec("model", "self"), "auto", 0.0), MemoryStore()
  plan = calibrate.plan_auto(point, draft, store, lambda: own[4], gamma_max=4, min_speedup=1.0,
                             rule="tokenwise")
  assert plan.candidates == (2, 3, 4)
  # pruned by the lone-extend model with the draft's c paid on the 20 % of draft iterations only
  assert plan.lone_curve[4] == pytest.approx(4.0 / (4 * 0.5 * 0.2 + 1.0))
  as_timed = calibrate.choose(calibrate.with_own_profiles(plan, lambda g: {**own[g],
                                                                           "lookup_share": 0.2}),
                              draft, loop, MemoryStore(), min_speedup=1.0, rule="tokenwise")
  assert as_timed["gamma"] == 2 and dict(as_timed["curve"])[2] == pytest.approx(3.8 * 10 / 20)
  memo = calibrate.choose(calibrate.with_own_profiles(plan, own.get), draft, loop, store,
                          min_speedup=1.0, rule="tokenwise")
  curve = dict(memo["curve"])
  assert curve[2] == pytest.approx(3.8 * 10.0 / (20.0 - 0.6 * 2 * 5.0))  # E 3.8, not 2.7
  assert curve[4] == pytest.approx(4.0 * 10.0 / (25.0 - 0.6 * 4 * 5.0))
  assert memo["gamma"] == 4 and memo["curve_from"] == "loop, lookup share"
  assert memo["lookup_share"] == {"2": 0.8, "3": 0.8, "4": 0.8}
  resolved = calibrate.resolved(point, memo=memo, loop=loop, calibration=own[4])
  assert resolved.calibration == own[4] and resolved.loop is loop  # the record keeps the timing
  records = [SimpleNamespace(counters={
      "drafted": 30, "accepted": 20, "emitted": 30, "target_calls": 10, "beta_sum": 0.0,
      "beta_count": 0, "iterations": 10, "accepts_per_position": [7, 5, 3, 2],
      "accepted_length_hist": [3, 2, 2, 1, 2]})]
  out = collect.lookup_prediction(resolved, draft, records, 0.5)
  assert out["speedup_predicted"] == pytest.approx(curve[4])
