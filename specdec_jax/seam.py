"""The decoding seam, typed: what every loop needs of a target, a draft and their caches.

The ground floor: this module imports nothing of the project. Models, caches, drafters, the
decoding loops and the test wrappers all import it; it imports none of them.

Why a Protocol: the loops are written once and drive very different things through it: the T5 v1.1
encoder-decoder and the decoder-only LM (`models.model.Model`), the model-free n-gram and prompt
lookup drafts (`models.model_free`), and the test wrappers (`specdec_jax.testing`). None of them
inherits from anything; each just has these members, and `typing.runtime_checkable` lets the
front door say which member is missing instead of failing deep inside a trace.

Coordinates (DESIGN.md, "The decoding seam"): the loops keep a token buffer whose slot 0 holds the
start token, the last context token not yet fed (T5: BOS with an empty decoder cache; decoder-only:
the last prompt token, the rest of the prompt already in the cache). After `prefill`,
`cache.index_B` is the cache slot of that start token, so buffer slot j lives at cache slot
`index_B + j`. Rolling back is setting `index_B` lower; writes replace slots, never add into them.

Two extension points:
- `prefill(..., encoded=...)`: a shared-encoder draft (`shares_encoder` True: a decoder with no
  encoder of its own, `ModelConfig.source_dim`) decodes on top of the TARGET's reading of the
  source. `init_state` then calls the target's `encode` once and passes the `Encoded` (states and
  mask) to both prefills: the target uses it as its own encoder output instead of encoding again,
  the draft cross-attends to it. Without such a draft every prefill gets None and encodes itself.
  `shares_encoder` and `encode` are optional members (`shares_encoder(model)` reads the first).
- `extend` returns `(logits_BxTxV, cache)`; a feature-level draft needs the target's hidden
  states too, so the two-tuple every loop unpacks stays as it is and the states come from an
  optional member (below).

Optional capabilities (not in the Protocol: a scheme that needs one checks for it, `check_masked`):
- `extend_with_mask(params, cache, tokens_BxT, offsets, visible)`: a block that need not be a
  chain (token t at slot index + t, position index + offsets[t], seeing the cached prefix and the
  new tokens u with visible[t, u]), and a cache with `copy_slots(src_BxT, dst_BxT)`: the tree
  scheme (`decoding.tree.scheme`) scores a draft tree in one call and gathers the kept path into
  consecutive slots. `models.model.Model` has both; `Delegate` forwards the first only where the
  wrapper does not change `extend` (else the wrapper would silently not apply to trees).
- `extend_with_hidden(params, cache, tokens_BxT, layers, offsets=None, visible=None) ->
  (logits_BxTxV, hidden_BxTxnxD, cache)`: the same call as `extend` (equal logits; with offsets /
  visible, as `extend_with_mask`) that also returns the residual stream at chosen layers, for a
  feature-level draft (`decoding.drafter.FeatureDrafter`). `Delegate` does not
  forward it (a wrapper that changes `extend` would not change it).
- `prefill_with_hidden(params, inputs_BxP, cache_len, layers) -> (cache, hidden_BxTxnxD)`:
  decoder-only, `prefill` that also returns those states at the prompt's fed slots, so a
  feature-level draft starts from the whole prompt (`feature_entries.prime_carry`); not forwarded
  by `Delegate` either.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Literal, Optional, Protocol, runtime_checkable

import flax.struct
import jax

Kind = Literal["t5", "decoder"]
KINDS = ("t5", "decoder")


@runtime_checkable
class Cache(Protocol):
  """What the loops need of a model's cache: where each example writes next, and rollback.

  index_B: [B] int32, the slot the next token of each example is written to; slots at or past it
    are invalid (masked by attention, overwritten by the next write).
  rollback(index_B): the same cache with each example's valid prefix cut to `index_B` slots. An
    index move only: safe because every write REPLACES slot contents (DESIGN.md, "The decoding seam").
  Implemented by `models.kv_cache.DecodeCache` and `models.model_free.HistoryCache`.
  """

  @property
  def index_B(self) -> jax.Array: ...

  def rollback(self, index_B: jax.Array) -> "Cache": ...


@flax.struct.dataclass
class Encoded:
  """A request's encoder output, as the target computed it (shared with an encoder-less draft)."""

  states_BxExD: jax.Array
  mask_BxE: jax.Array


@runtime_checkable
class Decodable(Protocol):
  """A target or a draft as the decoding loops see it.

  kind: 't5' (encoder-decoder: the prompt is encoded, the decoder stream starts at BOS) or
    'decoder' (the prompt is the start of the decoder stream). A draft must be of its target's
    kind: the loops keep one buffer and one coordinate system for both.
  vocab_size / eos_id / pad_id: token ids the loops and the acceptance rules rely on.
  """

  @property
  def kind(self) -> Kind: ...

  @property
  def vocab_size(self) -> int: ...

  @property
  def eos_id(self) -> int: ...

  @property
  def pad_id(self) -> int: ...

  def start_tokens(self, inputs_BxP: jax.Array) -> jax.Array:
    """[B] int32: the token in buffer slot 0 (BOS, or the last real prompt token)."""

  def prefill(self, params: Any, inputs_BxP: jax.Array, cache_len: int, *,
              encoded: Optional[Encoded] = None) -> Cache:
    """A cache with `cache_len` decoder slots whose `index_B` is the start token's slot."""

  def extend(self, params: Any, cache: Cache, tokens_BxT: jax.Array) -> tuple[jax.Array, Cache]:
    """Feeds T tokens per example at `cache.index_B`: (float logits [B, T, V], the new cache)."""


