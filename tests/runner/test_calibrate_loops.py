"""The cost model behind GAMMA='auto' and speedup_predicted (specdec_jax/runner/calibrate.py).

Why: 'auto' used to choose from lone `extend` timings that leave out each iteration's sampling,
first draft call and glue (default run: 1.21x predicted, 1.00x measured). It now times the real
loop per candidate gamma; these tests pin that the timed program IS the run's decode (same tokens,
same counters, iterations as capped), that the choice follows the loop costs rather than the
lone-extend ranking, that pruning is what the docstring says, and that the expected length comes
from the calibration decode's measured profile (block verification, clustered acceptances).
"""
import dataclasses
import json
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import timing
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.speculative import Chain
from specdec_jax.metrics import acceptance_stats, theory
from specdec_jax.runner import calibrate, costs
from specdec_jax.runner.run_config import DraftSpec, Point
from specdec_jax.testing import MemoryStore, tiny_pair


SPEC = DraftSpec("model", "some/draft")
# Lone extend: verification nearly free, a cheap draft -> ranks gamma 4 above gamma 1.
COSTS = timing.Costs(target_ms=4.0, draft_ms=0.4, c=0.1,
                     v={1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15, 5: 1.2})


def _loop(iteration_ms, tokens=40.0, ar_ms=4.0):
  return costs.LoopCosts(ar_ms=ar_ms, ar_fixed_ms=0.0, tokens=tokens,
                             iteration_ms=iteration_ms, fixed_ms={g: 0.0 for g in iteration_ms},
                             tokens_per_iteration={g: 1.0 for g in iteration_ms}, batches=1,
                             rows=1)


def test_choice_follows_the_timed_loops_not_the_lone_extend_ranking():
  store = MemoryStore()
  point = Point(SPEC, "auto", 0.0)
  plan = calibrate.plan_auto(point, COSTS, store, lambda: {"alpha": 0.8}, gamma_max=4,
                             min_speedup=1.0, rule="tokenwise")
  lone = plan.lone_curve
  assert max((g for g in lone if g), key=lone.get) == 4
  assert plan.candidates == (2, 3, 4)  # the best three of the lone-extend curve
  # The real iterations: each draft step costs far more than its lone extend (sampling over V).
  loop = _loop({2: 7.0, 3: 9.5, 4: 12.0})
  memo = calibrate.choose(plan, COSTS, loop, store, min_speedup=1.0, rule="tokenwise")
  curve = dict(memo["curve"])
  assert memo["gamma"] == 2 and memo["curve_from"] == "loop"
  assert curve[2] == pytest.approx(theory.expected_tokens(0.8, 2) * 4.0 / 7.0)
  assert store.recall("gammas", "some/draft@t0") or store.state  # remembered
  again = calibrate.plan_auto(point, COSTS, store, lambda: pytest.fail("re-calibrated"),
                              gamma_max=4, min_speedup=1.0, rule="tokenwise")
  assert again.memo["gamma"] == 2 and calibrate.loop_gammas(point, again) == (2,)


def test_loops_predicting_no_gain_choose_autoregressive():
  store = MemoryStore()
  plan = calibrate.plan_auto(Point(SPEC, "auto", 0.0), COSTS, store, lambda: {"alpha": 0.8},
                             gamma_max=4, min_speedup=1.1, rule="tokenwise")
  memo = calibrate.choose(plan, COSTS, _loop({2: 9.0, 3: 12.0, 4: 15.0}), store,
                          min_speedup=1.1, rule="tokenwise")
  assert memo["gamma"] == 0


