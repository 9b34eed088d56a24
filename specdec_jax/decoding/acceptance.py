"""Acceptance rules: given the draft's block and both models' processed distributions, how many
draft tokens to keep and which token to emit after them.

Public contract (DESIGN.md): `tokenwise(key, draft_tokens, draft_probs, target_probs)` with shapes
[B, G] int32, [B, G, V], [B, G + 1, V] float32 -> (num_accepted [B] int32, next_token [B] int32).
All arithmetic is float32 whatever the models ran in.
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

from specdec_jax.decoding.sampling import sample

# A residual whose mass is below this is numerically p == q: rejection then had probability ~0,
# and sampling from p is the correct limit (the residual is undefined, not zero).
RESIDUAL_EPS = 1e-12


def _take(probs_BxGxV: jax.Array, tokens_BxG: jax.Array) -> jax.Array:
  return jnp.take_along_axis(probs_BxGxV, tokens_BxG[..., None], axis=-1)[..., 0]


def leading_count(accept_BxG: jax.Array) -> jax.Array:
  """Number of leading True entries per row."""
  return jnp.sum(jnp.cumprod(accept_BxG.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def residual(p_BxV: jax.Array, q_BxV: jax.Array) -> jax.Array:
  """norm(max(0, p - q)), falling back to p where the residual has no mass."""
  r = jnp.maximum(p_BxV - q_BxV, 0.0)
  mass = jnp.sum(r, axis=-1, keepdims=True)
  return jnp.where(mass > RESIDUAL_EPS, r / jnp.maximum(mass, RESIDUAL_EPS), p_BxV)


def accept_test(r: jax.Array, p_x: jax.Array, q_x: jax.Array) -> jax.Array:
  """The token-wise test "r < p(x) / q(x)" for r ~ U[0, 1), without a division.

  Strict, so a token the target gives probability 0 is never accepted, not even for a float32
  draw of exactly 0 (`<=` would then break greedy equality, or emit a token outside top-k /
  top-p). p(x) >= q(x) accepts outright, so rounding in r * q(x) cannot reject a token the rule
  must keep. A position with q(x) = 0 and p(x) > 0 passes (the adaptive loop's unproposed
  positions; it truncates them itself).
  """
  return (p_x > 0.0) & ((p_x >= q_x) | (r * q_x < p_x))


def tokenwise(key: jax.Array, draft_tokens: jax.Array, draft_probs: jax.Array,
              target_probs: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Token-wise modified rejection sampling (Leviathan et al. Algorithm 1; Chen et al. Alg. 2).

  Accept x_i while r_i < p_i(x_i) / q_i(x_i) with r_i ~ U[0, 1) (`accept_test`). At the first
  rejection n, emit a sample of norm(max(0, p_{n+1} - q_{n+1})); if all G are accepted, emit a
  bonus sample of p_{G+1}.
  """
  draft_probs = draft_probs.astype(jnp.float32)
  target_probs = target_probs.astype(jnp.float32)
  batch, gamma = draft_tokens.shape
  k_accept, k_next = jax.random.split(key)
  p_x = _take(target_probs[:, :gamma], draft_tokens)
  q_x = _take(draft_probs, draft_tokens)
  r = jax.random.uniform(k_accept, (batch, gamma), jnp.float32)
  n_B = leading_count(accept_test(r, p_x, q_x))
  # Distribution of the token after the accepted prefix: residual at n < G, target at n == G.
  q_pad = jnp.concatenate([draft_probs, jnp.zeros_like(draft_probs[:, :1])], axis=1)
  p_n = jnp.take_along_axis(target_probs, n_B[:, None, None], axis=1)[:, 0]
  q_n = jnp.take_along_axis(q_pad, n_B[:, None, None], axis=1)[:, 0]
  next_B = sample(k_next, residual(p_n, q_n))
  return n_B, next_B


def _ratio_weights(p_x: jax.Array, q_x: jax.Array) -> jax.Array:
  """a_i = min(1, a_{i-1} p_i(x_i) / q_i(x_i)), a_0 = 1, for i = 1..G -> [B, G]. A token with
  q_i(x_i) = 0 was not proposed (the adaptive loop's masked positions): its weight and every
  later one is 0. The division only happens where the result is < 1: no overflow, no 0 * inf."""
  a_prev = jnp.ones_like(p_x[:, 0])
  out = []
  for i in range(p_x.shape[1]):  # G is small and static
    num = a_prev * p_x[:, i]
    a_i = jnp.where(num >= q_x[:, i], 1.0, num / jnp.maximum(q_x[:, i], 1e-38))
    a_i = jnp.where(q_x[:, i] > 0.0, a_i, 0.0)
    out.append(a_i)
    a_prev = a_i
  return jnp.stack(out, axis=1)


