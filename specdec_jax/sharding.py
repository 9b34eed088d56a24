"""Mesh, logical-axis rules and placement: the target model-parallel, the draft on fewer chips.

Why one mesh with a split model axis (DESIGN.md, "Sharding"): one `jit` cannot span two disjoint
device sets, and the speculative `while_loop` must stay one on-device program. So the mesh has
axes (data, model_outer, model_inner); the target shards its model dimension (heads, mlp, vocab,
joined_kv) over both model axes, the draft over `model_inner` only and is replicated over
`model_outer`. The draft's collectives then span `model_inner` chips, not all of them (Chen et al.
saw a 7B draft slow down across 16 chips).

Each `Model` carries its own logical-axis rules (`Model.axis_rules`), applied inside its
`prefill`/`extend`, because the target's and the draft's `with_logical_constraint` calls resolve
the same names (`heads`, `vocab`, ...) to different mesh axes inside the same traced program. The
rules are part of the (static, hashable) model, so they are part of every jit cache key.

Everything is checked before anything is compiled: a mesh axis that does not divide a dimension it
shards raises a ValueError naming the axis, the dimension and both sizes.

Decoding on such a mesh is a `decoding.decoder.Decoder` with `mesh=...` (prefill, then the loop
over a donated state) over models placed here:

  placed = shard_models(target, target_params, draft, draft_params,
                        mesh_config=MeshConfig(data=1, model_outer=4, model_inner=2))
  decoder = Decoder(placed.target, placed.draft, Chain(4), sampling, max_decode_len=32,
                    mesh=placed.mesh)
  result = decoder.generate(Params(placed.target_params, placed.draft_params), inputs_BxP, rng)

The run pipeline (`python -m specdec_jax.run` with a gin/mesh/*.gin module) makes the mesh once
and places the target and every draft with `place_models`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, Optional, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from specdec_jax.models import gqa
from specdec_jax.models.feature_draft import FeatureDraft
from specdec_jax.models.model import Model

DATA, OUTER, INNER = "data", "model_outer", "model_inner"
MESH_AXES = (DATA, OUTER, INNER)
TARGET_MODEL_AXES = (OUTER, INNER)
DRAFT_MODEL_AXES = (INNER,)

Rules = tuple[tuple[str, Any], ...]


# ---- rules ----------------------------------------------------------------------------------------
def standard_rules(model_axes: Sequence[str] = TARGET_MODEL_AXES, data_axis: str = DATA) -> Rules:
  """t5x's `standard_logical_axis_rules()` (1-D activation and parameter partitioning).

  `model_axes` replaces t5x's single 'model' axis: the target passes (model_outer, model_inner),
  the draft (model_inner,), so the same logical names land on different mesh axes.
  """
  m = tuple(model_axes)
  m = None if not m else (m[0] if len(m) == 1 else m)
  return (("batch", data_axis), ("vocab", m), ("embed", None), ("mlp", m), ("heads", m),
          ("kv", None), ("joined_kv", m), ("relpos_buckets", None), ("abspos_buckets", None),
          ("length", None), ("layers", None), ("stack", None), ("mlp_activations", None))


def rules_to_hashable(rules) -> Rules:
  """Lists (gin, JSON) -> nested tuples, so the rules can sit in a frozen, hashable `Model`."""
  out = []
  for name, axes in rules:
    if isinstance(axes, list):
      axes = tuple(axes)
    out.append((str(name), axes))
  return tuple(out)


# ---- mesh -----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Mesh shape and which model axes each model uses (gin binds this; see gin/mesh/).

  data * model_outer * model_inner must equal the device count; one of them may be -1 (the rest).
  The target shards over `target_model_axes`, the draft over `draft_model_axes`. `*_rules`
  override the t5x standard rules built from those axes.
  """

  data: int = 1
  model_outer: int = 1
  model_inner: int = -1
  target_model_axes: tuple[str, ...] = TARGET_MODEL_AXES
  draft_model_axes: tuple[str, ...] = DRAFT_MODEL_AXES
  target_rules: Optional[Rules] = None
  draft_rules: Optional[Rules] = None
  # > 0: force this many host (CPU) devices; takes effect only before jax's first device use.
  num_cpu_devices: int = 0

  @property
  def shape(self) -> tuple[int, int, int]:
    return (self.data, self.model_outer, self.model_inner)

  def resolved_shape(self, num_devices: int) -> tuple[int, int, int]:
    shape = list(self.shape)
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
      raise ValueError(f"mesh shape {tuple(shape)} (axes {MESH_AXES}): sizes must be >= 1, "
                       "with at most one -1 (the rest of the devices)")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
      if num_devices % known:
        raise ValueError(f"mesh shape {tuple(shape)}: {known} does not divide the "
                         f"{num_devices} devices")
      shape[shape.index(-1)] = num_devices // known
    if math.prod(shape) != num_devices:
      raise ValueError(f"mesh shape {tuple(shape)} (axes {MESH_AXES}) has {math.prod(shape)} "
                       f"devices, but {num_devices} are available")
    return tuple(shape)

  def rules_for(self, which: str) -> Rules:
    if which == "target":
      return rules_to_hashable(self.target_rules or standard_rules(self.target_model_axes))
    if which == "draft":
      return rules_to_hashable(self.draft_rules or standard_rules(self.draft_model_axes))
    raise ValueError(f"which must be 'target' or 'draft', got {which!r}")