def test_pruning_keeps_the_best_few_above_the_floor():
  curve = {0: 1.0, 1: 0.7, 2: 0.95, 3: 1.3, 4: 1.25, 5: 1.2, 6: 0.85}
  assert calibrate.candidates(curve, 1.1, max_candidates=3, prune_below=0.8) == (3, 4, 5)
  assert calibrate.candidates(curve, 1.1, max_candidates=8, prune_below=0.8) == (2, 3, 4, 5)
  assert calibrate.candidates({0: 1.0, 1: 0.5, 2: 0.4}, 1.0) == ()  # nothing compiled
  store = MemoryStore()
  plan = calibrate.plan_auto(Point(SPEC, "auto", 0.0), COSTS, store, lambda: {"alpha": 0.01},
                             gamma_max=4, min_speedup=1.2, rule="tokenwise")
  assert plan.candidates == ()  # lone extend: 0.88x at best, below 0.8 x 1.2
  memo = calibrate.choose(plan, COSTS, None, store, min_speedup=1.2, rule="tokenwise")
  assert memo["gamma"] == 0 and memo["curve_from"] == "pruned"


def test_block_rule_is_chosen_from_its_own_expected_length():
  """At temperature > 0 the block rule's A_i (not alpha^i) make the expected length."""
  store = MemoryStore()
  a_i = [0.6, 0.55, 0.5, 0.45]  # a block decode keeps i drafts far more often than 0.6^i
  plan = calibrate.plan_auto(Point(SPEC, "auto", 1.0), COSTS, store,
                             lambda: {"alpha": 0.6, "accept_at_least": a_i}, gamma_max=4,
                             min_speedup=1.0, rule="block")
  loop = _loop({2: 7.0, 3: 8.0, 4: 9.0})
  memo = calibrate.choose(plan, COSTS, loop, store, min_speedup=1.0, rule="block")
  curve = dict(memo["curve"])
  assert curve[3] == pytest.approx((1 + 0.6 + 0.55 + 0.5) * 4.0 / 8.0)
  assert curve[3] != pytest.approx(theory.expected_tokens(0.6, 3) * 4.0 / 8.0)
  assert theory.effective_rule("block", 0.0) == "tokenwise"
  # The calibration decode covers every candidate, whatever auto_calibration_gamma says.
  assert calibrate.calibration_gamma(4, 8) == 8 and calibrate.calibration_gamma(10, 8) == 10


def test_clustered_acceptance_is_chosen_from_its_profile_not_alpha():
  """Token-wise, greedy: prompt lookup copies a span or nothing, so alpha over positions (0.936
  on code) overstates how often a call keeps i drafts (A_1 0.67 ... A_4 0.61 measured there).
  With the profile the best gamma predicts 3.52 x 4 / 9 = 1.56x, below a 1.6 bar, so 'auto'
  stays autoregressive; alpha's formula (E = 4.40: 1.96x) would have chosen gamma 4."""
  a_i = [0.67, 0.62, 0.62, 0.61]
  loop = _loop({2: 7.0, 3: 8.0, 4: 9.0})
  kw = dict(gamma_max=4, min_speedup=1.6, rule="tokenwise")
  plan = calibrate.plan_auto(Point(SPEC, "auto", 0.0), COSTS, MemoryStore(),
                             lambda: {"alpha": 0.936, "accept_at_least": a_i}, **kw)
  memo = calibrate.choose(plan, COSTS, loop, MemoryStore(), min_speedup=1.6, rule="tokenwise")
  assert dict(memo["curve"])[4] == pytest.approx((1 + sum(a_i)) * 4.0 / 9.0)
  assert memo["gamma"] == 0 and memo["accept_at_least"] == a_i
  assert dict(plan.lone_curve)[4] == pytest.approx((1 + sum(a_i)) / (4 * 0.1 + 1.2))
  naive = calibrate.plan_auto(Point(SPEC, "auto", 0.0), COSTS, MemoryStore(),
                              lambda: {"alpha": 0.936}, **kw)
  assert calibrate.choose(naive, COSTS, loop, MemoryStore(), min_speedup=1.6,
                          rule="tokenwise")["gamma"] == 4


