"""Speedup theory (Leviathan et al. section 3) with measured costs, and choosing gamma.

One formula, in two cost models (`loop_speedup` is the one place a speedup is computed):
- measured loop costs (what a single-device run predicts with, runner/calibrate.py): one real
  speculative iteration at gamma costs T_iter(G) and one autoregressive iteration T_ar, both timed
  as the decode programs run them (draft steps with their sampling over V, the two-token first
  draft call, verification, acceptance, commit, the loop glue), so

      speedup(G) = E[tokens per iteration | G] * T_ar / T_iter(G)

  and, with the per-request fixed costs (prefill, measured the same way) and N tokens per request,
  (F_ar + N T_ar) / (F_spec + (N / E) T_iter(G));
- lone `extend` calls (the papers' model, kept for meshes and as the record's `c` and `v`): the
  draft step costs c target steps and verifying G + 1 tokens costs v(G + 1) (1 on a memory-bound
  TPU/GPU at batch 1; an 80 MB float32 decoder measured v(4) = 3.1, v(8) = 4.2 with XLA's CPU dot):

      (1 - alpha^(G+1)) / ((1 - alpha) (G c + v(G+1)))

  It leaves out everything in an iteration but the model calls (on the default CPU run it
  predicted 1.21x where one iteration measured 7.1 ms against 5.5 ms assumed, and 1.00x was
  measured), which is why the runner times the real loops where it can.

E[tokens per iteration] = 1 + sum_{i<=G} A_i, A_i = P(at least i drafts kept)
(`expected_tokens_per_iteration`). Whether a call keeps at least i drafts depends only on the first
i drafts and the target's p there, never on G, so A_i measured by a decode at some gamma (the
fraction of its target calls that kept at least i drafts: `accepts_per_position`) serves every
gamma up to that one. That measured profile is what the runner predicts with, for both rules:
- token-wise (Leviathan): A_i = E[prod_{j<=i} min(1, p_j / q_j)]. With positions independent at
  one rate alpha this is alpha^i, and E = (1 - alpha^(G+1)) / (1 - alpha), the fallback when no
  profile was measured. Real drafts are not that: prompt lookup either copies a whole span or
  nothing, so acceptance clusters by iteration, and alpha (a rate over positions, which weights a
  fully accepted block by its length) overstates A_i. Prompt lookup on code at gamma 8 measured
  alpha 0.936 but A_1 0.67 and A_8 0.59: the formula gives 7.00 tokens per call, the profile
  5.92, and the decode wrote 5.87;
- block verification (Sun et al. 2024): A_i = E[a_i], a_i = min(1, a_{i-1} p(x_i) / q(x_i)),
  a_0 = 1 (acceptance.block_distributions). A_1 is token-wise's, but A_i >= the token-wise value
  and is not a function of alpha (it depends on how the likelihood ratios p/q spread), so block
  verification is always predicted from a measured profile.

`best_gamma` returns 0 whenever no gamma is predicted to beat `min_speedup`, which is what keeps
GAMMA='auto' from ever being slower than the autoregressive loop. Pure Python: the measurements
are `specdec_jax.timing`'s and `runner/calibrate.py`'s.
"""
from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping, Sequence
from typing import Any


def expected_tokens(alpha: float, gamma: int) -> float:
  """Expected tokens per target call: (1 - alpha^(G+1)) / (1 - alpha); G + 1 at alpha = 1."""
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must be in [0, 1], got {alpha}")
  if gamma < 0:
    raise ValueError(f"gamma must be >= 0, got {gamma}")
  if alpha >= 1.0:
    return float(gamma + 1)
  return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def alpha_for_tokens(tokens: float, gamma: int) -> float | None:
  """The alpha at which `expected_tokens(alpha, gamma)` equals `tokens` (independent positions):
  what a draft must agree to give that many tokens per call at gamma; 0 for tokens <= 1, None
  where gamma + 1 tokens do not suffice. Bisection: the curve rises with alpha."""
  if tokens != tokens:  # NaN: no measurement to invert
    raise ValueError("tokens must be a number, got NaN")
  if tokens <= 1.0:
    return 0.0
  if tokens > gamma + 1:
    return None
  lo, hi = 0.0, 1.0
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if expected_tokens(mid, gamma) < tokens else (lo, mid)
  return hi


