"""Weights packed once for the CPU matmul kernel, and the model that computes with them.

Why (DESIGN.md, "Machine facts"; `specdec_jax.kernels`): on CPU, XLA's dot re-reads each weight
at half speed or worse from two rows on, so verifying gamma + 1 tokens cost 2-3x one token. The
kernel streams each weight once for any number of rows, but it needs the weights in its own layout
(panels [ceil(F / 16), D, 16]). That layout is a compute layout only:

- `pack(model, params, matmul)` returns `(PackedModel, packed_params)`: the same seam (`prefill`,
  `extend`, `forward`, `start_tokens`, same signatures), over a tree where every projection a
  decode step multiplies (decoder attention and MLP, the output head) holds `kernel_panels`.
  "hybrid" (the default) keeps `kernel` beside the panels: XLA's matrix-vector product for one row
  of a large matrix (an output head over the vocabulary: faster than the kernel there, see
  `layers.Dense`) and for GEMMs past 64 rows, the kernel for the rest (verification blocks, one
  row of a small matrix); the decode projections then take twice their memory. "kernel" keeps
  the panels only. Projections that read one input are fused into one matrix (`FUSED`: a
  self-attention's `qkv`, an MLP's `wi`; `layers.FUSED_PROJECTIONS` says why), built here from
  the checkpoint's separate matrices ("hybrid"'s `kernel` of one is their concatenation, a
  copy) and split again by `unpack`. Everything else (embeddings,
  norms, relative position tables, the encoder, the cross-attention keys/values) is the same
  array, not a copy.
- Panels are bfloat16 where the weights are bfloat16 values (every checkpoint stored in bfloat16,
  the zoo's and T5X's, loaded as float32; checked per matrix, `kmatmul.is_bfloat16_exact`), else
  float32: the kernel widens bfloat16 exactly and multiplies in float32 in the same order, so the
  logits are bit-for-bit those of float32 panels from half the bytes (on the zoo target a decode
  step reads 20 MB instead of 40; a step is memory-bound on CPU). `panels='float32'` keeps float32.
- `panels='int8'` (drafts only: the run's draft_panels setting) quantizes every packed projection to
  int8 panels with per-column scales (`kmatmul.pack_int8_panels`): a different, cheaper draft,
  not the checkpoint's distribution; exactness does not depend on it (the verifier uses the q the
  draft drew from). "hybrid" then keeps the DEQUANTIZED matrix as `kernel`, so XLA's dot computes
  the same draft. Never a target's layout (`for_backend` refuses it for one).
- A tied head (the embedding table as the output projection) becomes an untied `logits_dense`
  first (`_untied`), for targets and drafts alike: the head is a decode step's largest matrix,
  and as a projection it streams through the kernel (or XLA's one-row product) like the rest,
  and packs into int8 panels in an int8 or q4 draft.
- `panels='q4'` (drafts only, the same way) packs them into q4 panels (`kmatmul.pack_q4_panels`:
  Q4_1's quantization, 4-bit codes in blocks of 32 inputs with a float16 scale and minimum): 5 bits
  a weight against int8's 8, and for a checkpoint converted from Q4_1 (SmolLM2-135M's
  projections) the target's own weights come back. The output head stays int8 (`_lossy_layout`).
- `unpack(packed_model, packed_params)` gives the T5X-layout tree back (int8, q4: dequantized).
- A feature-level draft (`models.feature_draft.FeatureDraft`) packs the same way: the same
  draft with `matmul` set, its block, fusion, input projection and head in panels.
- Checkpoints, training and sharding see only unpacked trees: a packed tree has no logical-axis
  metadata (`PackedModel.logical_axes` raises) and the kernel has no gradient.
- `for_backend(model, params, matmul)` is what a runner calls after loading: 'auto' packs
  ("hybrid") on a single-device CPU run and keeps XLA's dot elsewhere; 'xla' never packs;
  'kernel' and 'hybrid' always pack. On a mesh (more than one device) the models keep XLA's dot:
  the kernel is a per-device CPU op and the sharded programs partition XLA's dots themselves;
  'kernel'/'hybrid' with a mesh is an error.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from specdec_jax.kernels import build
from specdec_jax.kernels import matmul as kmatmul
from specdec_jax.models.feature_draft import FeatureDraft
from specdec_jax.models.model import Model
from specdec_jax.models.transformer import Transformer

Params = Any
MATMULS = ("auto", "xla", "kernel", "hybrid")
PACKED_MATMULS = ("kernel", "hybrid")
PACKED_NAME = "kernel_panels"
PANELS = ("auto", "float32", "int8", "q4")
LOSSY_PANELS = ("int8", "q4")  # a draft's layouts only


@dataclasses.dataclass(frozen=True)
class PackedModel(Model):
  """`Model` over packed params (see the module docstring); build it with `pack`.

  `matmul`: "hybrid" or "kernel" (`layers.Dense`)."""

  matmul: str = "hybrid"

  def __post_init__(self):
    if self.matmul not in PACKED_MATMULS:
      raise ValueError(f"PackedModel.matmul must be one of {PACKED_MATMULS}, got {self.matmul!r}")

  @property
  def module(self) -> Transformer:
    return Transformer(self.config, matmul=self.matmul, head_ids=self.head_ids)

  def logical_axes(self) -> Params:
    raise ValueError("packed params are a single-device CPU compute layout with no sharding; "
                     "shard the unpacked model (specdec_jax.models.packed.unpack) instead")

  def unpacked(self) -> Model:
    """The T5X-layout model these params came from."""
    return Model(**_model_fields(self))


def _model_fields(model: Model) -> dict:
  """`Model`'s own fields (config, axis rules, whatever it gains), to carry across the variants."""
  return {f.name: getattr(model, f.name) for f in dataclasses.fields(Model)}