def test_each_gamma_is_predicted_from_its_own_calibration_decode():
  """RunConfig.auto_each_gamma: where a call starts depends on gamma, so clustered acceptances
  (prompt lookup) keep more per call at a small gamma than the calibration gamma's profile says
  (HumanEval: A_1 0.44 at gamma 4 against 0.36 at gamma 8). Each candidate is then predicted
  from its own decode's profile, the memo keeps them, and the chosen gamma's own decode is the
  calibration its speedup_predicted reads; without the setting nothing else is decoded."""
  a8 = [0.36, 0.28, 0.23, 0.19]  # the one decode at the calibration gamma
  own = {2: {"alpha": 0.7, "accept_at_least": [0.45, 0.37], "gamma": 2},
         3: {"alpha": 0.7, "accept_at_least": [0.44, 0.36, 0.30], "gamma": 3},
         4: {"alpha": 0.7, "accept_at_least": [0.44, 0.36, 0.29, 0.26], "gamma": 4}}
  asked = []

  def own_fn(g):
    asked.append(g)
    return own[g]
  store = MemoryStore()
  point = Point(SPEC, "auto", 0.0)
  plan = calibrate.with_own_profiles(calibrate.plan_auto(
      point, COSTS, store, lambda: {"alpha": 0.67, "accept_at_least": a8}, gamma_max=4,
      min_speedup=1.0, rule="tokenwise"), own_fn)
  assert tuple(asked) == plan.candidates == (2, 3, 4)  # one decode per candidate
  loop = _loop({2: 6.0, 3: 7.0, 4: 8.0})
  memo = calibrate.choose(plan, COSTS, loop, store, min_speedup=1.0, rule="tokenwise")
  curve = dict(memo["curve"])
  for g in (2, 3, 4):
    assert curve[g] == pytest.approx((1 + sum(own[g]["accept_at_least"])) * 4.0 / loop.iteration_ms[g])
    assert curve[g] > (1 + sum(a8[:g])) * 4.0 / loop.iteration_ms[g]  # the one profile: lower
  assert memo["profiles"] == {str(g): own[g] for g in own}
  r = calibrate.resolved(point, memo=memo, loop=loop, calibration={"alpha": 0.67, "gamma": 8})
  assert r.calibration == own[memo["gamma"]]
  plain = calibrate.plan_auto(point, COSTS, MemoryStore(),
                              lambda: {"alpha": 0.67, "accept_at_least": a8}, gamma_max=4,
                              min_speedup=1.0, rule="tokenwise")
  assert plain.profiles == {} and "profiles" not in calibrate.choose(
      plain, COSTS, loop, MemoryStore(), min_speedup=1.0, rule="tokenwise")


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [0, 2])
def test_the_timed_program_is_the_run_decode(gamma):
  """The capped decode (`max_iterations`) uncapped == the run's decode (tokens, counters); a cap
  stops it there."""
  target, tp, draft, dp = tiny_pair("decoder", seed=3)
  x = np.array([[5, 6, 7, 2], [9, 3, 4, 0]], np.int32)
  sampling = SamplingConfig(temperature=1.0)
  rng = jax.random.key(11)
  if gamma == 0:
    decoder, params = Decoder(target, sampling=sampling, max_decode_len=10), Params(tp)
  else:
    decoder = Decoder(target, draft, Chain(gamma), sampling, rule="tokenwise", max_decode_len=10)
    params = Params(tp, dp)
  ref = decoder.generate(params, x, rng)
  run = lambda cap: decoder.generate(  # noqa: E731
      params, jnp.asarray(x), rng, max_iterations=jnp.int32(cap))
  full = run(11)
  np.testing.assert_array_equal(full.tokens_BxN, ref.tokens_BxN)
  assert acceptance_stats.counters_to_dict(full.counters) == acceptance_stats.counters_to_dict(ref.counters)
  assert int(run(0).counters.iterations) == 0 and int(run(0).lengths_B.max()) == 0
  assert int(run(2).counters.iterations) == 2