def expected_tokens_per_iteration(alpha: float, gamma: int, rule: str = "tokenwise",
                                  accept_at_least: Sequence[float] | None = None) -> float:
  """Expected tokens one iteration writes (accepted drafts + the token after them).

  With a measured profile `accept_at_least` (A_1, A_2, ...: the fraction of a decode's target
  calls that kept at least i drafts, decoded at a gamma >= this one with this rule; see the
  module docstring) of at least gamma entries: 1 + the sum of its first gamma entries, for either
  rule. Without one, token-wise falls back to independent positions, `expected_tokens(alpha,
  gamma)`, and block verification, which has no formula in alpha, is an error. At temperature 0
  both rules keep the same drafts (one-hot p and q).
  """
  if gamma == 0:
    return 1.0
  if rule not in ("tokenwise", "block"):
    raise ValueError(f"no expected-length model for acceptance rule {rule!r}")
  if accept_at_least is not None and len(accept_at_least) >= gamma:
    return 1.0 + sum(min(max(float(x), 0.0), 1.0) for x in accept_at_least[:gamma])
  if rule == "tokenwise":
    return expected_tokens(alpha, gamma)
  have = 0 if accept_at_least is None else len(accept_at_least)
  raise ValueError(f"block verification at gamma {gamma} needs P(at least i kept) for i = "
                   f"1..{gamma} from a block-rule decode (have {have})")


def loop_speedup(tokens_per_iteration: float, ar_iteration: float, iteration: float, *,
                 tokens: float | None = None, ar_fixed: float = 0.0,
                 spec_fixed: float = 0.0, spec_tokens: float | None = None) -> float:
  """The speedup formula (the one place it is written): E * T_ar / T_iter, times in any one unit.

  With `tokens` (N, autoregressive iterations per request) the per-request fixed costs count too:
  (ar_fixed + N T_ar) / (spec_fixed + (N' / E) T_iter), N' = `spec_tokens` (default N): the
  speculative decode's own length, which differs from the autoregressive one at temperature > 0
  (two samples), while the measured speedup is a ratio of the two decodes' wall times.
  """
  if iteration <= 0 or ar_iteration <= 0 or tokens_per_iteration <= 0:
    raise ValueError(f"need positive costs and tokens, got E={tokens_per_iteration}, "
                     f"T_ar={ar_iteration}, T_iter={iteration}")
  if tokens is None:
    return tokens_per_iteration * ar_iteration / iteration
  spec_tokens = tokens if spec_tokens is None else spec_tokens
  return ((ar_fixed + tokens * ar_iteration)
          / (spec_fixed + spec_tokens / tokens_per_iteration * iteration))


def draft_call_budget(goal: float, tokens_per_iteration: float, free_iteration: float,
                      gamma: int, *, tokens: float, ar_iteration: float, ar_fixed: float,
                      spec_fixed: float) -> float | None:
  """The most one draft call may cost for `loop_speedup` to reach `goal` at this acceptance:
  (T_iter - T_free) / gamma, where T_iter solves loop_speedup(E, T_ar, T_iter, tokens=N, ...) =
  goal, i.e. ((ar_fixed + N T_ar) / goal - spec_fixed) E / N, and T_free is the same loop with
  a draft that costs nothing (`free_iteration`: glue and verify). None where even free calls do
  not reach the goal. Why: it turns a missed goal into the draft a researcher would have to
  build: as accurate as this one, at most this expensive (times in any one unit)."""
  if min(goal, tokens_per_iteration, tokens, gamma) <= 0:
    raise ValueError(f"need a positive goal, E, N and gamma, got {goal}, "
                     f"{tokens_per_iteration}, {tokens}, {gamma}")
  room = (ar_fixed + tokens * ar_iteration) / goal - spec_fixed  # the goal's time, fixed costs off
  iteration = room * tokens_per_iteration / tokens
  return (iteration - free_iteration) / gamma if iteration > free_iteration else None


def mixed_iteration(iteration: float, share_timed: float, share: float,
                    draft_calls: float) -> float:
  """A lookup-first iteration's mean cost at lookup share `share`, from its loop timed at
  `share_timed` (`iteration`, any unit): an iteration the lookup drafts skips the draft's calls
  (`draft_calls`: draft_gamma draft steps) and shares the verify and the glue with the others, so
  the mean is linear in the share: iteration + (share_timed - share) * draft_calls. Why: the
  loop is timed on a few prompts (4 HumanEval problems) whose share is not the calibration
  prompts' (48), and a lookup iteration costs about a third of a draft one (SmolLM2, q4
  self-draft)."""
  if not (0.0 <= share_timed <= 1.0 and 0.0 <= share <= 1.0):
    raise ValueError(f"lookup shares must lie in [0, 1], got {share_timed} and {share}")
  return iteration + (share_timed - share) * draft_calls