def is_encoder_decoder(model: Decodable) -> bool:
  return model.kind == "t5"


def shares_encoder(model: Any) -> bool:
  """Whether `model` is a shared-encoder draft: its prefill needs its target's `Encoded`."""
  return bool(getattr(model, "shares_encoder", False))


def _members(protocol) -> list[str]:
  return sorted(n for n in vars(protocol) if not n.startswith("_"))


def check(model: Any, role: str) -> None:
  """Raises a TypeError naming the members `model` lacks (before anything is traced)."""
  if not isinstance(model, Decodable):
    missing = [m for m in _members(Decodable) if not hasattr(model, m)]
    raise TypeError(f"the {role} ({type(model).__name__}) does not implement the decoding seam: "
                    f"missing {', '.join(missing)} (see specdec_jax.seam.Decodable)")
  if model.kind not in KINDS:
    raise ValueError(f"the {role}'s kind must be one of {KINDS}, got {model.kind!r}")


def check_masked(model: Any, role: str) -> None:
  """Raises a TypeError unless `model` can score a masked block (`extend_with_mask`): what the
  tree scheme needs of its target and draft, refused before anything is traced."""
  if not hasattr(model, "extend_with_mask"):
    raise TypeError(f"the {role} ({type(model).__name__}) has no extend_with_mask (a block that "
                    "is not a chain), which tree decoding needs: use a model target and draft "
                    "(a wrapper that changes `extend` must also define `extend_with_mask`)")


def check_pair(target: Decodable, draft: Decodable) -> None:
  """A draft must speak its target's token ids in its target's coordinates; refuse otherwise.

  Why before anything is compiled: a T5 target with a decoder-only draft (or the reverse) runs to
  the end without error, every proposal rejected (alpha 0.000), which looks like a bad draft
  rather than a wrong configuration.
  """
  check(target, "target")
  check(draft, "draft")
  if draft.kind != target.kind:
    names = {"t5": "an encoder-decoder (T5)", "decoder": "a decoder-only"}
    raise ValueError(
        f"the draft is {names[draft.kind]} model (kind {draft.kind!r}) but the target is "
        f"{names[target.kind]} model (kind {target.kind!r}); speculative decoding needs a draft "
        "of the target's kind (same prompt handling and decoder coordinates): choose a draft "
        "trained for this target")
  if draft.vocab_size != target.vocab_size:
    raise ValueError(
        f"draft and target vocabularies differ in size: draft {draft.vocab_size} vs target "
        f"{target.vocab_size}; speculative sampling needs both models over the same token ids")
  if shares_encoder(target):
    raise ValueError("the target is a shared-encoder draft (no encoder of its own): it can only "
                     "draft for the target whose encoder it was trained on")
  if shares_encoder(draft):
    if not hasattr(target, "encode"):
      raise ValueError(f"the draft is a shared-encoder draft but the target "
                       f"({type(target).__name__}) has no `encode` to share")
    want = getattr(getattr(draft, "config", None), "source_dim", None)
    have = getattr(getattr(target, "config", None), "emb_dim", None)
    if want is not None and have is not None and want != have:
      raise ValueError(f"the shared-encoder draft reads encoder states of width {want} but the "
                       f"target's encoder is {have} wide: it was built for another target")


@dataclasses.dataclass(frozen=True)
class Delegate:
  """A seam implementation that forwards every member to `base` (frozen, so hashable: a static
  jit argument). Subclasses override what they change, usually `extend`: the exactness checker's
  fault injection (`check_exactness`) and the test wrappers (`specdec_jax.testing`)."""

  base: Any

  @property
  def config(self):
    return self.base.config

  @property
  def kind(self) -> Kind:
    return self.base.kind

  @property
  def vocab_size(self) -> int:
    return self.base.vocab_size

  @property
  def eos_id(self) -> int:
    return self.base.eos_id

  @property
  def pad_id(self) -> int:
    return self.base.pad_id

  @property
  def shares_encoder(self) -> bool:
    return shares_encoder(self.base)

  def encode(self, params, inputs_BxP):
    return self.base.encode(params, inputs_BxP)

  def start_tokens(self, inputs_BxP):
    return self.base.start_tokens(inputs_BxP)

  def prefill(self, params, inputs_BxP, cache_len, *, encoded=None):
    return self.base.prefill(params, inputs_BxP, cache_len, encoded=encoded)

  def extend(self, params, cache, tokens_BxT):
    return self.base.extend(params, cache, tokens_BxT)

  @property
  def extend_with_mask(self):
    """The base's, where this wrapper leaves `extend` alone; a wrapper that changes `extend`
    has none unless it defines its own (an AttributeError, so `hasattr` says False)."""
    if type(self).extend is not Delegate.extend:
      raise AttributeError(f"{type(self).__name__} changes extend but defines no "
                           "extend_with_mask")
    return self.base.extend_with_mask