@pytest.mark.slow
def test_measure_loops_on_tiny_models():
  target, tp, draft, dp = tiny_pair("decoder", seed=3)
  batches = [jnp.asarray([[5, 6, 7, 2]], jnp.int32), jnp.asarray([[9, 3, 4, 8]], jnp.int32)]
  template = Decoder(target, sampling=SamplingConfig(), rule="tokenwise", max_decode_len=8)
  loops = costs.measure_loops(template, tp, {"d": (draft, dp, [1, 3])}, batches, seed=0,
                                  repeats=2)
  lc = loops["d"]
  assert sorted(lc.iteration_ms) == [1, 3] and lc.batches == 2 and lc.rows == 1
  assert lc.ar_ms > 0 and all(v > 0 for v in lc.iteration_ms.values())
  assert 1 <= lc.tokens <= 8  # autoregressive iterations per batch (max_decode_len 8)
  assert all(1.0 <= t <= g + 1 for g, t in lc.tokens_per_iteration.items())
  assert lc.to_json()["iteration_ms"].keys() == {"1", "3"}
  assert lc.iteration_ms[1] <= lc.iteration_ms[3]  # noise never makes a longer block cheaper
  # Every round kept, paired by round (the error 'auto' weighs its choice with).
  assert len(lc.ar_rounds_ms) == 2 and sorted(lc.iteration_rounds_ms) == [1, 3]
  assert all(len(r) == 2 for r in lc.iteration_rounds_ms.values())
  assert min(lc.iteration_rounds_ms[1]) <= lc.iteration_ms[1] <= max(lc.iteration_rounds_ms[1])


def test_loop_costs_within_the_noise_are_dropped_not_divided_by(monkeypatch):
  """A tiny model on a busy machine can time a full decode no slower than a zero-iteration one:
  the per-iteration cost comes out 0 and theory.loop_speedup refused it (CI crashed on the smoke
  run). Such costs are named unresolved and the run predicts from lone extend costs."""
  from specdec_jax.runner import autotune
  zero_ar = _loop({2: 3.0}, ar_ms=0.0)
  zero_spec = _loop({2: 0.0, 3: 1.0})
  assert zero_ar.unresolved() == ["autoregressive"]
  assert zero_spec.unresolved() == ["gamma 2"]
  assert _loop({2: 3.0}).unresolved() == []
  with pytest.raises(ValueError, match="positive costs"):
    zero_ar.speedup(2, 2.0)

  other = DraftSpec("model", "other/draft")
  timed = {SPEC: zero_ar, other: _loop({2: 3.0})}

  class Measure:  # the tuner sees the run only through its measure (autotune.Measure)
    sharded, prompts, held_out = False, 4, True

    def loops(self, temperature, programs):
      assert temperature == 0.0 and programs == {SPEC: [2], other: [2]}
      return timed

  got = autotune.timed_loops(Measure(), {Point(SPEC, "auto", 0.0): [2],
                                         Point(other, "auto", 0.0): [2]})
  assert set(got) == {(other, 0.0)}
  Measure.sharded = True  # on a mesh nothing is timed: lone extend costs predict
  assert autotune.timed_loops(Measure(), {Point(other, "auto", 0.0): [2]}) == {}


def test_within_noise_rule_takes_the_smallest_gamma_the_rounds_cannot_separate():
  curve = {0: 1.0, 1: 1.18, 2: 1.14, 3: 1.22}
  # gamma 3 leads gamma 1 by 0.04 with a standard error of 0.05: not resolved -> gamma 1.
  assert theory.within_noise_gamma(curve, {1: 0.05, 2: 0.02}, 1.1) == 1
  # Resolved leads (small errors) keep the best median; no spreads at all is best_gamma.
  assert theory.within_noise_gamma(curve, {1: 0.01, 2: 0.01}, 1.1) == 3
  assert theory.within_noise_gamma(curve, {}, 1.1) == theory.best_gamma(curve, 1.1) == 3
  # A gamma within the noise but under the gate is passed over; none over the gate -> 0.
  assert theory.within_noise_gamma({0: 1.0, 1: 1.05, 2: 1.12}, {1: 0.2}, 1.1) == 2
  assert theory.within_noise_gamma({0: 1.0, 1: 1.05, 2: 1.08}, {1: 0.2}, 1.1) == 0