def predicted_speedup(alpha: float, gamma: int, c: float, v: float = 1.0) -> float:
  """Walltime improvement over autoregressive decoding in the lone-extend model (Leviathan et
  al.'s formula with the verify cost v): one target step is the unit; gamma = 0 is 1.0."""
  if gamma == 0:
    return 1.0
  if c < 0 or v <= 0:
    raise ValueError(f"need c >= 0 and v > 0, got c={c}, v={v}")
  return loop_speedup(expected_tokens(alpha, gamma), 1.0, gamma * c + v)


def operations_factor(alpha: float, gamma: int, c_hat: float = 0.0) -> float:
  """Arithmetic operations relative to autoregressive decoding (Leviathan Table 1, 'operations')."""
  return (1.0 - alpha) * (gamma * c_hat + gamma + 1) / (1.0 - alpha ** (gamma + 1))


def v_of(v_curve: Mapping[int, float] | Sequence[float] | float | None, tokens: int) -> float:
  """v(T) from a curve given as {T: v}, a sequence indexed T - 1, a constant, or None (= 1)."""
  if v_curve is None:
    return 1.0
  if isinstance(v_curve, (int, float)):
    return float(v_curve)
  if isinstance(v_curve, Mapping):
    if tokens not in v_curve:
      raise KeyError(f"verify cost for {tokens} tokens was not measured (have {sorted(v_curve)})")
    return float(v_curve[tokens])
  if tokens > len(v_curve):
    raise KeyError(f"verify cost for {tokens} tokens was not measured (have 1..{len(v_curve)})")
  return float(v_curve[tokens - 1])


def max_gamma_of(v_curve, limit: int) -> int:
  """The largest gamma whose verify cost v(gamma + 1) the curve holds (at most `limit`)."""
  if v_curve is None or isinstance(v_curve, (int, float)):
    return limit
  longest = max(v_curve) if isinstance(v_curve, Mapping) else len(v_curve)
  return max(0, min(limit, longest - 1))


def speedup_curve(alpha: float, c: float, v_curve, max_gamma: int) -> dict[int, float]:
  """Predicted speedup for gamma = 0..max_gamma where v(gamma + 1) is known."""
  top = max_gamma_of(v_curve, max_gamma)
  known = (lambda g: g + 1 in v_curve) if isinstance(v_curve, Mapping) else (lambda g: True)
  return {g: predicted_speedup(alpha, g, c, v_of(v_curve, g + 1))
          for g in range(top + 1) if g == 0 or known(g)}


def best_gamma(curve: Mapping[int, float], min_speedup: float = 1.0) -> int:
  """The gamma of `curve` ({gamma: predicted speedup}) with the largest prediction, or 0 if none
  beats min_speedup."""
  best = max((g for g in curve if g > 0), key=lambda g: curve[g], default=0)
  return best if best and curve[best] > min_speedup else 0


def within_noise_gamma(curve: Mapping[int, float], spread: Mapping[int, float],
                       min_speedup: float = 1.0) -> int:
  """The one-standard-error rule over `curve` ({gamma: predicted speedup}): 0 if no gamma beats
  min_speedup, else the smallest gamma that beats it and whose prediction is within spread[g]
  of the best's (spread[g]: the standard error of the best's lead over g; a gamma without one
  must match the best). Why: predictions differ by a few hundredths where the timings' noise is
  as large, and then the best median is chance; a smaller gamma drafts less, so it loses least
  when its prediction is off (GAMMA='auto' chose gamma 3 from one fast loop timing, predicted
  1.22x and measured 1.10x, where gamma 1 measured 1.18x: docs/results.md, "int8 draft panels").
  With no spreads it is `best_gamma`."""
  best = best_gamma(curve, min_speedup)
  if not best:
    return 0
  return min(g for g in curve if g > 0 and curve[g] > min_speedup
             and curve[g] >= curve[best] - float(spread.get(g, 0.0)))


def choose_gamma(alpha: float, c: float, v_curve=None, max_gamma: int = 16,
                 min_speedup: float = 1.0) -> int:
  """The gamma maximising the lone-extend prediction, or 0 if none is predicted to beat
  min_speedup."""
  return best_gamma(speedup_curve(alpha, c, v_curve, max_gamma), min_speedup)


