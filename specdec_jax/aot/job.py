"""One ahead-of-time job: a run or training config, a slice -> every program compiled and judged.

Why gin-free: the CLI (`specdec_jax.aot.cli`) parses gin and hands the resulting `RunConfig` or
`TrainConfig` here, so tests and scripts can drive a job with plain objects, as the runner and the
trainer are driven.

The mesh is the config's own (`RunConfig.mesh` / `TrainConfig.mesh`, from gin/mesh/*.gin) laid over
the slice's chips by `sharding.make_mesh`, the call the runner and trainer make on a real slice; a
config without a mesh runs on one device, so it is compiled on one chip.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import Mesh

from specdec_jax import sharding as sh
from specdec_jax.aot import abstract, memory, programs as programs_lib, steps as steps_lib
from specdec_jax.aot import topologies


@dataclasses.dataclass
class JobResult:
  topology: topologies.Topology
  mesh_shape: dict
  hbm_bytes_per_chip: Optional[int]
  results: list            # memory.Result per program, in compile order
  models: dict             # role -> source of its config

  @property
  def failures(self) -> list:
    return [r for r in self.results if r.fits is False or r.host_transfers or r.error]


def build_mesh(mesh_config: Optional[sh.MeshConfig], devices) -> tuple[Mesh, sh.MeshConfig]:
  """The config's mesh over the slice (the runner's `make_mesh`), or one chip without a mesh."""
  if mesh_config is None:
    one = sh.MeshConfig(data=1, model_outer=1, model_inner=1)
    return Mesh(np.asarray(devices[:1]).reshape(1, 1, 1), sh.MESH_AXES), one
  return sh.make_mesh(mesh_config, devices=devices), mesh_config


def run_job(cfg, topology: topologies.Topology, *, presets: Mapping[str, str] = (),
            roofline_tokens: int = 0, only: Sequence[str] = (),
            log: Callable[[str], None] = print,
            on_result: Optional[Callable[[JobResult], None]] = None) -> JobResult:
  """Compiles every program of `cfg` (a RunConfig or a TrainConfig) for `topology` (`only`:
  just the programs of these kinds, and the prefills they need). `on_result` gets the job so
  far after each program (the CLI rewrites aot.json with it, so a job stopped part-way keeps
  what it compiled)."""
  devices = topologies.devices(topology)
  hbm = memory.usable_hbm_bytes(devices)
  mesh, mesh_config = build_mesh(cfg.mesh, devices)
  log(f"{topology.name} ({topology.topology_name}, {topology.num_chips} chips): mesh "
      f"{dict(mesh.shape)}, usable HBM per chip "
      f"{'unknown' if hbm is None else f'{hbm / 2**30:.2f} GiB'}")
  models: dict[str, str] = {}
  extra: list = []
  if hasattr(cfg, "tasks"):  # a TrainConfig
    model = abstract.resolve_config(cfg.model, presets=presets)
    models["model"] = model.source
    teacher = None
    if cfg.teacher:
      teacher = abstract.resolve_config(cfg.teacher, presets=presets)
      models["teacher"] = teacher.source
    progs = programs_lib.train_programs(cfg, mesh, mesh_config.rules_for("target"), model.config,
                                        teacher and teacher.config)
  else:
    progs, extra = _decode_programs(cfg, mesh, mesh_config, presets, models, roofline_tokens)
  progs = select(progs + extra, only)
  emit = None
  if on_result is not None:
    emit = lambda so_far: on_result(JobResult(topology, dict(mesh.shape), hbm, so_far, models))  # noqa: E731
  with jax.set_mesh(mesh):
    results = _compile_all(progs, hbm, log, emit)
  return JobResult(topology, dict(mesh.shape), hbm, results, models)


def _decode_programs(cfg, mesh, mesh_config, presets, models, roofline_tokens):
  from specdec_jax.runner.run_config import MODEL_DRAFT, draft_specs  # pylint: disable=import-outside-toplevel
  vocab = preset_vocab_size(cfg)
  target = abstract.resolve_config(cfg.target_checkpoint, presets=presets, dtype=cfg.dtype,
                                   vocab_size=vocab)
  models["target"] = target.source
  draft_cfgs, draft_presets = {}, {}
  if cfg.runs_speculative:
    specs = draft_specs(cfg)
    for spec in specs:
      feature = _feature_draft(spec, target.config, presets, cfg.dtype)
      if feature is not None:
        draft_cfgs[feature[0]] = feature[1].config
        models[f"draft {feature[0]}"] = feature[1].source
        continue
      if spec.kind != MODEL_DRAFT:
        draft_cfgs[spec.kind] = spec.kind
        continue
      d = abstract.resolve_config(spec.checkpoint, presets=presets, dtype=cfg.dtype,
                                  vocab_size=vocab)
      name = spec.name
      if d.preset and sum(1 for s in specs if s.checkpoint and d.preset in s.checkpoint) <= 1:
        name = d.preset  # shorter than a gs:// path's tail, and unique in this run
      draft_cfgs[name] = d.config
      draft_presets[name] = d.preset
      models[f"draft {name}"] = d.source
  setup = programs_lib.decode_setup(cfg, mesh, mesh_config, target.config, draft_cfgs)
  progs = programs_lib.decode_programs(setup, mesh)
  extra = []
  if roofline_tokens:
    model_drafts = {n: dp for n, dp in setup.drafts.items() if n in draft_presets}
    if not model_drafts:
      raise ValueError("--roofline needs a model draft (c is a draft step / a target step)")
    extra = steps_lib.step_programs(setup, model_drafts, gamma=max(roofline_tokens - 1, 1),
                                    max_tokens=roofline_tokens, mesh=mesh)
  return progs, extra


def _feature_draft(spec, target_config, presets, dtype):
  """(name, `abstract.ResolvedFeature`) when `spec` is a feature-level draft (a local export, or
  a checkpoint the gin macros pair with `abstract.FEATURE_PRESET`), else None. Named as the
  runner names one (`DraftSpec` of kind 'feature': a trainer's `D/export` is D)."""
  from specdec_jax.runner.run_config import CHECKPOINT_DRAFTS, FEATURE_DRAFT, DraftSpec  # pylint: disable=import-outside-toplevel
  if spec.kind not in CHECKPOINT_DRAFTS:
    return None
  resolved = abstract.resolve_feature(spec.checkpoint, target_config, presets=presets,
                                      dtype=dtype)
  if resolved is None:
    return None
  return DraftSpec(FEATURE_DRAFT, spec.checkpoint, spec.label).name, resolved


def select(progs: Sequence[programs_lib.Program], kinds: Sequence[str]) -> list:
  """The programs of `kinds` and the ones they need (a loop's or a step's prefill), in order."""
  if not kinds:
    return list(progs)
  known = {p.kind for p in progs}
  unknown = sorted(set(kinds) - known)
  if unknown:
    raise ValueError(f"--only names kinds {unknown} this config has no program of; it has "
                     f"{sorted(known)}")
  keep = {p.name for p in progs if p.kind in kinds}
  keep |= {p.needs for p in progs if p.name in keep and p.needs}
  return [p for p in progs if p.name in keep]


def preset_vocab_size(cfg) -> Optional[int]:
  """The vocabulary a random-init preset takes in this run (`runner.pipeline.load`'s rule): the
  run's padded vocabulary when a local task has text to tokenize; None otherwise (seqio tasks
  decode with the T5 vocabulary the T5 v1.1 presets already have)."""
  from specdec_jax.models.model_config import PRESETS  # pylint: disable=import-outside-toplevel
  from specdec_jax.data import tasks  # pylint: disable=import-outside-toplevel
  from specdec_jax.runner.run_config import as_list  # pylint: disable=import-outside-toplevel
  names = [cfg.target_checkpoint] + [c for c in as_list(cfg.draft_checkpoint) if isinstance(c, str)]
  if not any(n in PRESETS for n in names) or tasks.is_seqio(cfg.task):
    return None
  examples = tasks.load_examples(cfg.task, cfg.split, cfg.num_examples,
                                 max_input_length=cfg.max_input_length)
  if not tasks.needs_text(examples):
    return None
  vocab = tasks.load_vocabulary(cfg.vocabulary, required=True)
  return vocab.padded_vocab_size


def _compile_all(progs: Sequence[programs_lib.Program], hbm, log, emit=None) -> list:
  compiled: dict[str, Any] = {}
  results = []
  for p in progs:
    if p.needs is not None and p.needs not in compiled:
      r = memory.Result(p.name, p.kind, available_bytes=hbm, info=p.info,
                        error=f"not compiled: {p.needs} did not compile")
      results.append(r)
      log(f"  {p.name}: skipped ({r.error})")
      if emit is not None:
        emit(list(results))
      continue
    r = memory.compile_program(p.name, p.kind, p.call(compiled), hbm, has_loop=p.has_loop)
    r.info = p.info
    if r.compiled is not None:
      compiled[p.name] = r.compiled
    results.append(r)
    status = ("fits" if r.fits else "DOES NOT FIT") + (
        f", {len(r.host_transfers)} host transfer(s) in the loop" if r.host_transfers else "")
    need = "" if r.needed_bytes is None else f" {r.needed_bytes / 2**30:.2f} GiB/chip"
    log(f"  {p.name}: {status}{need} ({r.compile_seconds:.1f} s)")
    if emit is not None:
      emit(list(results))
  for r in results:
    r.compiled = None  # executables are large; the figures are what is kept
  return results
