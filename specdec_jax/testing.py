"""Small models and exact references for tests (the package's own `gm.testing`).

Wrappers here implement the decoding seam around a real `Model`, so the loops can be driven by a
draft that is always wrong or a target that ends at a chosen position, without special cases in
the loops themselves.
"""
from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import seam
from specdec_jax.decoding.sampling import SamplingConfig, process_logits
from specdec_jax.metrics.exactness import chi_square_gof  # noqa: F401  (the tests' import)
from specdec_jax.models.model_config import get_preset
from specdec_jax.models.model import Model


def tiny_pair(kind: str = "decoder", vocab_size: int | None = None, seed: int = 0):
  """(target, target_params, draft, draft_params) with the `*_test_*` presets."""
  overrides = {} if vocab_size is None else {"vocab_size": vocab_size}
  target = Model(get_preset(f"{kind}_test_target", **overrides))
  draft = Model(get_preset(f"{kind}_test_draft", **overrides))
  k1, k2 = jax.random.split(jax.random.key(seed))
  return target, target.init(k1), draft, draft.init(k2)


def tiny_feature_pair(kind: str = "decoder", vocab_size: int = 64):
  """(target, target_params, feature draft, its params with the target's pieces) on the
  `*_test_target` preset: a 16-wide feature-level draft block, 2 heads."""
  # pylint: disable=import-outside-toplevel
  from specdec_jax.models.feature_draft import FeatureDraft
  from specdec_jax.models.feature_draft_config import FeatureDraftConfig
  target = Model(get_preset(f"{kind}_test_target", vocab_size=vocab_size))
  tp = target.init(jax.random.key(0))
  draft = FeatureDraft(FeatureDraftConfig.for_target(target.config, emb_dim=16, num_heads=2,
                                                     mlp_dim=32))
  return target, tp, draft, draft.with_target_pieces(draft.init(jax.random.key(1)), tp)


class MemoryStore:
  """The two methods of `runner.store.ResultStore` that calibration uses, in memory (a resumed
  run's remembered choices without a run directory)."""

  def __init__(self):
    self.state = {}

  def remember(self, section, key, value):
    self.state.setdefault(section, {})[key] = value

  def recall(self, section, key, default=None):
    return self.state.get(section, {}).get(key, default)


class WrappedModel(seam.Delegate):
  """Delegates the seam to `base`; subclasses override `extend`."""


@dataclasses.dataclass(frozen=True)
class AlwaysWrong(WrappedModel):
  """Negated logits: its argmax is the base model's argmin, so greedy drafts are always rejected."""

  def extend(self, params, cache, tokens_BxT):
    logits, cache = self.base.extend(params, cache, tokens_BxT)
    return -logits, cache


@dataclasses.dataclass(frozen=True)
class WrongOnRows(WrappedModel):
  """The base model on every row but `rows`, where its logits are negated: as a draft of its own
  base it agrees everywhere on the other rows and is always rejected (greedy) on these."""

  rows: tuple[int, ...] = (1,)

  def extend(self, params, cache, tokens_BxT):
    logits, cache = self.base.extend(params, cache, tokens_BxT)
    wrong_B = jnp.isin(jnp.arange(logits.shape[0]), jnp.asarray(self.rows))
    return jnp.where(wrong_B[:, None, None], -logits, logits), cache


@dataclasses.dataclass(frozen=True)
class EosAt(WrappedModel):
  """EOS is the argmax exactly when the token fed sits at cache slot `slots[b]`, never elsewhere."""

  slots: tuple[int, ...] = ()

  def extend(self, params, cache, tokens_BxT):
    index_B = cache.index_B
    logits, cache = self.base.extend(params, cache, tokens_BxT)
    pos_BxT = index_B[:, None] + jnp.arange(tokens_BxT.shape[1])[None, :]
    slots_B = jnp.asarray(self.slots, jnp.int32)
    eos_logit_BxT = jnp.where(pos_BxT == slots_B[:, None], 1e4, -1e4)
    return logits.at[..., self.eos_id].set(eos_logit_BxT), cache