@dataclasses.dataclass(frozen=True)
class Prediction:
  """A metrics row's predicted speedup and what it was predicted from (None: not predicted).

  Attributes:
    c, v: the lone-extend cost ratios at this gamma (v(gamma + 1); 1 at gamma 0).
    speedup: the prediction a row publishes (`speedup_predicted`).
    source: 'loop' (measured loop costs), 'lone_extend' (c and v), 'autoregressive' (gamma 0).
    lone_extend: the lone-extend formula's value, also where the loop model is the one published.
    expected_tokens: E, the expected tokens per iteration.
    iteration_ms: the measured speculative iteration at this gamma (loop model only).
  """
  c: float | None = None
  v: float | None = None
  speedup: float | None = None
  source: str | None = None
  lone_extend: float | None = None
  expected_tokens: float | None = None
  iteration_ms: float | None = None


def effective_rule(rule: str, temperature: float) -> str:
  """The rule whose expected length applies: at temperature 0 (one-hot p and q) block
  verification keeps exactly what token-wise verification keeps."""
  return "tokenwise" if float(temperature) == 0.0 else rule


def predict(gamma: int | None, alpha: float | None, costs, *, temperature: float,
            rule: str = "tokenwise", accepts_per_position: Sequence[float | None] | None = None,
            loop: Mapping[str, Any] | None = None,
            tokens: tuple[float, float] | None = None) -> Prediction:
  """The speedup a fixed-gamma decode is predicted to reach, from measured costs.

  `costs` holds the lone-extend ratios (`timing.Costs`: c, v by tokens verified); `loop` the
  measured loop costs of this draft and temperature (`runner.costs.LoopCosts.to_json()`: gamma keys
  as strings) and `tokens` (N, N') of `loop_speedup` for this run. Where the loop costs hold this
  gamma the prediction is `loop_speedup(E, T_ar, T_iter(gamma))` with the per-request fixed
  costs; else the lone-extend formula from c and v. E comes from the row's own acceptance profile
  `accepts_per_position` (`expected_tokens_per_iteration`; at temperature 0 both rules keep the
  same drafts, so token-wise). Nothing is predicted without costs, a gamma or (gamma > 0) alpha.
  """
  if costs is None or gamma is None:
    return Prediction()
  if gamma == 0:
    return Prediction(c=costs.c, v=1.0, speedup=1.0, source="autoregressive")
  v = costs.v.get(gamma + 1)
  if alpha is None:
    return Prediction(c=costs.c, v=v)
  expected = expected_tokens_per_iteration(
      min(max(alpha, 0.0), 1.0), gamma, effective_rule(rule, temperature),
      [x or 0.0 for x in accepts_per_position or []])
  lone = loop_speedup(expected, 1.0, gamma * costs.c + v) if v is not None else None
  it_ms = (loop or {}).get("iteration_ms", {}).get(str(gamma))
  if it_ms is not None:
    n_ar, n_spec = tokens
    # the fixed costs at the calibration prompts' widths where measured (`LoopCosts.to_json`)
    ar_fixed = loop.get("ar_fixed_calibrated_ms", loop["ar_fixed_ms"])
    spec_fixed = loop.get("fixed_calibrated_ms", loop["fixed_ms"])[str(gamma)]
    speedup = loop_speedup(expected, loop["ar_ms"], it_ms, tokens=n_ar, ar_fixed=ar_fixed,
                           spec_fixed=spec_fixed, spec_tokens=n_spec)
    return Prediction(costs.c, v, speedup, "loop", lone, expected, it_ms)
  return Prediction(costs.c, v, lone, None if lone is None else "lone_extend", lone, expected)


