"""GAMMA='auto' resolution: the calibration decode's acceptance, the candidates to time, the
choice, and the concrete points a run decodes.

The costs it chooses from (lone `extend` calls and the real loops' iterations) are measured by
runner/costs.py, in the process that decodes, right before the timed decode; the chosen gamma is
remembered in run_state.json so a resumed run keeps decoding with the same gamma. A run predicts
with theory.loop_speedup from the loops' costs (lone `extend` costs alone predicted 1.21x from
5.5 ms per iteration on the default CPU run where 7.1 ms and 1.00x were measured).
Which gammas get a loop compiled (each is one more compile of a whole decode program, seconds on
2 cores): every fixed gamma of the run (its record's prediction needs it) and, for 'auto', at most
`MAX_CANDIDATES` gammas: those the lone-extend model ranks best, without the ones it predicts
below `PRUNE_BELOW` x max(min_speedup, 1). The lone-extend model leaves out per-iteration glue
that grows with gamma, so it is optimistic by a smooth, gamma-dependent amount (1.21 / 1.00
above): its ranking picks the neighbourhood of the optimum, and a gamma it already predicts well
below the bar cannot clear it. It predicts the loop part only; the per-request fixed costs (the
same prefill on both sides, plus the draft's on the speculative one) only pull a speedup towards
1, so they cannot lift a gamma below 1 over the bar either. The margin (0.8) absorbs the lone
timings' own noise (they are taken minutes before the loops on a shared machine). When every
gamma is pruned, 'auto' chooses 0 without compiling a loop.

The acceptance side: a short untimed calibration decode (`calibration_acceptance`) on the first
prompts, at gamma_max, gives alpha and the profile A_i = P(at least i drafts kept), i =
1..gamma_max. Expected tokens per iteration are 1 + sum A_i for either rule (metrics/theory.py):
unlike alpha^i it holds when acceptances cluster (prompt lookup copies a span or nothing). One
decode at gamma_max serves every candidate unless A_i depends on where calls start, so on gamma
(clustered acceptances; DESIGN.md "The cost model"): `with_own_profiles`.

The choice among the timed chains: the smallest gamma whose prediction is within one standard
error of the best prediction's lead over it (`theory.within_noise_gamma`; the error from the
loops' rounds, paired by round: `LoopCosts.lead_se`), not the best median itself. The
candidates' predictions differ by hundredths where one loop's timing moves by as much between
rounds, and a smaller gamma drafts less when it is wrong: with int8 panels the best median was
gamma 3 from one fast timing, predicted 1.22x and measured 1.10x, where gamma 1 measured 1.18x.
The error covers the loops' timing only (not the calibration prompts' acceptance). The gate
(min_speedup) is unchanged; a tree replaces the chain where its prediction beats every chain's
(the best median) and the gate, as before: the rule is not applied to trees.

Trees (`RunConfig.tree_candidates`, gin/decoding/auto_tree.gin): every candidate tree's loop is
timed beside the chains' (no lone-extend pruning: a few static shapes), its expected length comes
from a calibration tree decode's acceptance by depth and sibling rank (a static tree) or from a
calibration decode with it (a dynamic tree, gin/decoding/auto_dynamic_tree.gin), and the best
program wins, chain or tree (runner/tree_choice.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from specdec_jax import distributed, timing
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.metrics import acceptance_stats, theory
from specdec_jax.runner import keys, lookup_mix, tree_choice
from specdec_jax.runner.run_config import ADAPTIVE, AUTO, TREE, DraftSpec, Point
from specdec_jax.runner.confidence import confidence, describe_confidence  # noqa: F401
from specdec_jax.runner.costs import LoopCosts

# 'auto' compiles and times the real loop for at most this many candidate gammas ...
MAX_CANDIDATES = 3
# ... and none the lone-extend model predicts below this fraction of min_speedup.
PRUNE_BELOW = 0.8


@dataclasses.dataclass(frozen=True)
class ResolvedPoint:
  """A speculative point with a concrete gamma (0 = autoregressive) and how it was chosen.

  adaptive: the AdaptiveConfig of a GAMMA='adaptive' point (gamma is then its gamma_max).
  tree: the TreeScheme of a GAMMA='tree' point (gamma is then the tree's depth: the most drafts
    one call can keep).
  predicted_curve: 'auto''s {gamma: predicted speedup} over the gammas whose loop was timed (the
    lone-extend curve where none was, on a mesh). tree_curve: its ((tree label, predicted
    speedup), ...) over the timed tree candidates; `tree` is then the chosen tree, if any.
    lone_curve: the lone-extend prediction for every gamma up to gamma_max (what pruned the
    candidates). lead_se: ((gamma, the standard error of the best-predicted gamma's lead over
    it), ...) from the loops' rounds; 'auto' took the smallest gamma within it
    (`theory.within_noise_gamma`). confidence: 'auto''s `confidence` as sorted (key, value)
    pairs (how far the choice cleared the gate and the runner-up, in standard errors).
  loop: the measured loop costs of this point's draft and temperature (None on a mesh, for an
    adaptive point, or for gamma 0).
  calibration: the calibration decode's acceptance for this draft and temperature ({'alpha',
    'accept_at_least', 'gamma', 'prompts', 'held_out'}), what the out-of-sample prediction uses;
    None for an adaptive point.
  """

  draft: DraftSpec
  gamma: int
  temperature: float
  auto: bool = False
  calibration_alpha: float | None = None
  predicted_curve: tuple[tuple[int, float], ...] = ()
  adaptive: Any = None
  tree: Any = None
  lone_curve: tuple[tuple[int, float], ...] = ()
  loop: LoopCosts | None = None
  calibration: Mapping[str, Any] | None = None
  tree_curve: tuple[tuple[str, float], ...] = ()
  lead_se: tuple[tuple[int, float], ...] = ()
  confidence: tuple[tuple[str, Any], ...] = ()

  @property
  def key(self) -> str:
    label = (AUTO if self.auto else ADAPTIVE if self.adaptive is not None
             else TREE if self.tree is not None else self.gamma)
    return keys.point(self.draft.name, label, self.temperature)


# ---- acceptance on the calibration prompts -------------------------------------------------------
def calibration_gamma(gamma: int, gamma_max: int, fixed: Sequence[int] = ()) -> int:
  """The calibration decode's gamma: at least gamma_max and every fixed gamma of the run, so that
  its profile A_i covers every candidate and every point (`gamma` is
  RunConfig.auto_calibration_gamma). A_i depends only on the first i drafts, so one decode at
  the largest gamma serves every point of a draft and temperature."""
  return max([gamma, gamma_max, *fixed])


def calibration_acceptance(decoder: Decoder, params: Params, inputs_BxP, *, rows,
                           seed: int) -> dict[str, Any]:
  """{'alpha', 'accept_at_least'} of a short speculative decode (`decoder`, at the calibration
  gamma) of `inputs_BxP` over its first `rows` rows (the rest pads the batch to a data-parallel
  mesh and is not a prompt): alpha = sum beta / positions; accept_at_least[i - 1] = fraction of
  target calls that kept at least i drafts (A_i of metrics/theory.py), i = 1..gamma.

  `inputs_BxP` may be a sequence of batches with `rows` the sequence of their real rows: a
  drafter that chooses once per batch (`chooses_per_batch`: lookup-first) decoded in the run's
  batch shape (`runner.measure.Calibration.decode`), the totals merged. Where the drafter counts
  its lookup iterations, 'lookup_share' (of the target calls) and 'tokens_per_target_call' come
  too: what a lookup-first row is predicted from (`collect.lookup_prediction`)."""
  many = isinstance(inputs_BxP, (list, tuple))
  batches, counts = (inputs_BxP, rows) if many else ([inputs_BxP], [rows])
  totals, lookups = [], []
  for x, n in zip(batches, counts):
    res = decoder.generate(params, x, jax.random.key(seed + 7919))
    stats = None if res.draft_stats is None else distributed.gather(res.draft_stats)
    totals.append(acceptance_stats.counters_to_dict(distributed.gather(res.counters), n,
                                                    draft_stats=stats))
    lookups.append(totals[-1].get("lookup_iterations"))
  merged = acceptance_stats.merge(totals)
  stats = acceptance_stats.summarize(merged)
  out = {"alpha": stats["alpha"] or 0.0,
         "accept_at_least": [a or 0.0 for a in stats["accepts_per_position"]]}
  if all(x is not None for x in lookups) and merged["target_calls"]:
    out["lookup_share"] = sum(lookups) / merged["target_calls"]
    out["tokens_per_target_call"] = stats["tokens_per_target_call"]
  return out


# ---- resolving points ----------------------------------------------------------------------------
@dataclasses.dataclass
class AutoPlan:
  """An 'auto' point between its calibration decode and its loop timing.

  memo: the stored choice ({'gamma', 'alpha', 'curve', ...}) once made (or recalled on resume).
  candidates: gammas whose loop must be timed before choosing (empty once chosen).
  trees: the run's tree candidates (TreeSchemes, DynamicTreeSchemes), timed beside them;
  tree_accept: a[d][r] of the calibration probe tree decode (`tree_choice.tree_acceptance`; None
  without a static candidate); dynamic_tokens: {label: tokens per call} of each dynamic
  candidate's calibration decode (`tree_choice.dynamic_acceptance`).
  profiles: {gamma: its own calibration decode's acceptance} of each candidate
  (`RunConfig.auto_each_gamma`; empty: every gamma is read off the one decode's profile).
  """

  point: Point
  memo: dict | None
  candidates: tuple[int, ...] = ()
  alpha: float | None = None
  accept_at_least: tuple[float, ...] | None = None
  lone_curve: dict[int, float] = dataclasses.field(default_factory=dict)
  trees: tuple = ()
  tree_accept: Any = None
  dynamic_tokens: Mapping[str, float] = dataclasses.field(default_factory=dict)
  profiles: Mapping[int, Mapping[str, Any]] = dataclasses.field(default_factory=dict)


def lone_curve(alpha: float, costs: timing.Costs, gamma_max: int, rule: str = "tokenwise",
               accept_at_least: Sequence[float] | None = None) -> dict[int, float]:
  """The lone-extend prediction for gamma = 0..gamma_max where v(gamma + 1) was measured, with
  the expected length of the measured profile (alpha's formula without one)."""
  curve = theory.speedup_curve(alpha, costs.c, costs.v, gamma_max)
  if rule == "tokenwise" and accept_at_least is None:
    return curve
  return {g: 1.0 if g == 0 else theory.loop_speedup(
      theory.expected_tokens_per_iteration(alpha, g, rule, accept_at_least), 1.0,
      g * costs.c + costs.v[g + 1]) for g in curve}


def candidates(curve: Mapping[int, float], min_speedup: float,
               max_candidates: int = MAX_CANDIDATES, prune_below: float = PRUNE_BELOW
               ) -> tuple[int, ...]:
  """The gammas >= 1 whose real loop 'auto' times: the best `max_candidates` of the lone-extend
  curve, none predicted below prune_below x max(min_speedup, 1) (see the module docstring)."""
  floor = prune_below * max(min_speedup, 1.0)
  kept = sorted((g for g in curve if g > 0 and curve[g] >= floor), key=lambda g: -curve[g])
  return tuple(sorted(kept[:max_candidates]))


def plan_auto(point: Point, costs: timing.Costs, store, acceptance_fn, *, gamma_max: int,
              min_speedup: float, rule: str, trees: tuple = (),
              tree_acceptance_fn=None) -> AutoPlan:
  """The candidates an 'auto' point needs timed (acceptance_fn() -> calibration_acceptance's
  dict, called once; with `trees`, tree_acceptance_fn() -> tree_choice.calibration_decodes's:
  'rank_acceptance' and 'dynamic_tokens'), or its remembered choice."""
  memo = store.recall("gammas", keys.auto_choice(point.draft.name, point.temperature))
  trees = tuple(trees) if tree_acceptance_fn is not None else ()
  if memo is not None:
    return AutoPlan(point, memo, trees=trees)
  acc = acceptance_fn()
  alpha = float(acc["alpha"])
  rule = theory.effective_rule(rule, point.temperature)
  a_i = tuple(acc["accept_at_least"]) if acc.get("accept_at_least") else None
  lookup = a_i and acc.get("lookup_share") is not None  # lookup-first: its own model, more timed
  curve = (lookup_mix.lone_curve(a_i, float(acc["lookup_share"]), costs, gamma_max) if lookup
           else lone_curve(alpha, costs, gamma_max, rule, a_i))
  chosen = candidates(curve, min_speedup,
                      lookup_mix.MAX_CANDIDATES if lookup else MAX_CANDIDATES)
  tree_acc = tree_acceptance_fn() if trees else {}
  return AutoPlan(point, None, chosen, alpha, a_i, curve, trees,
                  tree_acc.get("rank_acceptance"), dict(tree_acc.get("dynamic_tokens", {})))


def with_own_profiles(plan: AutoPlan, gamma_acceptance_fn) -> AutoPlan:
  """`plan` with each candidate's own calibration decode (gamma_acceptance_fn(gamma) ->
  calibration_acceptance's dict; `RunConfig.auto_each_gamma`); a remembered choice as it is."""
  if plan.memo is not None:
    return plan
  return dataclasses.replace(plan, profiles={g: gamma_acceptance_fn(g) for g in plan.candidates})


def expected_tokens(plan: AutoPlan, gamma: int, rule: str) -> float:
  """A candidate's expected tokens per iteration: from its own calibration decode's profile
  where it had one (`plan.profiles`), else from the one decode's."""
  own = plan.profiles.get(gamma)
  if own is not None:  # a lookup-first decode keeps up to lookup_gamma (its profile's length)
    a_i = own.get("accept_at_least")
    n = len(a_i) if a_i and own.get("lookup_share") is not None else gamma
    return theory.expected_tokens_per_iteration(float(own["alpha"]), n, rule, a_i)
  return theory.expected_tokens_per_iteration(plan.alpha, gamma, rule, plan.accept_at_least)


def choose(plan: AutoPlan, costs: timing.Costs, loop: LoopCosts | None, store, *,
           min_speedup: float, rule: str) -> dict:
  """Makes (and remembers) the choice of a planned 'auto' point: among its timed candidates
  (theory.loop_speedup), the smallest gamma within one standard error of the best prediction's
  lead over it (`theory.within_noise_gamma`), 0 if none beats min_speedup; without loop costs (a
  mesh) the lone-extend curve's best decides."""
  if plan.memo is not None:
    return plan.memo
  rule = theory.effective_rule(rule, plan.point.temperature)
  spread: dict = {}
  if loop is not None and plan.candidates:
    # a lookup-first chain's loop at its own calibration decode's lookup share (runner/lookup_mix)
    loop, shares = lookup_mix.at_calibration(loop, plan.profiles, costs.draft_ms)
    curve, tokens = {0: 1.0}, {}
    for g in plan.candidates:
      tokens[g] = expected_tokens(plan, g, rule)
      curve[g] = loop.speedup(g, tokens[g])
    source = "loop, lookup share" if shares else "loop"
    lead = theory.best_gamma(curve, float("-inf"))
    spread = {g: loop.lead_se(lead, tokens[lead], g, tokens[g]) for g in tokens if g != lead}
  elif loop is None and plan.candidates:
    curve, source = dict(plan.lone_curve), "lone_extend"
  else:  # every gamma pruned: nothing compiled, nothing predicted to help
    curve, source = {0: 1.0}, "pruned"
  memo = {"gamma": theory.within_noise_gamma(curve, spread, min_speedup), "alpha": plan.alpha,
          "c": costs.c, "lead_se": [[g, s] for g, s in sorted(spread.items())],
          "curve": [[g, s] for g, s in sorted(curve.items())], "curve_from": source,
          "lone_curve": [[g, s] for g, s in sorted(plan.lone_curve.items())],
          "candidates": list(plan.candidates)}
  if source.startswith("loop"):
    memo["confidence"] = confidence(loop, curve, tokens, memo["gamma"], min_speedup)
  if source == "loop, lookup share":
    memo["lookup_share"] = {str(g): s for g, s in sorted(shares.items())}
  if plan.accept_at_least is not None:
    memo["accept_at_least"] = list(plan.accept_at_least)
  if plan.profiles:  # each candidate's own decode (what the chosen point's prediction uses)
    memo["profiles"] = {str(g): dict(a) for g, a in sorted(plan.profiles.items())}
  if plan.trees:  # a tree beating every chain and the bar replaces the chain's gamma
    memo.update(tree_choice.choose_tree(plan.trees, plan.tree_accept, loop, curve, min_speedup,
                                        plan.dynamic_tokens))
  store.remember("gammas", keys.auto_choice(plan.point.draft.name, plan.point.temperature), memo)
  return memo


def loop_gammas(point: Point, plan: AutoPlan | None) -> tuple:
  """The programs whose loop this point needs timed: its fixed gamma, or an 'auto' point's
  candidate gammas and trees (or its remembered choice); none for 'adaptive' or gamma 0."""
  if point.gamma in (ADAPTIVE, TREE):
    return ()
  if plan is None:
    return (int(point.gamma),) if int(point.gamma) > 0 else ()
  if plan.memo is not None:
    tree = tree_choice.chosen(plan.memo, plan.trees)
    if tree is not None:
      return (tree,)
    return (int(plan.memo["gamma"]),) if int(plan.memo["gamma"]) > 0 else ()
  return plan.candidates + plan.trees


def resolved(point: Point, *, adaptive=None, tree=None, memo: dict | None = None,
             loop: LoopCosts | None = None, calibration: Mapping[str, Any] | None = None,
             trees: tuple = ()) -> ResolvedPoint:
  """The ResolvedPoint of a fixed, adaptive, tree or (with its memo) 'auto' point; an 'auto'
  memo that chose a tree, static or dynamic, resolves to one of `trees` (`tree`: the run's
  TreeScheme, whose verifier a recalled tree takes). `calibration`: the acceptance the point's
  prediction uses (an 'auto' memo's own decode of the chosen gamma replaces it)."""
  if point.gamma == ADAPTIVE:
    return ResolvedPoint(point.draft, adaptive.gamma_max, point.temperature, adaptive=adaptive)
  if point.gamma == TREE:
    return ResolvedPoint(point.draft, tree.tree.max_depth, point.temperature, tree=tree)
  if point.gamma != AUTO:
    return ResolvedPoint(point.draft, int(point.gamma), point.temperature,
                         loop=loop if int(point.gamma) > 0 else None, calibration=calibration)
  gamma = int(memo["gamma"])
  # the chosen chain's own calibration decode, where it had one (`auto_each_gamma`; a tree's
  # gamma is its depth, not a chain: it keeps the one decode)
  if tree_choice.chosen(memo, trees, tree) is None:
    calibration = memo.get("profiles", {}).get(str(gamma), calibration)
  return ResolvedPoint(point.draft, gamma, point.temperature, auto=True,
                       calibration_alpha=memo["alpha"],
                       predicted_curve=tuple((int(g), float(s)) for g, s in memo["curve"]),
                       lone_curve=tuple((int(g), float(s)) for g, s in memo.get("lone_curve", [])),
                       loop=loop if gamma > 0 else None, calibration=calibration,
                       tree=tree_choice.chosen(memo, trees, tree),
                       tree_curve=tuple((str(k), float(v)) for k, v in memo.get("tree_curve", [])),
                       lead_se=tuple((int(g), float(x)) for g, x in memo.get("lead_se", [])),
                       confidence=tuple(sorted(memo.get("confidence", {}).items())))