def _rounds_loop(ar_rounds, it_rounds):
  return costs.LoopCosts(
      ar_ms=statistics.median(ar_rounds), ar_fixed_ms=0.0, tokens=40.0,
      iteration_ms={g: statistics.median(r) for g, r in it_rounds.items()},
      fixed_ms={g: 0.0 for g in it_rounds}, tokens_per_iteration={g: 1.0 for g in it_rounds},
      batches=1, rows=1, ar_rounds_ms=tuple(ar_rounds), iteration_rounds_ms=it_rounds)


def test_lead_se_pairs_rounds_so_a_shared_drift_cancels():
  # Every program slows together round by round (the machine's drift): the two gammas' lead is
  # the same in every round, so its error is 0 although each program's own spread is large.
  drift = [1.0, 1.3, 0.9, 1.6, 1.1]
  loop = _rounds_loop([4.0 * d for d in drift], {1: [6.0 * d for d in drift],
                                                 2: [7.0 * d for d in drift]})
  assert loop.lead_se(1, 1.8, 2, 2.2) == pytest.approx(0.0, abs=1e-12)
  assert loop.speedup_rounds(1, 1.8) == pytest.approx([1.8 * 4.0 / 6.0] * 5)
  # One round where gamma 2 alone ran fast: its lead now has an error.
  loop = _rounds_loop([4.0] * 5, {1: [6.0] * 5, 2: [7.0, 7.0, 5.0, 7.0, 7.0]})
  diffs = [1.8 * 4 / 6 - 2.2 * 4 / t for t in (7.0, 7.0, 5.0, 7.0, 7.0)]
  assert loop.lead_se(1, 1.8, 2, 2.2) == pytest.approx(statistics.stdev(diffs) / 5 ** 0.5)
  assert _loop({1: 6.0}).lead_se(1, 1.8, 1, 1.8) == 0.0  # no rounds kept: no error
  # A round whose cost the noise ate (0 ms) drops that round's pair only, not the pairing.
  holed = _rounds_loop([4.0] * 5, {1: [6.0, 0.0, 6.0, 6.0, 6.0], 2: [7.0, 7.0, 5.0, 7.0, 7.0]})
  assert holed.speedup_rounds(1, 1.8)[1] is None
  kept = [1.8 * 4 / 6 - 2.2 * 4 / t for t in (7.0, 5.0, 7.0, 7.0)]
  assert holed.lead_se(1, 1.8, 2, 2.2) == pytest.approx(statistics.stdev(kept) / 2)
  assert loop.to_json()["iteration_rounds_ms"]["2"] == [7.0, 7.0, 5.0, 7.0, 7.0]
  assert "ar_rounds_ms" not in _loop({1: 6.0}).to_json()


def test_choose_passes_over_a_lead_the_rounds_do_not_resolve():
  store = MemoryStore()
  plan = calibrate.plan_auto(Point(SPEC, "auto", 0.0), COSTS, store, lambda: {"alpha": 0.8},
                             gamma_max=4, min_speedup=1.0, rule="tokenwise")
  assert plan.candidates == (2, 3, 4)
  # gamma 4's median iteration makes it the best prediction, but its rounds swing by +-30 %
  # where gamma 2's and 3's hold still: its lead is not resolved, and gamma 2 is taken.
  loop = _rounds_loop([4.0] * 5, {2: [7.0] * 5, 3: [9.6] * 5,
                                  4: [8.0, 11.0, 8.5, 5.5, 11.5]})
  memo = calibrate.choose(plan, COSTS, loop, store, min_speedup=1.0, rule="tokenwise")
  curve = dict(memo["curve"])
  assert theory.best_gamma(curve, 1.0) == 4  # the best median, passed over
  assert memo["gamma"] == 2
  lead = dict(memo["lead_se"])
  assert set(lead) == {2, 3} and curve[4] - curve[2] < lead[2]
  point = calibrate.resolved(Point(SPEC, "auto", 0.0), memo=memo, loop=loop)
  assert point.gamma == 2 and dict(point.lead_se) == pytest.approx(lead)