def is_packed(model) -> bool:
  return isinstance(model, PackedModel) or (isinstance(model, FeatureDraft)
                                            and model.matmul != "xla")


def _packed_shapes(model: PackedModel) -> Params:
  return jax.eval_shape(model.init, jax.random.key(0))


# Per leaf, so the leaves that are not packed stay the very same arrays (no copy).
_pack_jit = jax.jit(kmatmul.pack_panels, static_argnums=1)
_unpack_jit = jax.jit(kmatmul.unpack_panels, static_argnums=1)
_pack_lossy_jit = {"int8": jax.jit(kmatmul.pack_int8_panels),
                   "q4": jax.jit(kmatmul.pack_q4_panels)}


def _lossy_layout(panels: str, here: tuple) -> str | None:
  """A leaf's lossy layout under `panels` (None: lossless). 'q4' keeps the output head
  (`logits_dense`) in int8: SmolLM2's GGUF stores its head as 8-bit (Q8_0), and a 4-bit head
  cost its q4 self-draft acceptance and time on held-out HumanEval problems (DESIGN.md, "q4
  panels"); the projections of a layer are where the bytes are."""
  if panels not in LOSSY_PANELS:
    return None
  return "int8" if panels == "q4" and "logits_dense" in here else panels


def _lossy_rows(panels: str, d: int) -> int:
  """Rows of a lossy panel for D inputs (`kmatmul`: int8 adds its scales, q4 is 32-input blocks)."""
  return d + kmatmul.SCALE_ROWS if panels == "int8" else d // kmatmul.Q4_BLOCK * kmatmul.Q4_ROWS


def _rebuild(template: Params, tree: Params, convert, path=()) -> Params:
  """`template`'s structure filled from `tree`: `convert(tree_dict, name, shape, path)` per leaf.
  A fused projection of the template (`FUSED`) missing from `tree` is its parts concatenated."""
  out = {}
  for name, sub in template.items():
    here = path + (name,)
    if isinstance(sub, dict):
      if name not in tree and name in FUSED and all(part in tree for part in FUSED[name]):
        tree = {**tree, name: _fuse([tree[part] for part in FUSED[name]])}
      if name not in tree:
        raise ValueError(f"params have no {'/'.join(here)}: they are not this model's tree")
      out[name] = _rebuild(sub, tree[name], convert, here)
    else:
      out[name] = convert(tree, name, sub, here)
  return out


# The packed layouts' fused projections (`layers.FUSED_PROJECTIONS`): name -> its parts, whose
# output columns it holds in this order.
FUSED = {"qkv": ("query", "key", "value"), "wi": ("wi_0", "wi_1")}


def _fuse(parts: list[Params]) -> Params:
  """One Dense's params from several of the same input: kernels (and biases) side by side."""
  return {name: jnp.concatenate([p[name] for p in parts], axis=-1) for name in parts[0]}


