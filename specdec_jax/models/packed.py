"""Weights packed once for the CPU matmul kernel, and the model that computes with them.

Why (DESIGN.md, "Machine facts"; `specdec_jax.kernels`): on CPU, XLA's dot re-reads each weight
at half speed or worse from two rows on, so verifying gamma + 1 tokens cost 2-3x one token. The
kernel streams each weight once for any number of rows, but it needs the weights in its own layout
(panels [ceil(F / 16), D, 16]). That layout is a compute layout only:

- `pack(model, params)` returns `(PackedModel, packed_params)`: the same seam (`prefill`, `extend`,
  `forward`, `start_tokens`, same signatures), over a tree where every projection a decode step
  multiplies (decoder attention and MLP, the output head) holds `kernel_panels` instead of
  `kernel`. Everything else (embeddings, norms, relative position tables, the encoder, the
  cross-attention keys/values computed once per request) is the same array, not a copy.
- `unpack(packed_model, packed_params)` gives the T5X-layout tree back.
- Checkpoints, training and sharding see only unpacked trees: a packed tree has no logical-axis
  metadata (`PackedModel.logical_axes` raises) and the kernel has no gradient.
- `for_backend(model, params, matmul)` is what a runner calls after loading: 'auto' packs on a
  single-device CPU run and keeps XLA's dot elsewhere; 'xla' never packs; 'kernel' always packs.
  On a mesh (more than one device) the models keep XLA's dot: the kernel is a per-device CPU op and
  the sharded programs partition XLA's dots themselves; 'kernel' with a mesh is an error.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
from absl import logging

from specdec_jax.kernels import build
from specdec_jax.kernels import matmul as kmatmul
from specdec_jax.models.model import Model
from specdec_jax.models.transformer import Transformer

Params = Any
MATMULS = ("auto", "xla", "kernel")
PACKED_NAME = "kernel_panels"


@dataclasses.dataclass(frozen=True)
class PackedModel(Model):
  """`Model` over packed params (see the module docstring); build it with `pack`."""

  @property
  def module(self) -> Transformer:
    return Transformer(self.config, packed=True)

  def logical_axes(self) -> Params:
    raise ValueError("packed params are a single-device CPU compute layout with no sharding; "
                     "shard the unpacked model (specdec_jax.models.packed.unpack) instead")

  def unpacked(self) -> Model:
    return Model(self.config, self.axis_rules)


def is_packed(model) -> bool:
  return isinstance(model, PackedModel)


def _packed_shapes(model: PackedModel) -> Params:
  return jax.eval_shape(model.init, jax.random.key(0))


def _rebuild(template: Params, tree: Params, convert, path=()) -> Params:
  """`template`'s structure filled from `tree`: `convert(tree_dict, name, shape, path)` per leaf."""
  out = {}
  for name, sub in template.items():
    here = path + (name,)
    if isinstance(sub, dict):
      if name not in tree:
        raise ValueError(f"params have no {'/'.join(here)}: they are not this model's tree")
      out[name] = _rebuild(sub, tree[name], convert, here)
    else:
      out[name] = convert(tree, name, sub, here)
  return out


def pack(model: Model, params: Params) -> tuple[PackedModel, Params]:
  """(PackedModel, packed params) from a model and its T5X-layout params (float32 panels)."""
  if is_packed(model):
    raise ValueError("pack: the model is already a PackedModel")
  packed_model = PackedModel(model.config, model.axis_rules)
  template = _packed_shapes(packed_model)

  def convert(tree, name, shape, here):
    if name == PACKED_NAME:
      if "kernel" not in tree:
        raise ValueError(f"pack: params have no {'/'.join(here[:-1] + ('kernel',))}")
      panels = kmatmul.pack_panels(tree["kernel"])
      if panels.shape != shape.shape:
        raise ValueError(f"pack: {'/'.join(here)} packs to {panels.shape}, the model expects "
                         f"{shape.shape}")
      return panels
    if name not in tree:
      raise ValueError(f"pack: params have no {'/'.join(here)}")
    return tree[name]

  return packed_model, jax.jit(lambda p: _rebuild(template, p, convert))(params)


def unpack(model: PackedModel, params: Params) -> tuple[Model, Params]:
  """The inverse of `pack`: the T5X-layout model and params."""
  if not is_packed(model):
    raise ValueError("unpack: the model is not a PackedModel")
  base = model.unpacked()
  template = base.param_shapes()

  def convert(tree, name, shape, here):
    if name == "kernel" and PACKED_NAME in tree:
      return kmatmul.unpack_panels(tree[PACKED_NAME], shape.shape[-1])
    return tree[name]

  return base, jax.jit(lambda p: _rebuild(template, p, convert))(params)


def kernel_available() -> bool:
  """True on a CPU backend where the kernel library builds and loads (logs once if it does not)."""
  return jax.default_backend() == "cpu" and build.load()


def resolve_matmul(matmul: str, mesh: Optional[jax.sharding.Mesh] = None) -> str:
  """'xla' or 'kernel' for a config value (see the module docstring)."""
  if matmul not in MATMULS:
    raise ValueError(f"matmul must be one of {MATMULS}, got {matmul!r}")
  on_mesh = mesh is not None and mesh.size > 1
  if matmul == "kernel":
    if jax.default_backend() != "cpu":
      raise ValueError(f"matmul='kernel' is a CPU kernel; the backend is {jax.default_backend()!r}"
                       " (use 'auto' or 'xla')")
    if on_mesh:
      raise ValueError("matmul='kernel' runs on one device; on a mesh use 'auto' or 'xla' "
                       "(XLA's dot, partitioned with the model)")
    return "kernel"
  if matmul == "auto" and not on_mesh and kernel_available():
    return "kernel"
  return "xla"


def for_backend(model: Model, params: Params, matmul: str = "auto",
                mesh: Optional[jax.sharding.Mesh] = None) -> tuple[Model, Params]:
  """(model, params) to decode with: packed for the kernel, or unchanged for XLA's dot.

  Call once after loading (packing reads every projection once: ~0.1 s for the zoo target).
  """
  if is_packed(model):
    return model, params
  if resolve_matmul(matmul, mesh) == "kernel":
    if not build.load():  # 'kernel' asked for explicitly: the packed tree still computes (XLA)
      logging.warning("matmul='kernel' without a kernel library: packed weights use XLA's dot")
    return pack(model, params)
  return model, params
