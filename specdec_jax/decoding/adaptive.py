"""Adaptive draft length inside the one on-device loop, with static shapes.

Why: the best gamma changes along a sequence (easy spans accept long blocks, hard ones nothing).
Hugging Face's assisted generation adapts it with a heuristic schedule (+2 after a fully accepted
block, -1 otherwise) and stops drafting when the draft's confidence falls under a threshold; here
both run on device, per example, in the same `lax.while_loop` as the fixed-gamma loop.

How, with static shapes:
- Buffers are sized for `gamma_max`. Example b proposes g_b <= gamma_max tokens: min(its
  schedule, 1 + the first position whose draft top probability is below the threshold).
- The draft runs in an inner `while_loop` that exits once every active example has stopped, and
  the target verifies at the smallest compiled width (`buckets`, a `lax.switch`) >= max_b g_b, so
  short blocks cost fewer draft calls and a narrower verify.
- Positions >= g_b were not proposed: the rule sees q = 0 there, a forced rejection point (a stop
  symbol the target gives probability 0: certain rejection, residual norm(max(0, p - 0)) = p).
  `acceptance.block` handles a zero q row natively; `acceptance.tokenwise` would accept a q = 0
  position, so any rule's result is truncated: n = min(n, g_b), and when n reaches g_b the next
  token is a fresh sample of p at position g_b. For token-wise verification that is exactly
  verification of the first g_b tokens (its decisions at positions < g_b do not look further);
  for block verification it only redraws from the law it already had.
- g_b depends only on the draft's own tokens and distributions (and past iterations), never on
  the target's at this iteration, so the output still follows the target exactly.
"""
from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.decoding import acceptance as acc
from specdec_jax.decoding import state as st
from specdec_jax.decoding.sampling import SamplingConfig, process_logits, sample
from specdec_jax.decoding.drafter import Proposal
from specdec_jax.decoding.speculative import commit

SCHEDULES = ("constant", "heuristic")


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
  """How gamma adapts. Hashable (a static jit argument).

  gamma_max: buffer size and upper clip of the schedule. gamma_init: the schedule's start
  (default gamma_max). schedule: 'heuristic' (+2 when all scheduled tokens were accepted, -1
  otherwise, clipped to [1, gamma_max]) or 'constant'. confidence_threshold: stop drafting after a
  token whose draft top probability is below it (0 disables; HF's default is 0.4).
  verify_buckets: the verify widths compiled (default powers of two up to gamma_max, and
  gamma_max); `(gamma_max,)` always verifies the full block.
  """

  gamma_max: int = 8
  gamma_init: int | None = None
  schedule: str = "heuristic"
  confidence_threshold: float = 0.0
  verify_buckets: tuple[int, ...] | None = None

  def __post_init__(self):
    if not isinstance(self.gamma_max, int) or self.gamma_max < 1:
      raise ValueError(f"gamma_max must be an integer >= 1, got {self.gamma_max!r}")
    if self.gamma_init is not None and not 1 <= self.gamma_init <= self.gamma_max:
      raise ValueError(f"gamma_init must be in [1, gamma_max={self.gamma_max}], "
                       f"got {self.gamma_init}")
    if self.schedule not in SCHEDULES:
      raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
    if not 0.0 <= self.confidence_threshold <= 1.0:
      raise ValueError(f"confidence_threshold must be in [0, 1], got {self.confidence_threshold}")
    if self.verify_buckets is not None and (
        not self.verify_buckets or max(self.verify_buckets) != self.gamma_max
        or min(self.verify_buckets) < 1):
      raise ValueError(f"verify_buckets must be >= 1 and include gamma_max={self.gamma_max}, "
                       f"got {self.verify_buckets}")

  @property
  def buckets(self) -> tuple[int, ...]:
    if self.verify_buckets is not None:
      return tuple(sorted(set(self.verify_buckets)))
    pows = [2 ** i for i in range(self.gamma_max.bit_length()) if 2 ** i < self.gamma_max]
    return tuple(pows) + (self.gamma_max,)

  # ---- the Decoder scheme (see speculative.Chain) ----
  needs_draft = True

  @property
  def gamma(self) -> int:
    """Buffers, slack and counters are sized for gamma_max."""
    return self.gamma_max

  @property
  def written(self) -> int:
    """Tokens one iteration writes at most (a feature drafter's pending entries)."""
    return self.gamma_max + 1

  def constrain_stats(self, stats: "AdaptiveStats", constrain) -> "AdaptiveStats":
    """On a mesh (`Decoder._constrain`): the schedule is per example (batch-sharded); the call
    counts and the length histogram are sums (left as they are)."""
    return stats.replace(gamma_B=constrain(stats.gamma_B))

  def init_stats(self, batch: int) -> "AdaptiveStats":
    return AdaptiveStats.zeros(batch, self)

  def iteration(self, decoder, params, state: st.DecodeState) -> st.DecodeState:
    return adaptive_iteration(decoder, params, state, self)