def block_distributions(draft_tokens: jax.Array, draft_probs: jax.Array, target_probs: jax.Array
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The quantities of block verification (Sun et al. 2024, Algorithm 2), all float32.

  Returns:
    h_BxG: h_i, the probability of the test "stop after i tokens" (i = 1..G) that is run from the
      back: tau = the largest i whose test passes, 0 if none does.
    scale_BxG1: the weight of p in the token after a stop at tau: a_tau for tau < G (a_0 = 1),
      and 1 at tau = G (the bonus token is a plain sample of p_{G+1}).
    next_BxG1xV: the distribution of the token emitted after a stop at tau = 0..G:
      norm(max(0, a_tau p_{tau+1} - q_{tau+1})) for tau < G, p_{G+1} for tau = G.

  With m_i = sum_x max(0, a_i p_{i+1}(x) - q_{i+1}(x)), h_i = m_i / (m_i + 1 - a_i) for i < G and
  h_G = a_G. Why it is exact: E[P(tau >= i | x_1..x_G) | x_1..x_i] = a_i (induction from the back,
  using E_{x ~ q}[min(1, a p(x)/q(x))] = a - m), and the residual at a stop restores exactly the
  mass of p that the draft's block under-covers. 0/0 (a_i = 1, m_i = 0, i.e. p_{i+1} = q_{i+1})
  is read as h_i = 1: a stop at i then has probability 0 whatever h_i is.
  """
  q = draft_probs.astype(jnp.float32)
  p = target_probs.astype(jnp.float32)
  gamma = draft_tokens.shape[1]
  a_BxG = _ratio_weights(_take(p[:, :gamma], draft_tokens), _take(q, draft_tokens))
  scale_BxG1 = jnp.concatenate([jnp.ones_like(a_BxG[:, :1]), a_BxG], axis=1)
  scale_BxG1 = scale_BxG1.at[:, gamma].set(1.0)
  q_pad = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)
  r_BxG1xV = jnp.maximum(scale_BxG1[..., None] * p - q_pad, 0.0)
  m_BxG1 = jnp.sum(r_BxG1xV, axis=-1)
  m_BxG, a_in = m_BxG1[:, 1:gamma], a_BxG[:, :gamma - 1]
  denom = m_BxG + (1.0 - a_in)
  h_mid = jnp.where(denom > 0.0, m_BxG / jnp.maximum(denom, 1e-38), 1.0)
  h_BxG = jnp.concatenate([jnp.clip(h_mid, 0.0, 1.0), a_BxG[:, gamma - 1:]], axis=1)
  next_BxG1xV = jnp.where(m_BxG1[..., None] > RESIDUAL_EPS,
                          r_BxG1xV / jnp.maximum(m_BxG1, RESIDUAL_EPS)[..., None], p)
  return h_BxG, scale_BxG1, next_BxG1xV


def stop_probabilities(h_BxG: jax.Array) -> jax.Array:
  """P(tau = i), i = 0..G, for tau = the largest i in 1..G with eta_i < h_i (0 if none)."""
  h_BxG1 = jnp.concatenate([jnp.ones_like(h_BxG[:, :1]), h_BxG], axis=1)
  # survive_i = prod_{j > i} (1 - h_j): no later test passed.
  later = jnp.concatenate([1.0 - h_BxG1[:, 1:], jnp.ones_like(h_BxG1[:, :1])], axis=1)
  survive = jnp.flip(jnp.cumprod(jnp.flip(later, axis=1), axis=1), axis=1)
  return h_BxG1 * survive


def block(key: jax.Array, draft_tokens: jax.Array, draft_probs: jax.Array,
          target_probs: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh 2024).

  Same contract as `tokenwise`. It verifies the block jointly: a token the token-wise test
  rejects can still be kept when later tokens make up for it, so the expected number accepted is
  never below token-wise verification's (optimal among rules that see only the drafted path), and
  the output still follows the target exactly. Greedy (one-hot p and q) gives `tokenwise`'s
  answer: the longest prefix on which the argmaxes agree.
  """
  batch, gamma = draft_tokens.shape
  k_accept, k_next = jax.random.split(key)
  h_BxG, _, next_BxG1xV = block_distributions(draft_tokens, draft_probs, target_probs)
  eta = jax.random.uniform(k_accept, (batch, gamma), jnp.float32)
  i_G = jnp.arange(1, gamma + 1, dtype=jnp.int32)
  # Strict <, so a test with h = 0 (e.g. a masked position) never passes, even for eta = 0.
  n_B = jnp.max(jnp.where(eta < h_BxG, i_G[None, :], 0), axis=1).astype(jnp.int32)
  dist_BxV = jnp.take_along_axis(next_BxG1xV, n_B[:, None, None], axis=1)[:, 0]
  return n_B, sample(k_next, dist_BxV)


ACCEPTANCE_RULES = {"tokenwise": tokenwise, "block": block}


@contextlib.contextmanager
def registered_rule(name: str, rule):
  """`rule` usable by `name` inside the block only (the exactness checker's deliberately wrong
  rules): the registry is never left changed, and an existing rule is never replaced."""
  if name in ACCEPTANCE_RULES:
    raise ValueError(f"acceptance rule {name!r} already exists")
  ACCEPTANCE_RULES[name] = rule
  try:
    yield name
  finally:
    del ACCEPTANCE_RULES[name]


def get_rule(name: str):
  if name not in ACCEPTANCE_RULES:
    raise ValueError(f"unknown acceptance rule {name!r}; known: {sorted(ACCEPTANCE_RULES)}")
  return ACCEPTANCE_RULES[name]
