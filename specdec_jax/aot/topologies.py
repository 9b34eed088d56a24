"""TPU topologies by the names Cloud TPU sells them under, and the chips' published figures.

Why: `jax.experimental.topologies.get_topology_desc` wants the physical description of a slice
(platform, "v4:2x2x4", chip config, chips per host, wrap-around links); a researcher thinks in
"v4-32". This module maps one to the other (the same facts MaxText's accelerator map records) and
returns the slice's devices, which a `jax.sharding.Mesh` takes like any others: with libtpu
installed the TPU compiler then compiles for that slice on a CPU-only host.

A v4-N slice has N / 2 chips (N counts TensorCores; a v4 chip is one "megacore" device of
two cores), a v5e-N slice has N chips. A name such as "v4:2x2x1" is accepted as is.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any

GiB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """Published per-chip figures (Cloud TPU documentation), the roofline's inputs."""
  name: str
  peak_flops_bf16: float     # FLOP/s
  hbm_bytes: int             # HBM per chip as sold (the compiler reserves part of it)
  hbm_bytes_per_s: float     # HBM bandwidth
  ici_links: int


CHIPS = {
    "v4": Chip("TPU v4", 275e12, 32 * GiB, 1.2e12, 6),
    "v5e": Chip("TPU v5e", 197e12, 16 * GiB, 0.82e12, 4),
}
# user-facing generation prefix -> (topology prefix, chip config, chips per host, TensorCores
# per chip in the user-facing count)
_GENERATIONS = {
    "v4": ("v4", "megacore", (2, 2, 1), 2),
    "v5e": ("v5e", "default", (2, 2, 1), 1),
}
# v4 slice shapes (3-D torus), by chip count.
_CUBE_SHAPES = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4),
                128: (4, 4, 8), 192: (4, 4, 12), 256: (4, 8, 8), 512: (8, 8, 8),
                768: (8, 8, 12), 1024: (8, 8, 16), 2048: (8, 16, 16)}
# v5e slices (2-D), by chip count; a v5e-8 is one host of 8 chips.
_V5E_SHAPES = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8),
               128: (8, 16), 256: (16, 16)}


@dataclasses.dataclass(frozen=True)
class Topology:
  """One slice: what `get_topology_desc` needs, and its chip."""
  name: str                      # as the user gave it, e.g. "v4-32"
  topology_name: str             # e.g. "v4:2x2x4"
  chip_config_name: str
  chips_per_host_bounds: tuple[int, int, int]
  wrap: tuple[bool, bool, bool]
  num_chips: int
  chip: Chip

  @property
  def num_hosts(self) -> int:
    return max(1, self.num_chips // math.prod(self.chips_per_host_bounds))


def _known_names() -> list[str]:
  v4 = [f"v4-{2 * n}" for n in _CUBE_SHAPES]
  v5e = [f"v5e-{n}" for n in _V5E_SHAPES]
  return v4 + v5e + ["v4:AxBxC", "v5e:AxB"]


def parse(name: str) -> Topology:
  """"v4-32", "v5e-8" or a physical name ("v4:2x2x1", "v5e:2x4") -> `Topology`."""
  m = re.fullmatch(r"(v4|v5e)-(\d+)", name.strip())
  if m:
    gen, count = m.group(1), int(m.group(2))
    prefix, config, per_host, cores = _GENERATIONS[gen]
    chips = count // cores
    shapes = _V5E_SHAPES if gen == "v5e" else _CUBE_SHAPES
    if count % cores or chips not in shapes:
      raise ValueError(f"unknown TPU slice {name!r}; known: {', '.join(_known_names())}")
    dims = shapes[chips]
    physical = f"{prefix}:{'x'.join(map(str, dims))}"
    return _make(name, physical, prefix, config, per_host, dims)
  m = re.fullmatch(r"(v4|v5e):(\d+(?:x\d+){1,2})", name.strip())
  if m:
    prefix = m.group(1)
    dims = tuple(int(d) for d in m.group(2).split("x"))
    gen = prefix
    _, config, per_host, _ = _GENERATIONS[gen]
    return _make(name, name.strip(), prefix, config, per_host, dims)
  raise ValueError(f"unknown TPU slice {name!r}; known: {', '.join(_known_names())}")


def _make(name, physical, prefix, config, per_host, dims) -> Topology:
  # Full cubes of 4+ chips per side have wrap-around links (v4); 2-D v5e slices of 16 wrap
  # along that side. A slice smaller than one host is bounded by the slice itself.
  if prefix == "v5e":
    wrap = tuple(d >= 16 for d in dims) + (False,)
    bounds = (min(2, dims[0]), min(4 if math.prod(dims) == 8 else 2, dims[1]), 1)
  else:
    cube = len(dims) == 3 and min(dims) >= 4
    wrap = (cube, cube, cube)
    bounds = tuple(min(b, d) for b, d in zip(per_host, dims + (1,) * (3 - len(dims))))
  return Topology(name=name, topology_name=physical, chip_config_name=config,
                  chips_per_host_bounds=bounds, wrap=wrap, num_chips=math.prod(dims),
                  chip=CHIPS[prefix])


def libtpu_available() -> bool:
  """Whether the TPU compiler (libtpu, the `tpu` extra) is importable here."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  return importlib.util.find_spec("libtpu") is not None


def devices(topology: Topology) -> list[Any]:
  """The slice's devices (no TPU needed: libtpu describes them), in the order jax lists them."""
  if not libtpu_available():
    raise RuntimeError("compiling for TPU needs libtpu: pip install -e '.[tpu]' (jax[tpu] at "
                       "the installed jax version)")
  # libtpu takes /tmp/libtpu_lockfile for the process that loads it first; any other jax process
  # on this host that touched the TPU plugin (a test, a run) would make this one fail to load it.
  # Compiling needs no exclusive TPU, so allow the shared load.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  desc = topologies.get_topology_desc(
      platform="tpu", topology_name=topology.topology_name,
      chip_config_name=topology.chip_config_name,
      chips_per_host_bounds=topology.chips_per_host_bounds, num_slices=1, wrap=topology.wrap)
  devs = list(desc.devices)
  if len(devs) != topology.num_chips:
    raise RuntimeError(f"{topology.name}: libtpu described {len(devs)} devices, expected "
                       f"{topology.num_chips} chips")
  return devs