@flax.struct.dataclass
class AdaptiveStats:
  """Extra on-device counters: draft calls, target-verified tokens, and the schedule."""

  draft_calls: jax.Array      # [] draft `extend` calls (all examples at once)
  verify_tokens: jax.Array    # [] sum over target calls of the verified width + 1
  gamma_B: jax.Array          # [B] each example's current schedule
  proposed_hist: jax.Array    # [G + 1] histogram of proposed block lengths g_b (active examples)

  @classmethod
  def zeros(cls, batch: int, cfg: "AdaptiveConfig") -> "AdaptiveStats":
    return cls(draft_calls=jnp.zeros((), jnp.int32), verify_tokens=jnp.zeros((), jnp.int32),
               gamma_B=jnp.full((batch,), cfg.gamma_init or cfg.gamma_max, jnp.int32),
               proposed_hist=jnp.zeros((cfg.gamma_max + 1,), jnp.int32))


def adaptive_draft_step(decoder, draft_params, state: st.DecodeState, sched_B, key,
                        cfg: AdaptiveConfig, sampling: SamplingConfig):
  """Drafts up to gamma_max tokens with the decoder's drafter (`draft_until_stopped`): (Proposal
  with proposed_B = g_B and fed_B = the draft calls made (gamma_max + 1 for a feature drafter:
  never pending), calls, cache); positions >= g_B hold junk the rule never keeps."""
  drafter = decoder.drafter
  logits_BxV, bonus_logits_BxV, out_Bx1xD, cache = drafter.first_call(decoder, draft_params,
                                                                      state)

  def step(aux, x_B):
    cache, g_Bx1xD = aux
    logits_Bx1xV, out_Bx1xD, cache = drafter.step(decoder, draft_params, cache, x_B[:, None],
                                                  g_Bx1xD)
    return logits_Bx1xV[:, 0], (cache, out_Bx1xD)

  x_BxG, q_BxGxV, g_B, calls, (cache, _) = draft_until_stopped(
      step, (cache, out_Bx1xD), logits_BxV, state.done_B, sched_B, key, cfg, sampling)
  if drafter.feeds_verified:
    fed_B, bonus_q_BxV = jnp.full_like(g_B, cfg.gamma_max + 1), jnp.zeros_like(q_BxGxV[:, 0])
  else:
    fed_B = jnp.full(g_B.shape, calls, jnp.int32)
    bonus_q_BxV = process_logits(bonus_logits_BxV, sampling)
  return (Proposal(x_BxG, q_BxGxV, proposed_B=g_B, fed_B=fed_B, bonus_q_BxV=bonus_q_BxV),
          calls, cache)