# ---- trees -----------------------------------------------------------------------------------------
# A tree call's expected length, in the positional acceptance model (Sequoia, Chen et al. 2024):
# once a node was kept, its rank-r child is accepted with probability a[d][r] after its elder
# siblings were rejected (d: the child's depth - 1), whatever the path above. So the rank-r child
# is the kept one with s(d, r) = a[d][r] prod_{r' < r} (1 - a[d][r']), a node is kept with the
# product of s along its path, and E = 1 + the sum of that over the drafted nodes (the 1: the
# token after the path). A chain is the tree of rank-0 nodes: a[d][0] = P(depth d+1 kept | depth
# d kept), and with one rate alpha, E = (1 - alpha^(G+1)) / (1 - alpha) again. What the model
# leaves out: acceptance depends on the path (a confident parent has confident children), so
# measured rates by depth and rank (`rank_acceptance`) are averages over the paths a decode took.
def _rate(accept, depth: int, rank: int) -> float:
  """a[depth][rank]; a flat sequence serves every depth; past a row or the rows, the last one."""
  rows = accept if accept and isinstance(accept[0], (list, tuple)) else [accept]
  row = rows[min(depth, len(rows) - 1)]
  a = float(row[min(rank, len(row) - 1)])
  if not 0.0 <= a <= 1.0:
    raise ValueError(f"acceptance rates must be in [0, 1], got {a} at depth {depth + 1}, rank "
                     f"{rank}")
  return a


def tree_keep_probabilities(parents: Sequence[int], accept) -> list[float]:
  """P(node kept) per node of the tree given by `parents` (parents[0] == -1, each parent before
  its children, siblings in rank order), the root 1, in the positional model above; accept:
  a[d][r] (rows by depth) or one row a[r] for every depth."""
  keep, depth, seen, left = [1.0], [0], {}, {}
  for i in range(1, len(parents)):
    p = parents[i]
    rank = seen.get(p, 0)
    seen[p] = rank + 1
    depth.append(depth[p] + 1)
    a = _rate(accept, depth[p], rank)
    before = left.get(p, 1.0)  # P(every elder sibling rejected)
    left[p] = before * (1.0 - a)
    keep.append(keep[p] * before * a)
  return keep


def tree_expected_tokens(parents: Sequence[int], accept) -> float:
  """Expected tokens one call over this tree writes: the kept drafts and the token after them
  (see `tree_keep_probabilities`)."""
  return sum(tree_keep_probabilities(parents, accept))


def rank_acceptance(kept_rank_DxK: Sequence[Sequence[float]], reached_D: Sequence[float],
                    branching: Sequence[int] | None = None) -> list[list[float]] | None:
  """a[d][r] measured by a tree decode (`decoding.tree.TreeStats`: calls that kept rank r at
  depth d + 1, calls that reached depth d + 1): kept / tried, tried = reached - the calls that
  kept an elder sibling. Right for a tree whose nodes at one depth all have as many children,
  `branching[d]` (a branching per depth; None: every rank of the counters): every rejected rank
  is followed by the next. A rank never tried (past the branching, or never reached) takes the
  rank before it, a depth never reached the depth above; None if depth 1 was never reached."""
  rows: list[list[float]] = []
  for d, (kept_K, reached) in enumerate(zip(kept_rank_DxK, reached_D)):
    width = len(kept_K) if branching is None else int(branching[d])
    row, tried = [], float(reached)
    for r, kept in enumerate(kept_K):
      if tried > 0 and r < width:
        row.append(min(max(float(kept) / tried, 0.0), 1.0))
      elif float(reached) <= 0 and rows:  # depth never reached: the depth above's rate
        row.append(rows[-1][min(r, len(rows[-1]) - 1)])
      elif row:  # rank past the branching (or every call kept an elder): the rank before
        row.append(row[-1])
      else:
        return None
      tried -= float(kept)
    rows.append(row)
  return rows or None


def sibling_keep_rates(accept_by_rank: Sequence[float], ranks: int) -> list[float]:
  """s(r) = a_r prod_{r' < r} (1 - a_r'): the chance that the rank-r child is the one kept, given
  its parent was kept, when rank r is accepted with probability a_r after its elder siblings were
  rejected (ranks past `accept_by_rank` take its last entry)."""
  if not accept_by_rank or not all(0.0 <= float(a) <= 1.0 for a in accept_by_rank):
    raise ValueError(f"accept_by_rank needs probabilities in [0, 1], got {accept_by_rank!r}")
  out, left = [], 1.0
  for r in range(ranks):
    a = float(accept_by_rank[min(r, len(accept_by_rank) - 1)])
    out.append(left * a)
    left *= 1.0 - a
  return out