def force_cpu_devices(n: int) -> None:
  """`jax_num_cpu_devices = n` (the smoke job's 8 forced CPU devices) if not already in force.

  Works after `import jax` but only before the first device use, so entry points call it right
  after parsing their config; a conflicting count that is too late raises jax's RuntimeError.
  """
  if n <= 0 or jax.config.jax_num_cpu_devices == n:
    return
  try:
    jax.config.update("jax_num_cpu_devices", n)
  except RuntimeError as e:  # backends already up (e.g. XLA_FLAGS forced them): fine if n match
    have = len(jax.devices("cpu"))
    if have != n:
      raise RuntimeError(f"MeshConfig.num_cpu_devices={n}, but jax already started with {have} "
                         "CPU devices; set it before any jax operation") from e


def make_mesh(config: MeshConfig = MeshConfig(), devices: Optional[Sequence[Any]] = None) -> Mesh:
  """A classic (automatic axis types) `Mesh` over all global devices, axes (data, outer, inner).

  `jax.sharding.Mesh` rather than `jax.make_mesh`, which defaults to Explicit axis types in this
  jax. Devices are laid out in `jax.devices()` order, which groups each process's devices, so the
  data axis (the slowest) crosses hosts and the model axes stay within one.
  """
  if devices is None:
    force_cpu_devices(config.num_cpu_devices)
  devices = list(jax.devices() if devices is None else devices)
  shape = config.resolved_shape(len(devices))
  if devices[0].platform == "tpu":  # physical-topology-aware order (ICI rings per mesh axis)
    from jax.experimental import mesh_utils  # pylint: disable=import-outside-toplevel
    grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  else:
    grid = np.asarray(devices, dtype=object).reshape(shape)
  return Mesh(grid, MESH_AXES)


# ---- validation -----------------------------------------------------------------------------------
def _mesh_axes_of(rules: Rules, logical: str):
  for name, axes in rules:
    if name == logical:
      if axes is None:
        return ()
      return (axes,) if isinstance(axes, str) else tuple(axes)
  return ()


def is_sharded_model(draft) -> bool:
  """Whether `draft` has parameters laid out by logical axes (a `Model`, or a feature-level
  draft: the draft rules, fewer chips), not a model-free draft's tables (replicated)."""
  return isinstance(draft, (Model, FeatureDraft))


def _feature_dims(draft: FeatureDraft) -> list[tuple[str, int]]:
  """A feature-level draft's shardable sizes: its block's heads, MLP and width, the copied
  embedding's and head's vocabulary (a restricted head's K columns too: its kernel is [D, K])."""
  c = draft.config
  dims = [("heads", c.num_heads), ("mlp", c.mlp_dim), ("vocab", c.vocab_size),
          ("joined_kv", c.num_heads * c.head_dim), ("embed", c.emb_dim),
          ("embed", c.target_dim), ("kv", c.head_dim),
          ("relpos_buckets", c.relative_attention_num_buckets)]
  if draft.head_ids:
    dims.append(("vocab", len(draft.head_ids)))
  return list(dict.fromkeys(dims))


def _dims(model) -> list[tuple[str, int]]:
  """Every (logical name, size) a rule may shard. Grouped-query attention adds the key/value
  heads (the cache's `heads` and the k/v kernels' `joined_kv` are kv_heads wide): they split
  over the same model axes as the query heads, so those axes must divide the smaller count."""
  if isinstance(model, FeatureDraft):
    return _feature_dims(model)
  c = model.config
  # Order matters for the message: heads before joined_kv (heads | joined_kv).
  dims = [("heads", c.num_heads), ("heads", c.kv_heads), ("mlp", c.mlp_dim),
          ("vocab", c.vocab_size), ("joined_kv", c.num_heads * c.head_dim),
          ("joined_kv", c.kv_heads * c.head_dim), ("embed", c.emb_dim), ("kv", c.head_dim),
          ("relpos_buckets", c.relative_attention_num_buckets)]
  return list(dict.fromkeys(dims))  # MHA: each size once