@dataclasses.dataclass(frozen=True)
class TopTwoSwapped(WrappedModel):
  """The base model with its two highest logits swapped on `rows` (every row when empty), in
  `extend` and `extend_with_mask` alike. As a greedy draft of its own base, a chain's draft is
  always rejected on those rows and a tree's rank-1 child is always the target's argmax: the
  tree scheme keeps non-first siblings, so kept paths leave consecutive slots."""

  rows: tuple[int, ...] = ()

  def _swap(self, logits_BxTxV):
    top_BxTx2, idx_BxTx2 = jax.lax.top_k(logits_BxTxV, 2)
    v = logits_BxTxV.shape[-1]
    gap_BxTx1 = top_BxTx2[..., :1] - top_BxTx2[..., 1:]
    swapped = (logits_BxTxV - gap_BxTx1 * jax.nn.one_hot(idx_BxTx2[..., 0], v)
               + gap_BxTx1 * jax.nn.one_hot(idx_BxTx2[..., 1], v))
    if not self.rows:
      return swapped
    on_B = jnp.isin(jnp.arange(logits_BxTxV.shape[0]), jnp.asarray(self.rows))
    return jnp.where(on_B[:, None, None], swapped, logits_BxTxV)

  def extend(self, params, cache, tokens_BxT):
    logits, cache = self.base.extend(params, cache, tokens_BxT)
    return self._swap(logits), cache

  def extend_with_mask(self, params, cache, tokens_BxT, offsets, visible):
    logits, cache = self.base.extend_with_mask(params, cache, tokens_BxT, offsets, visible)
    return self._swap(logits), cache


def ragged_prompts(lengths, extra: int, vocab_size: int = 64, seed: int = 1):
  """(sequences, prompts_BxP): random token sequences of `lengths[b] + extra` ids (no pad id) and
  their first `lengths[b]` ids right-padded into one batch, for cached-vs-full-forward tests."""
  rng = np.random.default_rng(seed)
  seqs = [rng.integers(2, vocab_size, n + extra) for n in lengths]
  prompts = np.zeros((len(lengths), max(lengths)), np.int32)
  for b, n in enumerate(lengths):
    prompts[b, :n] = seqs[b][:n]
  return seqs, prompts


def exact_joint(model: Model, params, prompt_P: np.ndarray, num_tokens: int,
                sampling: SamplingConfig) -> np.ndarray:
  """Exact probability of every continuation of `num_tokens` tokens under the processed target.

  Enumerates all V^k sequences through the full (uncached) forward pass, independently of the
  loops, so it is the reference the sampled frequencies are tested against. Decoder-only
  models (the prompt, then the sequence), or T5 (the prompt is the source; the decoder reads
  the start id 0, then the sequence). Returns a float64 array of shape [V] * k.
  """
  v = model.vocab_size
  seqs = np.array(list(itertools.product(range(v), repeat=num_tokens)), np.int32)
  prompt = np.broadcast_to(np.asarray(prompt_P, np.int32), (len(seqs), len(prompt_P)))
  if seam.is_encoder_decoder(model):
    dec = np.concatenate([np.zeros((len(seqs), 1), np.int32), seqs[:, :-1]], axis=1)
    probs = process_logits(model.forward(params, jnp.asarray(prompt), jnp.asarray(dec)),
                           sampling)
  else:
    full = jnp.asarray(np.concatenate([prompt, seqs], axis=1))
    p0 = len(prompt_P) - 1
    probs = process_logits(model.forward(params, full, full)[:, p0:p0 + num_tokens], sampling)
  step_probs = np.take_along_axis(np.asarray(probs, np.float64), seqs[..., None], axis=-1)[..., 0]
  joint = np.prod(step_probs, axis=1)
  return joint.reshape([v] * num_tokens)


def sharp_tiny_pair(vocab_size: int = 6):
  """(target, params, draft, params) over a tiny vocabulary for the chi-square tests of the tree
  schemes: a 1-layer target with doubled weights (a sharp p) and a differently initialised draft,
  no EOS (every sample runs to its length)."""
  cfg = get_preset("decoder_test_draft", vocab_size=vocab_size, emb_dim=16,
                   num_decoder_layers=1, eos_id=-1)
  target, draft = Model(cfg), Model(cfg.replace(mlp_dim=16))
  tp = jax.tree_util.tree_map(lambda x: 2.0 * x, target.init(jax.random.key(11)))
  return target, tp, draft, draft.init(jax.random.key(12))


def sharp_t5_feature_pair(vocab_size: int = 6):
  """`sharp_feature_pair` of the T5 test target over `vocab_size` tokens, no EOS."""
  return sharp_feature_pair(Model(get_preset("t5_test_target", vocab_size=vocab_size,
                                             eos_id=-1)))