def test_auto_reports_its_confidence_and_says_when_it_is_within_noise():
  """'auto''s memo and its resolved point carry `confidence` (issue 46): the chosen gamma's
  margin over the gate in standard errors of its round-by-round speedup, its lead over the
  best other gamma in standard errors of that lead; `within_noise` where either is under one
  standard error, and the log line says so. Fails if the z-scores are computed from the wrong
  spread, the runner-up is not the best other gamma, or a close call is not flagged."""
  store = MemoryStore()
  plan = calibrate.plan_auto(Point(SPEC, "auto", 0.0), COSTS, store, lambda: {"alpha": 0.8},
                             gamma_max=4, min_speedup=1.0, rule="tokenwise")
  # Clear: gamma 2 well above the gate and the others, every round alike but for small jitter.
  loop = _rounds_loop([4.0, 4.1, 3.9, 4.0, 4.05], {2: [5.0, 5.1, 4.9, 5.0, 5.05],
                                                   3: [9.6] * 5, 4: [12.0] * 5})
  memo = calibrate.choose(plan, COSTS, loop, store, min_speedup=1.0, rule="tokenwise")
  conf, curve = memo["confidence"], dict(memo["curve"])
  tokens = theory.expected_tokens_per_iteration(0.8, 2, "tokenwise")
  assert memo["gamma"] == conf["pick"] == 2 and conf["runner_up"] == max((3, 4), key=curve.get)
  se = loop.speedup_se(2, tokens)
  assert se > 0 and conf["gate_z"] == pytest.approx((curve[2] - 1.0) / se)
  assert conf["gate_z"] > 1 and conf["lead_z"] > 1 and not conf["within_noise"]
  point = calibrate.resolved(Point(SPEC, "auto", 0.0), memo=memo, loop=loop)
  assert dict(point.confidence) == conf
  assert "WITHIN NOISE" not in calibrate.describe_confidence(conf)
  # Near the gate: gamma 2 barely above plain decoding, its rounds swinging across the gate.
  store = MemoryStore()
  plan = calibrate.plan_auto(Point(SPEC, "auto", 0.0), COSTS, store, lambda: {"alpha": 0.8},
                             gamma_max=4, min_speedup=1.0, rule="tokenwise")
  iter2 = 4.0 * tokens / 1.02
  loop = _rounds_loop([4.0] * 5, {2: [iter2 * f for f in (0.8, 1.2, 0.9, 1.15, 0.95)],
                                  3: [20.0] * 5, 4: [24.0] * 5})
  memo = calibrate.choose(plan, COSTS, loop, store, min_speedup=1.0, rule="tokenwise")
  conf = memo["confidence"]
  assert conf["pick"] == 2 and abs(conf["gate_z"]) < 1 and conf["within_noise"]
  assert "WITHIN NOISE" in calibrate.describe_confidence(conf)