def validate(mesh: Mesh, model: Model, rules: Rules, *, name: str = "model",
             batch_size: Optional[int] = None) -> None:
  """Raises ValueError if a mesh axis named by `rules` is missing or does not divide its dimension.

  Checked on shapes only (nothing is traced or compiled): every model dimension a rule shards,
  and the batch against the axes `batch` maps to.
  """
  for logical, _ in rules:
    for ax in _mesh_axes_of(rules, logical):
      if ax not in mesh.shape:
        raise ValueError(f"{name}: rule {logical!r} -> {ax!r} names a mesh axis that does not "
                         f"exist; mesh axes are {tuple(mesh.shape)}")
  dims = _dims(model)
  if batch_size is not None:
    dims.append(("batch", batch_size))
  for logical, size in dims:
    axes = _mesh_axes_of(rules, logical)
    n = math.prod(mesh.shape[a] for a in axes)
    if n > 1 and size % n:
      what = "batch size" if logical == "batch" else f"{name} dimension '{logical}'"
      sizes = " x ".join(f"{a}={mesh.shape[a]}" for a in axes)
      kv_heads = getattr(model.config, "kv_heads", model.config.num_heads)
      gqa = (logical in ("heads", "joined_kv") and kv_heads != model.config.num_heads
             and size in (kv_heads, kv_heads * model.config.head_dim))
      raise ValueError(
          f"mesh axis {axes[0] if len(axes) == 1 else axes} of size {n} ({sizes}) does not divide "
          f"the {what} = {size}"
          f"{' (the key/value heads of grouped-query attention)' if gqa else ''}; choose a mesh "
          f"whose {'/'.join(axes)} size divides {size}")


# ---- placement ------------------------------------------------------------------------------------
def with_rules(model, rules: Rules):
  """`model` (a `Model` or a `FeatureDraft`) with `rules` attached as its `axis_rules`."""
  return dataclasses.replace(model, axis_rules=rules_to_hashable(rules))


def param_shardings(model: Model, mesh: Mesh, rules: Optional[Rules] = None):
  """NamedSharding tree of the model's params from `logical_axes()` and the rules."""
  rules = model.axis_rules if rules is None else rules
  return nn.logical_to_mesh_sharding(model.logical_axes(), mesh, list(rules))


def place(tree, shardings):
  """Puts a pytree of host or device arrays onto `shardings`; works with several processes.

  Every process passes the same full values (e.g. the same checkpoint); each keeps only the
  shards of its own devices (`make_array_from_callback`), so nothing spans a foreign device.
  """
  def one(x, s):
    if isinstance(x, jax.Array) and x.sharding == s:
      return x
    if isinstance(x, jax.Array) and jax.process_count() == 1:
      return jax.device_put(x, s)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, s, lambda idx: host[idx])
  return jax.tree.map(one, tree, shardings)


def init_params(model: Model, rng: jax.Array, mesh: Mesh):
  """Random params created directly in their shards (no full copy on any one device)."""
  shardings = param_shardings(model, mesh)
  return jax.jit(model.init, out_shardings=shardings)(rng)


def batch_sharding(mesh: Mesh, rules: Rules, ndim: int = 2) -> NamedSharding:
  """Sharding of a [B, ...] array: batch over the axes `batch` maps to, the rest replicated."""
  axes = _mesh_axes_of(rules, "batch")
  first = None if not axes else (axes[0] if len(axes) == 1 else axes)
  return NamedSharding(mesh, P(first, *([None] * (ndim - 1))))


def kv_replication(mesh: Mesh, model: Model, rules: Rules) -> int:
  """How many copies of each key/value head a grouped-query model needs on this mesh: the
  chips its `heads` split over, divided by what its kv heads can cover (`models.gqa`)."""
  chips = math.prod(mesh.shape[a] for a in _mesh_axes_of(rules, "heads"))
  return gqa.replication_for(model.config, chips)


def fit_kv_heads(mesh: Mesh, model: Model, params, rules: Rules):
  """(model, params) with its key/value heads replicated where the mesh splits its heads over
  more chips than it has kv heads (Llama-3.1 70B's 8 over 16 chips: each kv head on 2); the
  same model and params otherwise (a feature-level draft's block has no grouped heads). Exact:
  the logits are unchanged (`models.gqa`)."""
  if not isinstance(model, Model):
    return model, params
  r = kv_replication(mesh, model, rules)
  if r == 1:
    return model, params
  config, params = gqa.replicate_kv_heads(model.config, params, r)
  return dataclasses.replace(model, config=config), params