def sharp_feature_pair(target: Model):
  """(target, params, feature draft, params) for the feature schemes' chi-square tests: the
  target (give it no EOS: every sample runs to its length) with doubled weights (a sharp p), a
  16-wide feature draft with its own head, doubled too."""
  # pylint: disable=import-outside-toplevel
  from specdec_jax.models.feature_draft import FeatureDraft
  from specdec_jax.models.feature_draft_config import FeatureDraftConfig
  tp = jax.tree.map(lambda x: 2.0 * x, target.init(jax.random.key(11)))
  draft = FeatureDraft(FeatureDraftConfig.for_target(target.config, emb_dim=16, num_heads=2,
                                                     mlp_dim=32, eos_id=-1, head="own"))
  dp = jax.tree.map(lambda x: 2.0 * x, draft.with_target_pieces(draft.init(jax.random.key(12)),
                                                                tp))
  return target, tp, draft, dp


# The static trees' chi-square cases (tests/decoding/test_tree_scheme_distribution.py, and the
# feature draft's trees in test_tree_feature.py): vocabulary 6, the law of every 3-token
# continuation of this prompt, 100k samples; (sampling, branching per depth). The (3, 2) tree
# at T = 1 runs in the fast suite, top-k and top-p with the slow one.
TREE_LAW_VOCAB, TREE_LAW_TOKENS, TREE_LAW_SAMPLES = 6, 3, 100_000
TREE_LAW_PROMPT = np.array([3, 5, 2], np.int32)
TREE_LAW_CASES = {
    "t1_3x2": (SamplingConfig(temperature=1.0), (3, 2)),
    "t0.7_topk3_4x2": (SamplingConfig(temperature=0.7, top_k=3), (4, 2)),
    "topp0.8_2x1x1": (SamplingConfig(temperature=1.0, top_p=0.8), (2, 1, 1)),
}


def teacher_forced_draft_logits(target: Model, tp, draft, dp, prompt_P: np.ndarray,
                                stream_T: np.ndarray) -> np.ndarray:
  """A decoder-only target's feature draft's logits [V] for the token after prompt + stream,
  every entry fed the target's own state (what `training.feature_trainer` shows it): entry s =
  (fuse(h_s), t_{s+1}). What a feature scheme's first draft call must reproduce after any
  history of iterations: a pending entry lost, fed twice or given another slot's feature
  changes it."""
  seq = jnp.asarray(np.concatenate([prompt_P, stream_T])[None], jnp.int32)
  _, hidden = target.forward_with_hidden(tp, seq, seq, draft.feature_layers)
  logits, _ = draft.forward(dp, seq, seq[:, 1:], draft.fuse(dp, hidden[:, :-1]))
  return np.asarray(logits[0, -1])


def law_pvalue(models, sampling: SamplingConfig, scheme, prompt_P: np.ndarray, num_tokens: int,
               num_samples: int, seed: int = 0, rule: str = "tokenwise", drafter=None):
  """(chi-square p-value of `num_samples` decodes of `num_tokens` tokens after `prompt_P` by a
  Decoder with `scheme` against the target's exact law (`exact_joint`), the decode result)."""
  from specdec_jax.decoding.decoder import Decoder, Params  # pylint: disable=import-outside-toplevel
  target, tp, draft, dp = models
  inputs = jnp.asarray(np.broadcast_to(prompt_P, (num_samples, len(prompt_P))))
  out = Decoder(target, draft, scheme, sampling, rule=rule, max_decode_len=num_tokens,
                drafter=drafter).generate(Params(tp, dp), inputs, jax.random.key(seed))
  assert np.all(np.asarray(out.lengths_B) == num_tokens)
  tokens_SxN = np.asarray(out.tokens_BxN)[:, :num_tokens]
  return _joint_pvalue(target, tp, prompt_P, sampling, tokens_SxN), out


def _joint_pvalue(target: Model, tp, prompt_P: np.ndarray, sampling: SamplingConfig,
                  tokens_SxN: np.ndarray) -> float:
  """Chi-square p-value of the sampled continuations `tokens_SxN` against `exact_joint`."""
  vocab, num_tokens = target.vocab_size, tokens_SxN.shape[1]
  flat = np.ravel_multi_index(tokens_SxN.T, (vocab,) * num_tokens)
  counts = np.bincount(flat, minlength=vocab ** num_tokens)
  probs = exact_joint(target, tp, prompt_P, num_tokens, sampling).ravel()
  return chi_square_gof(counts, probs)[2]