def test_the_tuner_decides_from_its_measure_alone():
  """`autotune.resolve_points` with a fake `Measure` (no model, no compile): one calibration
  decode at the calibration gamma, the candidates' loops timed at once beside the fixed gamma's,
  the choice the loop costs make (gamma 2 here, the lone-extend curve ranks 4 first), the fixed
  point kept as configured, and a second resolution recalls every choice from the store
  (a resumed run measures no decode again)."""
  from specdec_jax.runner import autotune
  from specdec_jax.runner.run_config import RunConfig

  class Measure:
    sharded, prompts, held_out = False, 4, True
    decodes, timed = [], []

    def costs(self, tokens):
      assert tokens == [1, 2, 3, 4, 5]  # v(T) up to gamma_max + 1 for 'auto'
      return {SPEC: COSTS}

    def decode(self, point, scheme, statistic):
      self.decodes.append((point.gamma, scheme))
      return {"alpha": 0.8, "accept_at_least": [0.8, 0.64, 0.51, 0.41]}

    def loops(self, temperature, programs):
      self.timed.append(programs)
      return {SPEC: _loop({1: 5.0, 2: 5.5, 3: 8.0, 4: 10.0})}

  cfg = RunConfig(gamma=["auto", 1], gamma_max=4, draft_checkpoint="some/draft",
                  auto_min_speedup=1.0)
  store, log = MemoryStore(), []
  resolved, spent = autotune.resolve_points(cfg, Measure(), store, log.append)
  assert spent == {SPEC: COSTS}
  assert Measure.decodes == [("auto", 4)]  # one decode per draft and temperature, at gamma 4
  assert Measure.timed == [{SPEC: [1, 2, 3, 4]}]  # candidates 2-4 and the fixed gamma 1
  auto, fixed = resolved
  assert (auto.auto, auto.gamma, fixed.auto, fixed.gamma) == (True, 2, False, 1)
  assert auto.calibration == {"alpha": 0.8, "accept_at_least": [0.8, 0.64, 0.51, 0.41],
                              "gamma": 4, "prompts": 4, "held_out": True}
  assert any("-> gamma 2" in line for line in log)
  Measure.decodes.clear()
  again, _ = autotune.resolve_points(cfg, Measure(), store, log.append)
  assert Measure.decodes == [] and [r.gamma for r in again] == [2, 1]


def test_a_run_predicts_each_gamma_from_its_own_calibration_decode(tmp_path, clean_gin,
                                                                 monkeypatch):
  """RunConfig.auto_each_gamma through a run: the chosen gamma's own calibration decode is the
  row's calibration (what speedup_predicted reads), and a fixed gamma of the same run gets its
  own too. (The smoke pair's random draft keeps nothing, so the lone-extend model would prune
  every gamma: both are made candidates, and the bar is 0.01.)"""
  from specdec_jax import run  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(calibrate, "candidates", lambda *a, **k: (1, 2))
  metrics = run.run(["configs/local/smoke.gin"], str(tmp_path), [
      "GAMMA = ['auto', 1]", "NUM_EXAMPLES = 2", "MAX_DECODE_LENGTH = 8", "RunConfig.repeats = 1",
      "RunConfig.gamma_max = 2", "RunConfig.auto_min_speedup = 0.01",
      "RunConfig.auto_calibration_examples = 2", "RunConfig.auto_timing_examples = 2",
      "RunConfig.auto_each_gamma = True"])
  auto, fixed = metrics
  assert auto["gamma_auto"] and auto["gamma"] in (1, 2)
  assert auto["calibration"]["gamma"] == auto["gamma"]
  assert fixed["gamma"] == 1 and fixed["calibration"]["gamma"] == 1
  assert fixed["speedup_predicted"] is not None and auto["speedup_predicted"] is not None
  with open(tmp_path / "metrics.json") as f:
    assert len(json.load(f)) == 2