def _unfuse(template: Params, tree: Params) -> Params:
  """`tree` with each fused projection split back into the parts `template` (a T5X-layout
  tree's shapes) names; the inverse of `_fuse`."""
  out = {}
  for name, sub in tree.items():
    parts = FUSED.get(name)
    if parts and isinstance(sub, dict) and all(part in template for part in parts):
      ends = np.cumsum([template[part]["kernel"].shape[-1] for part in parts])
      for leaf, array in sub.items():  # past the last end: the panels' zero columns
        for part, piece in zip(parts, jnp.split(array, ends, axis=-1)):
          out.setdefault(part, {})[leaf] = piece
    elif isinstance(sub, dict):
      out[name] = _unfuse(template.get(name, {}), sub)
    else:
      out[name] = sub
  return out


def pack(model: Model, params: Params, matmul: str = "hybrid", panels: str = "auto"
         ) -> tuple[PackedModel, Params]:
  """(PackedModel, packed params) from a model and its T5X-layout params; a `FeatureDraft` gives
  the same draft with `matmul` set. `panels`: 'auto' packs a matrix whose entries are all
  bfloat16 values into bfloat16 panels (lossless, half the bytes), others into float32;
  'float32' packs every matrix into float32 panels; 'int8' and 'q4' are a draft's lossy layouts
  (the module docstring)."""
  if panels not in PANELS:
    raise ValueError(f"pack: panels must be one of {PANELS}, got {panels!r}")
  if is_packed(model):
    raise ValueError("pack: the model is already a PackedModel")
  if not isinstance(model, FeatureDraft) and model.config.tie_embeddings:
    model, params = _untied(model, params)
  if isinstance(model, FeatureDraft):
    if matmul not in PACKED_MATMULS:
      raise ValueError(f"pack: matmul must be one of {PACKED_MATMULS}, got {matmul!r}")
    packed_model = dataclasses.replace(model, matmul=matmul)
  else:
    packed_model = PackedModel(**_model_fields(model), matmul=matmul)
  template = _packed_shapes(packed_model)

  def template_of(here):
    node = template
    for part in here[:-1]:
      node = node[part]
    return node

  def convert(tree, name, shape, here):
    layout = _lossy_layout(panels, here)
    if name == PACKED_NAME:
      if "kernel" not in tree:
        raise ValueError(f"pack: params have no {'/'.join(here[:-1] + ('kernel',))}")
      kernel = tree["kernel"]
      if layout:
        packed_w = _pack_lossy_jit[layout](kernel)
        expected = shape.shape[:-2] + (_lossy_rows(layout, shape.shape[-2]), shape.shape[-1])
      else:
        exact = panels == "auto" and kmatmul.is_bfloat16_exact(kernel)
        packed_w = _pack_jit(kernel, jnp.bfloat16 if exact else jnp.float32)
        expected = shape.shape
      if packed_w.shape != expected:
        raise ValueError(f"pack: {'/'.join(here)} packs to {packed_w.shape}, the model expects "
                         f"{expected}")
      return packed_w
    if name not in tree:
      raise ValueError(f"pack: params have no {'/'.join(here)}")
    if name == "kernel" and layout and PACKED_NAME in template_of(here):
      # "hybrid" with lossy panels: XLA's dot computes with what the panels hold
      return _unpack_jit(_pack_lossy_jit[layout](tree[name]), tree[name].shape[-1])
    return tree[name]

  return packed_model, _rebuild(template, params, convert)


def _untied(model: Model, params: Params) -> tuple[Model, Params]:
  """A tied model as an untied one whose `logits_dense` is the embedding's transpose (its rows of
  the restricted head's ids): the same function. Why: a tied head is the embedding read by XLA's
  float32 product, [T, D] x [V, D]^T, which re-reads the table from two rows on: SmolLM2-135M's
  113 MB head took 5.6 ms for one row and 10.7 for six (a verify of gamma 5), against 4.9 and
  5.5 for the kernel over float32 panels and 4.5 for XLA's one-row product over the [D, V]
  transpose (which "hybrid" takes for one row of a matrix this large); it was ~5 ms of the
  target's 6-token verify beyond its one-token step (unrecorded probe, 2026-12-08, AMD EPYC 2
  cores, interleaved medians of 5 rounds). For an int8 or q4 draft the head then packs into
  int8 panels with the rest (its int8 self-draft stepped in 13.7 ms against the target's 25.2
  while its head was the float32 table). The embedding stays, for the input; the head's panels
  and the float32 `kernel` "hybrid" keeps are copies (SmolLM2-135M: +226 MB of memory)."""
  table_VxD = params["token_embedder"]["embedding"]
  if model.head_ids is not None:
    table_VxD = jnp.take(table_VxD, jnp.asarray(model.head_ids, jnp.int32), axis=0)
  config = dataclasses.replace(model.config, tie_embeddings=False)
  decoder = {**params["decoder"], "logits_dense": {"kernel": jnp.asarray(table_VxD).T}}
  return (dataclasses.replace(model, config=config), {**params, "decoder": decoder})


