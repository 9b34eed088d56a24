"""The parameter tree every checkpoint format is normalised into, and its validation.

All readers (T5X legacy, T5X Orbax, Hugging Face, our own Orbax format) produce the tree T5X
keeps under `target/` (nested dicts, kernels 2-D (in, out)). This module knows that tree from the
config alone, so a checkpoint can be checked before any model is built, and errors can name the
offending array by the path a T5X user would recognise (`target/decoder/layers_3/mlp/wo/kernel`).
It also converts between per-layer (`layers_{i}`) and scanned (`layers`, stacked on axis 0) trees.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

import numpy as np

from specdec_jax.models.model_config import ModelConfig

_LAYER_RE = re.compile(r"^layers_(\d+)$")
# Prefix used in error messages, so paths read exactly as in a T5X checkpoint.
T5X_PREFIX = "target/"


class CheckpointError(ValueError):
  """A checkpoint that cannot be read or does not fit the model config."""


def nonfinite(flat: Mapping[str, Any]) -> list[str]:
  """The paths of floating arrays holding a NaN or an infinity (reduced on device for jax
  arrays, so a sharded model is checked where it lives).

  Why: a diverged training run exported NaN weights, and a run then drafted with them at alpha
  NaN without a word; writers and loaders refuse such weights instead.
  """
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel  (tree.py stays numpy-only)
  bad = []
  for key, value in flat.items():
    x = value if hasattr(value, "sharding") else np.asarray(value)
    if jnp.issubdtype(x.dtype, jnp.floating) and not bool(jnp.all(jnp.isfinite(x))):
      bad.append(key)
  return bad


def check_finite(flat: Mapping[str, Any], what: str) -> None:
  """Raises `CheckpointError` naming up to five non-finite arrays of `what`."""
  bad = nonfinite(flat)
  if bad:
    raise CheckpointError(f"{what} holds NaN or infinite values in {len(bad)} arrays "
                          f"({', '.join(T5X_PREFIX + b for b in bad[:5])}); refusing to use them")


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """Nested dicts -> {'a/b/c': leaf}."""
  out = {}
  for key, value in tree.items():
    path = f"{prefix}{key}"
    if isinstance(value, Mapping):
      out.update(flatten(value, path + "/"))
    else:
      out[path] = value
  return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
  """{'a/b/c': leaf} -> nested dicts."""
  tree: dict[str, Any] = {}
  for path, value in flat.items():
    node = tree
    *parents, last = path.split("/")
    for key in parents:
      node = node.setdefault(key, {})
    node[last] = value
  return tree


def _attention(prefix: str, e: int, i: int, kv: int | None = None,
               bias: bool = False) -> dict[str, tuple[int, ...]]:
  """`kv`: the key/value width (grouped-query attention; default i); `bias`: q/k/v biases."""
  kv = i if kv is None else kv
  shapes = {f"{prefix}/query/kernel": (e, i), f"{prefix}/key/kernel": (e, kv),
            f"{prefix}/value/kernel": (e, kv), f"{prefix}/out/kernel": (i, e)}
  if bias:
    shapes.update({f"{prefix}/query/bias": (i,), f"{prefix}/key/bias": (kv,),
                   f"{prefix}/value/bias": (kv,)})
  return shapes


def _mlp(prefix: str, e: int, m: int) -> dict[str, tuple[int, ...]]:
  return {f"{prefix}/wi_0/kernel": (e, m), f"{prefix}/wi_1/kernel": (e, m),
          f"{prefix}/wo/kernel": (m, e)}


def layer_shapes(config: ModelConfig, stack: str) -> dict[str, tuple[int, ...]]:
  """Shapes of one layer of `stack` ('encoder' or 'decoder'), paths relative to the layer."""
  e, i, m = config.emb_dim, config.num_heads * config.head_dim, config.mlp_dim
  if stack == "encoder":
    return {"pre_attention_layer_norm/scale": (e,), **_attention("attention", e, i),
            "pre_mlp_layer_norm/scale": (e,), **_mlp("mlp", e, m)}
  kv = config.kv_heads * config.head_dim
  shapes = {"pre_self_attention_layer_norm/scale": (e,),
            **_attention("self_attention", e, i, kv, config.qkv_bias)}
  if config.is_encoder_decoder:
    shapes.update({"pre_cross_attention_layer_norm/scale": (e,),
                   **_attention("encoder_decoder_attention", e, i)})
  shapes.update({"pre_mlp_layer_norm/scale": (e,), **_mlp("mlp", e, m)})
  return shapes


def expected_shapes(config: ModelConfig, scan_layers: bool | None = None) -> dict[str, tuple[int, ...]]:
  """Flat {path: shape} of the parameter tree `config` describes (without the `target/` level)."""
  scan = config.scan_layers if scan_layers is None else scan_layers
  shapes: dict[str, tuple[int, ...]] = {
      "token_embedder/embedding": (config.vocab_size, config.emb_dim)}
  rel = (config.num_heads, config.relative_attention_num_buckets)
  stacks = [("decoder", config.num_decoder_layers, "decoder_norm")]
  if config.is_encoder_decoder and not config.shares_encoder:
    stacks.insert(0, ("encoder", config.num_encoder_layers, "encoder_norm"))
  if config.shares_encoder and config.source_dim != config.emb_dim:
    shapes["source_projection/kernel"] = (config.source_dim, config.emb_dim)
  for stack, n, norm in stacks:
    if not config.uses_rope:
      shapes[f"{stack}/relpos_bias/rel_embedding"] = rel
    for sub, shape in layer_shapes(config, stack).items():
      if scan:
        shapes[f"{stack}/layers/{sub}"] = (n, *shape)
      else:
        for layer in range(n):
          shapes[f"{stack}/layers_{layer}/{sub}"] = shape
    shapes[f"{stack}/{norm}/scale"] = (config.emb_dim,)
  if not config.tie_embeddings:
    shapes["decoder/logits_dense/kernel"] = (config.emb_dim, config.vocab_size)
  return shapes


def validate(flat: Mapping[str, Any], config: ModelConfig, source: str = "checkpoint") -> None:
  """Raises CheckpointError naming every missing, unexpected or mis-shaped array.

  Leaves need only a `.shape` (arrays, tensorstore handles, jax.ShapeDtypeStruct).
  """
  want = expected_shapes(config)
  problems = []
  missing = [p for p in want if p not in flat]
  unexpected = sorted(p for p in flat if p not in want)
  for p in missing:
    problems.append(f"missing array {T5X_PREFIX}{p} (expected shape {want[p]})")
  for p in unexpected:
    problems.append(f"unexpected array {T5X_PREFIX}{p} shape {tuple(flat[p].shape)}")
  for p, shape in want.items():
    if p in flat and tuple(flat[p].shape) != tuple(shape):
      problems.append(f"shape mismatch at {T5X_PREFIX}{p}: checkpoint has {tuple(flat[p].shape)}, "
                      f"config expects {tuple(shape)}")
  if problems:
    problems = _hints(flat, config) + problems
    head = f"{source} does not match the model config ({len(problems)} problem(s)):\n  "
    raise CheckpointError(head + "\n  ".join(problems[:50]) +
                          (f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""))


def _hints(flat: Mapping[str, Any], config: ModelConfig) -> list[str]:
  """One-line diagnoses of the usual causes, listed before the per-array problems."""
  hints = []
  has_encoder = any(p.startswith("encoder/") for p in flat)
  if has_encoder and not config.is_encoder_decoder:
    hints.append("hint: the checkpoint has an encoder (a T5 encoder-decoder) but config.kind='decoder'")
  if not has_encoder and config.is_encoder_decoder and not config.shares_encoder:
    hints.append("hint: the checkpoint has no encoder (decoder-only?) but config.kind='t5'")
  if not is_scanned(flat):
    for stack, want in (("encoder", config.num_encoder_layers), ("decoder", config.num_decoder_layers)):
      got = len(_layer_indices(flat, stack))
      if got and got != want:
        hints.append(f"hint: the checkpoint has {got} {stack} layers, the config {want}")
  elif not config.scan_layers:
    hints.append("hint: the checkpoint is scanned (`layers`), the config is not (scan_layers=False)")
  return hints


def check_vocab_compatible(target_config: ModelConfig, draft_config: ModelConfig) -> None:
  """Speculative decoding compares p and q over the same ids: the vocabularies must agree."""
  if target_config.vocab_size != draft_config.vocab_size:
    raise CheckpointError(
        f"target and draft vocabularies differ: target vocab_size={target_config.vocab_size}, "
        f"draft vocab_size={draft_config.vocab_size}; speculative decoding needs one vocabulary")


def _layer_indices(flat: Mapping[str, Any], stack: str) -> list[int]:
  found = set()
  for path in flat:
    parts = path.split("/")
    if len(parts) > 1 and parts[0] == stack and (m := _LAYER_RE.match(parts[1])):
      found.add(int(m.group(1)))
  return sorted(found)


def stack_layers(flat: Mapping[str, Any], stacks: Iterable[str] = ("encoder", "decoder")) -> dict[str, Any]:
  """`{stack}/layers_{i}/...` -> `{stack}/layers/...` stacked on a new leading axis."""
  out = dict(flat)
  for stack in stacks:
    idx = _layer_indices(flat, stack)
    if not idx:
      continue
    if idx != list(range(len(idx))):
      raise CheckpointError(f"{stack} layers are not contiguous: found layers {idx}")
    subs = sorted({p.split("/", 2)[2] for p in flat if p.startswith(f"{stack}/layers_")})
    for sub in subs:
      leaves = []
      for i in idx:
        key = f"{stack}/layers_{i}/{sub}"
        if key not in out:
          raise CheckpointError(f"missing array {T5X_PREFIX}{key} while stacking layers")
        leaves.append(np.asarray(out.pop(key)))
      out[f"{stack}/layers/{sub}"] = np.stack(leaves)
  return out


def unstack_layers(flat: Mapping[str, Any], stacks: Iterable[str] = ("encoder", "decoder")) -> dict[str, Any]:
  """`{stack}/layers/...` (leading layer axis) -> `{stack}/layers_{i}/...`."""
  out = dict(flat)
  for stack in stacks:
    prefix = f"{stack}/layers/"
    for path in [p for p in flat if p.startswith(prefix)]:
      stacked = np.asarray(out.pop(path))
      sub = path[len(prefix):]
      for i in range(stacked.shape[0]):
        out[f"{stack}/layers_{i}/{sub}"] = stacked[i]
  return out


def is_scanned(flat: Mapping[str, Any]) -> bool:
  return any(p.startswith(("encoder/layers/", "decoder/layers/")) for p in flat)


def to_layout(flat: Mapping[str, Any], scan_layers: bool) -> dict[str, Any]:
  """Converts a flat tree to the scanned or per-layer layout, whichever it is now."""
  if scan_layers and not is_scanned(flat):
    return stack_layers(flat)
  if not scan_layers and is_scanned(flat):
    return unstack_layers(flat)
  return dict(flat)


def infer_config(flat: Mapping[str, Any], **overrides: Any) -> ModelConfig:
  """Reads the model config off the array shapes (T5X checkpoints do not store one).

  Only fields that shapes determine are inferred; the rest keep ModelConfig's T5 v1.1 defaults
  unless given in `overrides`.
  """
  shapes = {p: tuple(np.shape(v)) for p, v in flat.items()}
  if "token_embedder/embedding" not in shapes or "decoder/relpos_bias/rel_embedding" not in shapes:
    raise CheckpointError("cannot infer a model config: the tree has no token_embedder/embedding "
                          "or decoder/relpos_bias/rel_embedding (is this a T5 v1.1 tree?)")
  scanned = is_scanned(flat)
  v, e = shapes["token_embedder/embedding"]
  h, buckets = shapes["decoder/relpos_bias/rel_embedding"]
  def count(stack):
    if scanned:
      s = shapes.get(f"{stack}/layers/mlp/wo/kernel")
      return s[0] if s else 0
    return len(_layer_indices(flat, stack))
  wo = "decoder/layers/mlp/wo/kernel" if scanned else "decoder/layers_0/mlp/wo/kernel"
  q = wo.replace("mlp/wo", "self_attention/query")
  if wo not in shapes or q not in shapes:
    raise CheckpointError(f"cannot infer a model config: {T5X_PREFIX}{wo} or {T5X_PREFIX}{q} missing")
  m = shapes[wo][-2]
  inner = shapes[q][-1]
  if inner % h:
    raise CheckpointError(f"attention width {inner} is not a multiple of the {h} relpos heads")
  kind = "t5" if "encoder/relpos_bias/rel_embedding" in shapes else "decoder"
  fields = dict(kind=kind, vocab_size=v, emb_dim=e, num_heads=h, head_dim=inner // h, mlp_dim=m,
                num_encoder_layers=count("encoder"), num_decoder_layers=count("decoder"),
                relative_attention_num_buckets=buckets, scan_layers=scanned)
  fields.update(overrides)
  return ModelConfig(**fields)
