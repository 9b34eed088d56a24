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
                         iteration_ms={1: 18.0, 2: 20.0, 3: 24.0, 4: 25.0},
                         fixed_ms={1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0},
                         tokens_per_iteration={1: 2.0, 2: 2.0, 3: 2.0, 4: 2.0}, batches=1, rows=1,
                         lookup_share={1: 0.2, 2: 0.2, 3: 0.2, 4: 0.2})
  own = {g: {"alpha": 0.9, "accept_at_least": a, "gamma": g, "lookup_share": 0.8}
         for g, a in ((1, [0.9, 0.7, 0.6, 0.5]), (2, [0.9, 0.8, 0.6, 0.5]),
                      (3, [0.9, 0.8, 0.7, 0.5]), (4, [0.9, 0.8, 0.7, 0.6]))}
  point, store = Point(DraftSpec("model", "self"), "auto", 0.0), MemoryStore()
  plan = calibrate.plan_auto(point, draft, store, lambda: own[4], gamma_max=4, min_speedup=1.0,
                             rule="tokenwise")
  # Ranked by the lookup-first lone-extend model (`lookup_mix.lone_curve`: c paid on the 20 % of
  # draft iterations, a lookup iteration keeping the whole profile) and all four timed: gamma 1
  # would be dropped by a chain's model (E 1.9 against 4.0 at gamma 4).
  assert plan.candidates == (1, 2, 3, 4)
  assert plan.lone_curve[4] == pytest.approx(4.0 / (4 * 0.5 * 0.2 + 1.0))
  assert plan.lone_curve[1] == pytest.approx((1.9 + 0.8 * 2.1) / (0.5 * 0.2 + 1.0))
  as_timed = calibrate.choose(calibrate.with_own_profiles(plan, lambda g: {**own[g],
                                                                           "lookup_share": 0.2}),
                              draft, loop, MemoryStore(), min_speedup=1.0, rule="tokenwise")
  assert as_timed["gamma"] == 1 and dict(as_timed["curve"])[1] == pytest.approx(3.7 * 10 / 18)
  memo = calibrate.choose(calibrate.with_own_profiles(plan, own.get), draft, loop, store,
                          min_speedup=1.0, rule="tokenwise")
  curve = dict(memo["curve"])
  assert curve[2] == pytest.approx(3.8 * 10.0 / (20.0 - 0.6 * 2 * 5.0))  # E 3.8, not 2.7
  assert curve[4] == pytest.approx(4.0 * 10.0 / (25.0 - 0.6 * 4 * 5.0))
  assert memo["gamma"] == 4 and memo["curve_from"] == "loop, lookup share"
  assert memo["lookup_share"] == {"1": 0.8, "2": 0.8, "3": 0.8, "4": 0.8}
  resolved = calibrate.resolved(point, memo=memo, loop=loop, calibration=own[4])
  assert resolved.calibration == own[4] and resolved.loop is loop  # the record keeps the timing
  records = [SimpleNamespace(counters={
      "drafted": 30, "accepted": 20, "emitted": 30, "target_calls": 10, "beta_sum": 0.0,
      "beta_count": 0, "iterations": 10, "accepts_per_position": [7, 5, 3, 2],
      "accepted_length_hist": [3, 2, 2, 1, 2]})]
  out = collect.lookup_prediction(resolved, draft, records, 0.5)
  assert out["speedup_predicted"] == pytest.approx(curve[4])


def test_at_shares_moves_each_lookup_gammas_median_and_rounds_by_its_own_share():
  """`lookup_mix.at_shares`: a lookup-first gamma's median and every timed round move by (its
  timed share - the new share) x gamma x the draft step; a round the noise ate stays eaten, a
  gamma timed without lookups (or not asked) stays as timed; the running maximum over chain
  gammas leaves lookup-first programs alone (each is a mix at its own share)."""
  from specdec_jax.runner import lookup_mix
  loop = costs.LoopCosts(ar_ms=10.0, ar_fixed_ms=0.0, tokens=40.0,
                         iteration_ms={2: 20.0, 3: 24.0, 5: 30.0}, fixed_ms={},
                         tokens_per_iteration={}, batches=1, rows=1, ar_rounds_ms=(10.0, 11.0),
                         iteration_rounds_ms={2: [19.0, 0.0], 3: [23.0, 25.0], 5: [29.0, 31.0]},
                         lookup_share={2: 0.5, 3: 0.1})
  moved, shares = lookup_mix.at_calibration(
      loop, {2: {"lookup_share": 0.25}, 3: {"lookup_share": 0.6}, 5: {"lookup_share": 0.9}},
      draft_ms=2.0)
  assert shares == {2: 0.25, 3: 0.6}  # gamma 5 was not timed as lookup-first
  assert moved.iteration_ms == {2: pytest.approx(21.0), 3: pytest.approx(21.0), 5: 30.0}
  assert moved.iteration_rounds_ms[2] == [pytest.approx(20.0), 0.0]
  assert moved.iteration_rounds_ms[3] == [pytest.approx(20.0), pytest.approx(22.0)]
  assert moved.iteration_rounds_ms[5] == [29.0, 31.0]
  assert moved.lookup_share == {2: 0.25, 3: 0.6}
  assert lookup_mix.at_shares(loop, {}, 2.0) is loop


def test_calibration_gamma_is_capped_for_lookup_first_points_only():
  """The calibration decode runs at max(auto_calibration_gamma, gamma_max, fixed gammas); a
  lookup-first point's within lookup_gamma (its chain verifies lookup_gamma tokens and the
  draft's must fit), a prompt-lookup point of the same run not; a lookup-first decode stored
  without its lookup share (before decodes recorded it) is decoded again."""
  from specdec_jax.runner import autotune
  from specdec_jax.runner.run_config import DraftSpec, Point, RunConfig
  from specdec_jax.testing import MemoryStore
  decoded = []

  class Fake:
    prompts, held_out = 2, True

    def decode(self, point, gamma, statistic):
      decoded.append((point.draft.name, gamma))
      share = {"lookup_share": 0.4} if point.draft.kind == "model" else {}
      return {"alpha": 0.5, "accept_at_least": [0.5] * gamma, **share}
  model, lookup = DraftSpec("model", "self"), DraftSpec("prompt_lookup")
  one, _ = autotune._acceptances(RunConfig(gamma=[10], gamma_max=8), Fake(), MemoryStore())
  assert one(Point(lookup, 10, 0.0))["gamma"] == 10  # a fixed gamma past gamma_max
  cfg = RunConfig(draft=["model", "prompt_lookup"], draft_checkpoint="self", gamma="auto",
                  gamma_max=8, feature_lookup_gamma=5, auto_each_gamma=True)
  store = MemoryStore()
  one, own = autotune._acceptances(cfg, Fake(), store)
  assert one(Point(model, "auto", 0.0))["gamma"] == 5
  assert one(Point(lookup, "auto", 0.0))["gamma"] == 8
  key = "calibration", next(k for k in store.state["calibration"] if "self" in k)
  store.remember(*key, {"alpha": 0.5, "accept_at_least": [0.5] * 5, "gamma": 5})  # stale
  decoded.clear()
  assert one(Point(model, "auto", 0.0))["lookup_share"] == 0.4 and decoded == [("self", 5)]
  assert own(Point(model, "auto", 0.0), 3)["gamma"] == 3