def data_parallel_size(mesh: Mesh, rules: Rules) -> int:
  """How many ways the batch is split: the product of the mesh axes `batch` maps to."""
  return math.prod(mesh.shape[a] for a in _mesh_axes_of(rules, "batch"))


def shard_batch(x, mesh: Mesh, rules: Rules, *, process_local: bool = False) -> jax.Array:
  """Global [B, ...] array sharded over the data axis.

  process_local=False: `x` is the whole batch (same on every process).
  process_local=True: `x` holds only this process's rows (see `distributed.local_rows`).
  """
  s = batch_sharding(mesh, rules, np.ndim(x))
  if process_local:
    return jax.make_array_from_process_local_data(s, np.asarray(x))
  return place(x, s)


def replicate_key(mesh: Mesh, rng: Optional[jax.Array]) -> jax.Array:
  """A PRNG key (default key(0)) replicated on every mesh device; needed with several processes,
  where a key on one local device cannot feed a program that spans the others."""
  rng = jax.random.key(0) if rng is None else rng
  data = place(np.asarray(jax.random.key_data(rng)), NamedSharding(mesh, P()))
  return jax.random.wrap_key_data(data, impl=jax.random.key_impl(rng))


def per_device_bytes(tree) -> dict[Any, int]:
  """Bytes each device holds for a pytree of arrays, measured from `addressable_shards`."""
  out: dict[Any, int] = {}
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      out[shard.device] = out.get(shard.device, 0) + shard.data.nbytes
  return out


def shard_model(model: Model, params, mesh: Mesh, rules: Rules, *, name: str = "model",
                batch_size: Optional[int] = None):
  """(model with `rules` attached, params placed on `mesh`), validated first; key/value heads
  replicated where the mesh needs it (`fit_kv_heads`)."""
  model, params = fit_kv_heads(mesh, with_rules(model, rules), params, rules)
  validate(mesh, model, model.axis_rules, name=name, batch_size=batch_size)
  return model, place(params, param_shardings(model, mesh))


def place_models(mesh: Mesh, mesh_config: MeshConfig, target: Model, target_params,
                 drafts: dict, *, batch_size: Optional[int] = None):
  """(target, params, drafts) with rules attached and params placed on `mesh`.

  `drafts` maps a key to (Model or FeatureDraft, params) or to (model-free draft, tables): model
  and feature-level drafts get the draft rules (fewer chips); a model-free draft's tables are
  replicated on every device (with several processes a table on one local device could not
  feed the global program). Everything is validated, on shapes only, before anything is placed: a bad mesh fails before any transfer
  or compile. `params` may be host (numpy) or device arrays; with several processes each must
  pass the same.
  """
  t_rules, d_rules = mesh_config.rules_for("target"), mesh_config.rules_for("draft")
  target, target_params = fit_kv_heads(mesh, target, target_params, t_rules)
  drafts = {k: fit_kv_heads(mesh, d, dp, d_rules) if is_sharded_model(d) else (d, dp)
            for k, (d, dp) in drafts.items()}
  validate(mesh, target, t_rules, name="target", batch_size=batch_size)
  for k, (d, _) in drafts.items():
    if is_sharded_model(d):
      validate(mesh, d, d_rules, name=f"draft {k}", batch_size=batch_size)
  target, target_params = shard_model(target, target_params, mesh, t_rules, name="target")
  replicated = NamedSharding(mesh, P())
  out = {}
  for k, (d, dp) in drafts.items():
    if is_sharded_model(d):
      out[k] = shard_model(d, dp, mesh, d_rules, name="draft")
    else:
      out[k] = (d, place(dp, jax.tree.map(lambda _: replicated, dp)))
  return target, target_params, out


class Placed(NamedTuple):
  """A target (and optionally a draft) with rules attached and params placed on one mesh."""

  mesh: Mesh
  target: Model
  target_params: Any
  draft: Any = None
  draft_params: Any = None


def shard_models(target: Model, target_params, draft=None, draft_params=None,
                 mesh: Optional[Mesh] = None, *, mesh_config: MeshConfig = MeshConfig(),
                 batch_size: Optional[int] = None) -> Placed:
  """`place_models` for one target and (optionally) one draft, on `mesh` (made from
  `mesh_config` when not given)."""
  mesh = make_mesh(mesh_config) if mesh is None else mesh
  drafts = {} if draft is None else {"draft": (draft, draft_params)}
  target, tp, drafts = place_models(mesh, mesh_config, target, target_params, drafts,
                                    batch_size=batch_size)
  return Placed(mesh, target, tp, *drafts.get("draft", (None, None)))