def vmapped_law_pvalue(models, sampling: SamplingConfig, scheme, prompt_P: np.ndarray,
                       num_tokens: int, num_samples: int, rule: str = "tokenwise", seed: int = 0,
                       drafter=None):
  """`law_pvalue` with every sample its own batch-1 decode (vmapped over keys): for schemes whose
  choices are per batch (a draft picked per iteration, a draft loop that ends when every row has
  stopped), so each sample makes them as a batch-1 request does. (p-value, the decode result
  with a leading sample axis: tokens [S, 1, N])."""
  from specdec_jax.decoding.decoder import (  # pylint: disable=import-outside-toplevel
      Decoder, Params, decode_program)
  target, tp, draft, dp = models
  decoder = Decoder(target, draft, scheme, sampling, rule=rule, max_decode_len=num_tokens,
                    drafter=drafter)
  one = jax.vmap(lambda k: decode_program(decoder, Params(tp, dp), jnp.asarray(prompt_P)[None],
                                          k, None))
  out = jax.jit(one)(jax.random.split(jax.random.key(seed), num_samples))
  assert np.all(np.asarray(out.lengths_B) == num_tokens)
  tokens_SxN = np.asarray(out.tokens_BxN)[:, 0, :num_tokens]
  return _joint_pvalue(target, tp, prompt_P, sampling, tokens_SxN), out


def run_in_process(*args: str) -> None:
  """`python -m specdec_jax.run ARGS` in this process (absl flags parsed, gin cleared after), so
  tests reuse the process's compiled programs instead of paying a fresh interpreter per run."""
  import gin  # pylint: disable=import-outside-toplevel
  from absl import flags  # pylint: disable=import-outside-toplevel

  from specdec_jax import gin_utils, run  # pylint: disable=import-outside-toplevel
  argv = gin_utils.rewrite_gin_args(["run", *args])
  flags.FLAGS(argv)
  try:
    run.main([argv[0]])
  finally:
    flags.FLAGS.unparse_flags()
    gin.clear_config()


def sibling_residual_from_p(u_B, x_B, p_node_BxV, p_cur_BxV, q_left_BxV):
  """A deliberately wrong tree sibling rule (`tree.verify.SiblingRule`), the fault the tree
  tests must catch: after a rejected sibling, the next sibling is tested against the node's p
  instead of the running residual (the residual chain for the final correction stays right, so
  on a chain, one child per node, it is exact: only the sibling logic is wrong)."""
  from specdec_jax.decoding import acceptance  # pylint: disable=import-outside-toplevel
  from specdec_jax.decoding.tree import verify  # pylint: disable=import-outside-toplevel
  accept_B, valid_B, _, q_next_BxV = verify.rejection_sibling(u_B, x_B, p_node_BxV, p_node_BxV,
                                                              q_left_BxV)
  q_i_BxV = q_left_BxV / jnp.maximum(jnp.sum(q_left_BxV, axis=-1), 1e-30)[:, None]
  reject_B = valid_B & ~accept_B
  p_next_BxV = jnp.where(reject_B[:, None], acceptance.residual(p_cur_BxV, q_i_BxV), p_cur_BxV)
  return accept_B, valid_B, p_next_BxV, q_next_BxV


def sibling_q_keeps_tried(u_B, x_B, p_node_BxV, p_cur_BxV, q_left_BxV):
  """A second wrong sibling rule: a rejected sibling's token stays in q, so every sibling is
  tested, and the residual taken, against the node's whole q (the rule for siblings drawn WITH
  replacement, applied to siblings drawn without it)."""
  from specdec_jax.decoding.tree import verify  # pylint: disable=import-outside-toplevel
  accept_B, valid_B, p_next_BxV, _ = verify.rejection_sibling(u_B, x_B, p_node_BxV, p_cur_BxV,
                                                              q_left_BxV)
  return accept_B, valid_B, p_next_BxV, q_left_BxV


def faulty_tree_verifier(sibling):
  """A tree verifier (the `recursive_rejection` contract) built on another sibling rule."""
  from specdec_jax.decoding.sampling import sample  # pylint: disable=import-outside-toplevel
  from specdec_jax.decoding.tree import verify  # pylint: disable=import-outside-toplevel

  def verifier(key, tree, node_tokens_BxN, draft_probs_BxNxV, target_probs_BxNxV):
    k_walk, k_next = jax.random.split(key)
    verdict, final_BxV = verify.descend(k_walk, tree, node_tokens_BxN, draft_probs_BxNxV,
                                        target_probs_BxNxV, sibling)
    return verdict.replace(next_token_B=sample(k_next, final_BxV))
  return verifier


def memory_maps() -> int:
  """The memory regions this process maps (Linux; 0 elsewhere). Each XLA:CPU compilation maps
  several that live as long as its executable is cached, and a process past the kernel's
  vm.max_map_count (65530 by default) crashes inside XLA: tests/conftest.py drops jax's caches
  between test modules past a threshold."""
  try:
    with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
      return sum(1 for _ in f)
  except OSError:
    return 0