def positional_parents(num_nodes: int, accept_by_rank: Sequence[float], max_depth: int = 0
                       ) -> tuple[int, ...]:
  """The parents of the level-ordered tree of `num_nodes` nodes (root included, depth <=
  max_depth; 0: no cap) that keeps the most drafted tokens per call in expectation under the
  positional acceptance model (Sequoia's, without its hardware term: the node budget is chosen
  against v(nodes) elsewhere): a node of sibling rank r is kept with probability s(r) (`sibling_keep_rates`) once
  its parent was kept, at every depth. A node's chance to be kept is the product of s along its
  path; where s falls with the rank it falls from parent to child and from elder to younger
  sibling, so the best N - 1 nodes are closed under both and form a tree: taken best first (a
  sibling enters only after its elder, so the result is a tree whatever the rates)."""
  if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 2:
    raise ValueError(f"num_nodes must be an integer >= 2, got {num_nodes!r}")
  s = sibling_keep_rates(accept_by_rank, num_nodes)
  # (-score, order, parent, rank, depth); order breaks ties towards the earlier-made node.
  heap, taken, order = [(-s[0], 0, -1, 0, 1)], [], 1
  while heap and len(taken) < num_nodes - 1:
    neg, _, parent, rank, depth = heapq.heappop(heap)
    taken.append((parent, rank, depth))
    me, score = len(taken) - 1, -neg
    if rank + 1 < len(s):  # the next sibling
      sib = score / s[rank] * s[rank + 1] if s[rank] > 0 else 0.0
      heapq.heappush(heap, (-sib, order, parent, rank + 1, depth))
      order += 1
    if not max_depth or depth < max_depth:  # the first child
      heapq.heappush(heap, (-score * s[0], order, me, 0, depth + 1))
      order += 1
  return _level_ordered(taken)


def tree_tokens_bound(num_nodes: int, accept, max_depth: int = 0,
                      measured: Sequence[int] | None = None) -> float:
  """An upper bound on the expected tokens per call of ANY tree of `num_nodes` nodes (root
  included) of depth <= max_depth (0: no cap) under a[d][r] (`accept`, rows by depth as
  `tree_keep_probabilities` reads them): what no tree shape, static or chosen per iteration from
  the same rates, can beat.

  Why a bound and not `positional_parents`: that search is exact for one row of rates shared by
  every depth; measured rows differ by depth. A node of rank r at depth d is kept with
  prob(parent kept) * s_d(r) (`sibling_keep_rates` of row d), so with s*(r) = max over the depths
  and r' >= r of s_d(r') (not increasing in r), every node's keep probability is at most the
  product of s* along its path, and the best set of num_nodes - 1 such products closed under
  parents and elder siblings (taken best first) bounds every tree's sum.

  measured: the probe tree's children per depth (`rank_acceptance` fills the ranks past them
  with the rank before, an assumption, not a measurement): then only measured (depth, rank) rates
  enter s*, and a node has at most max(measured) children (the trees the data speaks for)."""
  if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 1:
    raise ValueError(f"num_nodes must be an integer >= 1, got {num_nodes!r}")
  rows = accept if accept and isinstance(accept[0], (list, tuple)) else [accept]
  ranks = max(num_nodes - 1, 1)
  keep = [sibling_keep_rates(list(row), ranks) for row in rows]
  if measured is not None:
    ranks = min(ranks, max(int(b) for b in measured))
    keep = [k[:int(b)] for k, b in zip(keep, measured)]
  best = [max((k[r] for k in keep if r < len(k)), default=0.0) for r in range(ranks)]
  s = [max(best[r:]) for r in range(ranks)]
  heap, total, taken = [(-s[0], 0, 1)], 1.0, 0  # (-score, rank, depth)
  while heap and taken < num_nodes - 1:
    neg, rank, depth = heapq.heappop(heap)
    score = -neg
    total, taken = total + score, taken + 1
    if rank + 1 < ranks and s[rank] > 0:  # the next sibling
      heapq.heappush(heap, (-score / s[rank] * s[rank + 1], rank + 1, depth))
    if not max_depth or depth < max_depth:  # the first child
      heapq.heappush(heap, (-score * s[0], 0, depth + 1))
  return total


def _level_ordered(taken: Sequence[tuple[int, int, int]]) -> tuple[int, ...]:
  """The parents of (parent's place in `taken` (-1: the root), rank, depth) nodes, laid out depth by
  depth, children in their parent's order and then by rank (what `decoding.tree.TreeScheme` needs)."""
  new_of, parents = {-1: 0}, [-1]
  for depth in range(1, max(d for _, _, d in taken) + 1):
    level = sorted((new_of[p], r, i) for i, (p, r, d) in enumerate(taken) if d == depth)
    for parent, _, i in level:
      new_of[i] = len(parents)
      parents.append(parent)
  return tuple(parents)