def unpack(model: PackedModel, params: Params) -> tuple[Model, Params]:
  """The inverse of `pack`: the T5X-layout model and params."""
  if not is_packed(model):
    raise ValueError("unpack: the model is not a PackedModel")
  base = (dataclasses.replace(model, matmul="xla") if isinstance(model, FeatureDraft)
          else model.unpacked())
  template = base.param_shapes()

  def convert(tree, name, shape, here):
    leaf = tree[name]
    return leaf[..., :shape.shape[-1]] if name == "kernel" else leaf  # panels' zero columns off

  return base, _rebuild(template, _unfuse(template, _panels_as_kernels(params)), convert)


def _panels_as_kernels(tree: Params) -> Params:
  """Each packed Dense's params with a `kernel` [D, F'] and no panels: "hybrid"'s own kernel, or
  the panels unpacked to their full width F' (F rounded up to the panel width; `unpack` trims)."""
  out = {}
  for name, sub in tree.items():
    if isinstance(sub, dict):
      out[name] = _panels_as_kernels(sub)
    elif name == PACKED_NAME:
      if "kernel" not in tree:
        out["kernel"] = _unpack_jit(sub, sub.shape[-3] * kmatmul.PANEL)
    else:
      out[name] = sub
  return out


def kernel_available() -> bool:
  """True on a CPU backend where the kernel library builds and loads (logs once if it does not)."""
  return jax.default_backend() == "cpu" and build.load()


def resolve_matmul(matmul: str, mesh: Optional[jax.sharding.Mesh] = None) -> str:
  """'xla', 'kernel' or 'hybrid' for a config value (see the module docstring)."""
  if matmul not in MATMULS:
    raise ValueError(f"matmul must be one of {MATMULS}, got {matmul!r}")
  on_mesh = mesh is not None and mesh.size > 1
  if matmul in PACKED_MATMULS:
    if jax.default_backend() != "cpu":
      raise ValueError(f"matmul={matmul!r} uses a CPU kernel; the backend is "
                       f"{jax.default_backend()!r} (use 'auto' or 'xla')")
    if on_mesh:
      raise ValueError(f"matmul={matmul!r} runs on one device; on a mesh use 'auto' or 'xla' "
                       "(XLA's dot, partitioned with the model)")
    return matmul
  if matmul == "auto" and not on_mesh and kernel_available():
    return "hybrid"
  return "xla"


def for_backend(model: Model, params: Params, matmul: str = "auto",
                mesh: Optional[jax.sharding.Mesh] = None, panels: str = "auto",
                role: str = "target") -> tuple[Model, Params]:
  """(model, params) to decode with: packed for the kernel, or unchanged for XLA's dot.

  `panels`: see `pack`; 'int8' / 'q4' only with `role='draft'` (lossy: never a target's), and
  only where the model is packed (a CPU run on one device; elsewhere it is an error, not a
  silent float32 draft).

  A `FeatureDraft` packs like a model; anything else that is not a `Model` (the n-gram and
  prompt-lookup drafts) comes back unchanged.

  Call once after loading (packing reads every projection once: 0.8-2.5 s for the zoo target on
  the 2-core machine, the first call compiling the packing).
  """
  if panels not in PANELS:
    raise ValueError(f"panels must be one of {PANELS}, got {panels!r}")
  if panels in LOSSY_PANELS and role != "draft":
    raise ValueError(f"{panels} panels are lossy: a draft's layout (role='draft'), never a "
                     "target's")
  if is_packed(model) or not isinstance(model, (Model, FeatureDraft)):  # model-free drafts
    return model, params
  chosen = resolve_matmul(matmul, mesh)
  if chosen in PACKED_MATMULS:
    if not build.load():  # asked for explicitly: the packed tree still computes (XLA's dot)
      logging.warning("matmul=%r without a kernel library: packed weights use XLA's dot", chosen)
    return pack(model, params, chosen, panels)
  if panels in LOSSY_PANELS:
    raise ValueError(f"{panels} draft panels need the packed CPU kernel (one CPU device, matmul "
                     f"'auto', 'kernel' or 'hybrid'); this run's matmul resolves to {chosen!r}")
  return model, params