def test_a_resumed_run_never_reads_another_gammas_decode_as_its_own():
  """The calibration decode is remembered under the draft and temperature (its gamma is
  gamma_max's, which a resumed run may change): a decode made at another gamma is decoded
  again, never taken as this gamma's profile."""
  from specdec_jax.runner import autotune  # pylint: disable=import-outside-toplevel
  from specdec_jax.runner.run_config import RunConfig  # pylint: disable=import-outside-toplevel
  decoded = []

  class Fake:
    prompts, held_out = 2, True

    def decode(self, point, gamma, statistic):
      decoded.append(gamma)
      return {"alpha": 0.5, "accept_at_least": [0.5] * gamma}
  store, point = MemoryStore(), Point(SPEC, "auto", 0.0)
  one, _ = autotune._acceptances(RunConfig(gamma="auto", gamma_max=8), Fake(), store)
  assert one(point)["gamma"] == 8 and decoded == [8]
  one, own = autotune._acceptances(RunConfig(gamma="auto", gamma_max=4, auto_each_gamma=True),
                                   Fake(), store)
  assert own(point, 4)["gamma"] == 4 and decoded == [8, 4]  # the stored gamma-8 decode is not 4's
  assert own(point, 3)["gamma"] == 3 and decoded == [8, 4, 3]
  assert own(point, 3)["gamma"] == 3 and decoded == [8, 4, 3]  # recalled, not decoded again


def test_fixed_costs_are_averaged_over_the_calibration_prompts_widths():
  """The per-request fixed cost is the prefill, which grows with the prompt's width; the few
  timed batches need not be typical (SmolLM2 summaries: the 4 timed documents all of width 128,
  a third of the 48 wider, the prediction 17 % high). `measure_loops` times every program at cap
  0 on one batch per other width, and the prediction averages over the calibration batches."""
  target, tp, draft, dp = tiny_pair("decoder", seed=3)
  template = Decoder(target, sampling=SamplingConfig(), rule="tokenwise", max_decode_len=6)
  batches = [jnp.asarray([[5, 6, 7, 2]], jnp.int32)]
  wide = jnp.asarray([[5, 6, 7, 2, 3, 4, 5, 6, 7, 8, 9, 3, 4, 5, 6, 7]], jnp.int32)
  lc = costs.measure_loops(template, tp, {"d": (draft, dp, [2])}, batches, seed=0, repeats=1,
                           widths=([wide], [4, 4, 16]))["d"]
  assert sorted(lc.ar_fixed_by_width) == [4, 16] and sorted(lc.fixed_by_width[2]) == [4, 16]
  assert lc.ar_fixed_by_width[4] == lc.ar_fixed_ms and lc.fixed_by_width[2][4] == lc.fixed_ms[2]
  assert lc.calibrated_fixed() == pytest.approx(
      (2 * lc.ar_fixed_ms + lc.ar_fixed_by_width[16]) / 3)
  js = lc.to_json()
  assert js["calibration_widths"] == [4, 4, 16] and js["fixed_by_width"]["2"].keys() == {"4", "16"}
  assert js["fixed_calibrated_ms"]["2"] == pytest.approx(lc.calibrated_fixed(2))
  # The prediction reads them: the loop object's and the record's (`theory.predict`) agree.
  spread = dataclasses.replace(lc, ar_fixed_by_width={4: 10.0, 16: 100.0},
                               fixed_by_width={2: {4: 12.0, 16: 130.0}}, ar_ms=5.0,
                               iteration_ms={2: 8.0}, tokens=20.0)
  assert spread.calibrated_fixed() == pytest.approx(40.0)
  assert spread.calibrated_fixed(2) == pytest.approx(154.0 / 3)
  expected = (40.0 + 20 * 5.0) / (154.0 / 3 + 20 / 2.5 * 8.0)
  assert spread.speedup(2, 2.5) == pytest.approx(expected)
  pred = theory.predict(2, 0.9, COSTS, temperature=0.0, accepts_per_position=[0.9, 0.6],
                        loop=spread.to_json(), tokens=(20.0, 20.0))
  assert pred.speedup == pytest.approx(expected)
  plain = dataclasses.replace(spread, calibration_widths=())
  assert plain.calibrated_fixed() == plain.ar_fixed_ms and "calibration_widths" not in plain.to_json()