def draft_until_stopped(step, aux, logits_BxV: jax.Array, done_B: jax.Array, sched_B: jax.Array,
                        key: jax.Array, cfg: AdaptiveConfig, sampling: SamplingConfig):
  """The adaptive draft loop over any draft: x_1 ~ q from the first call's `logits_BxV`, then
  `step(aux, x_B) -> (logits [B, V], aux)` (a token draft's `extend`; a feature draft's
  `extend_features` with its own output feature in `aux`) until every active row has stopped:
  its schedule `sched_B` reached or its draft top probability below the threshold (a
  `while_loop`, so short blocks cost fewer calls). Returns (tokens [B, G], q [B, G, V], g_B, the
  draft calls made counting the first, aux)."""
  gmax = cfg.gamma_max
  keys = jax.random.split(key, gmax)
  q_BxV = process_logits(logits_BxV, sampling)
  x_B = sample(keys[0], q_BxV)
  batch, v = q_BxV.shape
  x_BxG = jnp.zeros((batch, gmax), jnp.int32).at[:, 0].set(x_B)
  q_BxGxV = jnp.zeros((batch, gmax, v), jnp.float32).at[:, 0].set(q_BxV)
  stopped_B = done_B | (sched_B <= 1) | unconfident(logits_BxV, cfg)

  def cond(c):
    i, *_, stopped_B = c
    return (i < gmax) & jnp.any(~stopped_B)  # an active example still wants token i + 1

  def body(c):
    i, aux, x_B, x_BxG, q_BxGxV, g_B, stopped_B = c
    logits_BxV, aux = step(aux, x_B)
    q_BxV = process_logits(logits_BxV, sampling)
    x_B = sample(keys[i], q_BxV)
    x_BxG = jax.lax.dynamic_update_slice(x_BxG, x_B[:, None], (0, i))
    q_BxGxV = jax.lax.dynamic_update_slice(q_BxGxV, q_BxV[:, None], (0, i, 0))
    g_B = jnp.where(stopped_B, g_B, i + 1)
    stopped_B = stopped_B | (i + 1 >= sched_B) | unconfident(logits_BxV, cfg)
    return i + 1, aux, x_B, x_BxG, q_BxGxV, g_B, stopped_B

  calls, aux, _, x_BxG, q_BxGxV, g_B, _ = jax.lax.while_loop(
      cond, body, (jnp.ones((), jnp.int32), aux, x_B, x_BxG, q_BxGxV,
                   jnp.ones((batch,), jnp.int32), stopped_B))
  return x_BxG, q_BxGxV, g_B, calls, aux


def unconfident(logits_BxV, cfg: AdaptiveConfig) -> jax.Array:
  """[B] bool: the draft's top probability (softmax of its raw logits, so it means something
  under greedy decoding too) is below `cfg.confidence_threshold` (never, at threshold 0)."""
  if cfg.confidence_threshold <= 0.0:
    return jnp.zeros(logits_BxV.shape[:1], bool)
  return jnp.max(jax.nn.softmax(logits_BxV.astype(jnp.float32), axis=-1), axis=-1) < (
      cfg.confidence_threshold)


def bucketed_verify(decoder, target_params, cache, last_B, x_BxG, width, cfg: AdaptiveConfig):
  """The drafter's verify call at the smallest compiled width >= `width`: (p [B, G + 1, V]
  padded uniform, the target's states padded with zeros (None for a token drafter), cache, the
  width used)."""
  g1 = cfg.gamma_max + 1

  def branch(w):
    def run(cache, last_B, x_BxG):
      block_BxW1 = jnp.concatenate([last_B[:, None], x_BxG[:, :w]], axis=1)
      logits, hidden, cache = decoder.drafter.verify(decoder, target_params, cache, block_BxW1)
      p = process_logits(logits, decoder.sampling)
      return (pad_positions(p, g1, 1.0 / p.shape[2]),
              None if hidden is None else pad_positions(hidden, g1), cache)
    return run

  (p_BxG1xV, hidden, cache), width_used = at_bucket(cfg, width, branch, cache, last_B, x_BxG)
  return p_BxG1xV, hidden, cache, width_used


def at_bucket(cfg: AdaptiveConfig, width, branch, *operands):
  """`branch(w)(*operands)` at the smallest compiled width w >= `width` (a `lax.switch` over
  `cfg.buckets`, each branch compiled at its static width): (its outputs, w)."""
  buckets = cfg.buckets
  idx = jnp.minimum(jnp.searchsorted(jnp.asarray(buckets, jnp.int32), width), len(buckets) - 1)
  return jax.lax.switch(idx, [branch(w) for w in buckets], *operands), (
      jnp.asarray(buckets, jnp.int32)[idx])


def pad_positions(x_BxT, total: int, value: float = 0.0) -> jax.Array:
  """`x_BxT...` padded with `value` along axis 1 to `total` positions (a bucket's outputs at the
  widest bucket's shape, so every `lax.switch` branch returns one shape)."""
  pad = jnp.full((x_BxT.shape[0], total - x_BxT.shape[1]) + x_BxT.shape[2:], value, x_BxT.dtype)
  return jnp.concatenate([x_BxT, pad], axis=1)


def masked_accept(rule: str, key, x_BxG, q_BxGxV, p_BxG1xV, g_B):
  """Any acceptance rule with positions >= g_B not proposed (see the module docstring)."""
  gmax = x_BxG.shape[1]
  k_rule, k_next = jax.random.split(key)
  proposed_BxG = jnp.arange(gmax)[None, :] < g_B[:, None]
  q_masked = jnp.where(proposed_BxG[..., None], q_BxGxV, 0.0)
  n_B, next_B = acc.get_rule(rule)(k_rule, x_BxG, q_masked, p_BxG1xV)
  p_g = jnp.take_along_axis(p_BxG1xV, g_B[:, None, None], axis=1)[:, 0]
  reached_B = n_B >= g_B
  next_B = jnp.where(reached_B, sample(k_next, p_g), next_B)
  return jnp.minimum(n_B, g_B), next_B


def next_schedule(sched_B, n_B, active_B, cfg: AdaptiveConfig):
  """HF's heuristic: +2 when every scheduled token was accepted, else -1; clipped to [1, G]."""
  if cfg.schedule == "constant":
    return sched_B
  new = jnp.where(n_B >= sched_B, sched_B + 2, sched_B - 1)
  return jnp.where(active_B, jnp.clip(new, 1, cfg.gamma_max), sched_B)


def adaptive_iteration(decoder, params, state: st.DecodeState, cfg: AdaptiveConfig
                       ) -> st.DecodeState:
  """One draft -> verify -> accept -> commit iteration with a per-example block length; the
  schedule and the statistics live in `state.stats` (`AdaptiveStats`)."""
  stats = state.stats
  rng, k_draft, k_accept = jax.random.split(state.rng, 3)
  active_B = ~state.done_B
  proposal, calls, draft_cache = adaptive_draft_step(decoder, params.draft, state, stats.gamma_B,
                                                     k_draft, cfg, decoder.sampling)
  g_B = proposal.proposed_B
  width = jnp.max(jnp.where(active_B, g_B, 1))
  p_BxG1xV, hidden, target_cache, w_used = bucketed_verify(
      decoder, params.target, state.target_cache, st.last_tokens(state), proposal.tokens_BxG,
      width, cfg)
  n_B, next_B = masked_accept(decoder.rule, k_accept, proposal.tokens_BxG, proposal.q_BxGxV,
                              p_BxG1xV, g_B)
  new = commit(state.replace(rng=rng, target_cache=target_cache, draft_cache=draft_cache),
               proposal, n_B, next_B, p_BxG1xV, decoder.target.eos_id, decoder.max_decode_len)
  new = decoder.drafter.observe(decoder, params.draft, state, new, hidden, state.draft_carry)
  return new.replace(stats=next_stats(stats, calls, w_used, n_B, g_B, active_B, cfg))


def next_stats(stats: AdaptiveStats, calls, w_used, n_B, g_B, active_B, cfg: AdaptiveConfig
               ) -> AdaptiveStats:
  """The statistics after an iteration of `calls` draft calls and a verify of width `w_used`
  that kept n_B of the g_B proposed tokens (rows active at its start: `active_B`)."""
  return AdaptiveStats(
      draft_calls=stats.draft_calls + calls, verify_tokens=stats.verify_tokens + w_used + 1,
      gamma_B=next_schedule(stats.gamma_B, n_B, active_B, cfg),
      proposed_hist=stats.proposed_hist + jnp.sum(
          (jnp.arange(cfg.gamma_max + 1)[None, :] == g_B[:, None]) & active_B[:, None], axis=0,
          dtype=jnp.int32))
