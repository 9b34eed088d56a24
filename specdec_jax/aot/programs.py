"""The programs a run or a training job executes, as lowerable thunks over abstract arguments.

Why these and no others: the runner on a mesh runs its `Decoder`'s `prefill_program` then
`loop_program` (the speculative `lax.while_loop` over the donated state) per draft and gamma, and
the same two for the autoregressive baseline; the trainer runs
`training.step.make_train_step`'s jitted step (its microbatches a `lax.scan` inside). Compiling exactly
those, with the shardings the runner and trainer give their arguments (`sharding.param_shardings`,
`sharding.batch_sharding`, `training.sharded.TrainMesh.opt_state_shardings`), is what tells whether
a config fits and stays on device.

A loop's state is its prefill's output, so a loop program is lowered from the compiled prefill's
output shapes and shardings (`abstract.like_outputs`), as the runner feeds one into the other.

Sweeps: the loop's state grows with gamma (buffer and cache slack), so per draft and sampling mode
only the largest gamma is compiled (GAMMA='auto' counts as `RunConfig.gamma_max`, the largest it can
choose); temperatures that differ only in value share one greedy (0) or one sampling (> 0) program.
A config without a mesh runs unsharded on one device, so it is compiled on one chip.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Optional

import jax
import numpy as np
from jax.sharding import Mesh

from specdec_jax import sharding as sh
from specdec_jax.aot import abstract
from specdec_jax.models import gqa
from specdec_jax.models.feature_draft import FeatureDraft
from specdec_jax.models.feature_draft_config import FeatureDraftConfig
from specdec_jax.models.model import Model
from specdec_jax.paths import resolve_path

SPEC_PREFILL, SPEC_LOOP, AR_PREFILL, AR_LOOP, TRAIN_STEP = (
    "spec_prefill", "spec_loop", "ar_prefill", "ar_loop", "train_step")


@dataclasses.dataclass
class Program:
  """One program to compile. `call(compiled)` returns (jitted function, args, kwargs) to lower it
  with; `compiled` maps the names of programs compiled before it to their executables (a loop
  reads its prefill's state from them)."""
  name: str
  kind: str
  call: Callable[[Mapping[str, Any]], tuple]
  has_loop: bool = False
  needs: Optional[str] = None   # the program whose outputs are this one's state
  info: dict = dataclasses.field(default_factory=dict)


# ---- decoding -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DecodeSetup:
  """A run config reduced to what its programs depend on."""
  target: Model
  drafts: dict            # name -> (Model or model-free draft, abstract params or tables)
  target_params: Any
  batch: int
  prompt_len: int
  max_decode_len: int
  gammas: dict            # draft name -> the gamma to compile
  trees: tuple            # tree schemes (static, dynamic) per model draft (`trees_to_compile`)
  samplings: tuple        # SamplingConfig per distinct mode
  rule: str
  runs_autoregressive: bool
  runs_speculative: bool
  feature_parallel: bool = False  # a feature draft's chain drafts its block in one call


def gammas_to_compile(gammas, gamma_max: int) -> int:
  """The largest chain gamma a run can use: its largest int, or `gamma_max` if 'auto' is among
  them ('tree' and 'adaptive' are other schemes: `trees_to_compile` for the first)."""
  values = gammas if isinstance(gammas, (list, tuple)) else [gammas]
  ints = [int(g) for g in values if isinstance(g, int) and g > 0]
  return max(ints + ([gamma_max] if "auto" in values else []) or [0])


def trees_to_compile(cfg) -> tuple:
  """The tree schemes a run's loops can use: GAMMA='tree''s (`RunConfig.tree_scheme`) and, for
  'auto', every tree candidate it may choose (`RunConfig.tree_candidates`, static and dynamic).
  Unlike chains, one tree's program does not serve a smaller one (another static shape), so each
  is compiled."""
  values = cfg.gamma if isinstance(cfg.gamma, (list, tuple)) else [cfg.gamma]
  out = [cfg.tree_scheme()] if "tree" in values else []
  out += list(cfg.tree_candidate_schemes()) if "auto" in values else []
  return tuple(dict.fromkeys(out))


def distinct_samplings(cfg) -> tuple:
  """One SamplingConfig per program the run's temperatures need: greedy and/or sampling."""
  from specdec_jax.runner.run_config import temperatures  # pylint: disable=import-outside-toplevel
  from specdec_jax.decoding.sampling import SamplingConfig  # pylint: disable=import-outside-toplevel
  out = {}
  for t in temperatures(cfg):
    out.setdefault(t > 0, SamplingConfig(temperature=float(t), top_k=int(cfg.top_k),
                                         top_p=float(cfg.top_p)))
  return tuple(out[k] for k in sorted(out))


def _fitted(mesh: Mesh, model: Model, rules) -> Model:
  """The model as the runner places it on `mesh`: key/value heads replicated where its heads
  split over more chips than it has kv heads (`sharding.fit_kv_heads`; shapes only here)."""
  r = sh.kv_replication(mesh, model, rules)
  return dataclasses.replace(model, config=gqa.replicated_config(model.config, r))


def decode_setup(cfg, mesh: Mesh, mesh_config: sh.MeshConfig, target_cfg, draft_cfgs: dict
                 ) -> DecodeSetup:
  """Models with their rules, validated against the mesh, and their abstract params.

  draft_cfgs: draft name -> ModelConfig for model drafts, FeatureDraftConfig for feature-level
  drafts (the draft rules, as `sharding.place_models` lays one out), or the kind ('unigram',
  'bigram', 'prompt_lookup', 'corpus_lookup') for model-free ones (a corpus lookup's index is
  read from `cfg.lookup_corpus` for its shapes).
  """
  from specdec_jax.data import corpus_index, ngram_tables  # pylint: disable=import-outside-toplevel
  from specdec_jax.models import model_free  # pylint: disable=import-outside-toplevel
  t_rules, d_rules = mesh_config.rules_for("target"), mesh_config.rules_for("draft")
  target = _fitted(mesh, sh.with_rules(Model(target_cfg), t_rules), t_rules)
  dp = sh.data_parallel_size(mesh, t_rules)
  batch = -(-cfg.batch_size // dp) * dp  # the runner pads a batch to the data axis
  sh.validate(mesh, target, t_rules, name="target", batch_size=batch)
  drafts = {}
  for name, dcfg in draft_cfgs.items():
    if isinstance(dcfg, str):
      draft = model_free.make_draft(dcfg, target)
      if dcfg == "corpus_lookup":
        if not cfg.lookup_corpus:
          raise ValueError("DRAFT='corpus_lookup' needs RunConfig.lookup_corpus (its index's "
                           "shapes are the program's)")
        tables = corpus_index.load_index(resolve_path(cfg.lookup_corpus))[0]
      else:
        tables = ({} if dcfg == "prompt_lookup"
                  else ngram_tables.build_ngram_tables([], target.vocab_size))
      drafts[name] = (draft, abstract.abstract_tables(tables, mesh))
    elif isinstance(dcfg, FeatureDraftConfig):
      draft = sh.with_rules(FeatureDraft(dcfg), d_rules)
      sh.validate(mesh, draft, d_rules, name=f"feature draft {name}", batch_size=batch)
      drafts[name] = (draft, abstract.abstract_params(draft, mesh, cfg.dtype))
    else:
      draft = _fitted(mesh, sh.with_rules(Model(dcfg), d_rules), d_rules)
      sh.validate(mesh, draft, d_rules, name=f"draft {name}", batch_size=batch)
      drafts[name] = (draft, abstract.abstract_params(draft, mesh, cfg.dtype))
  gamma = gammas_to_compile(cfg.gamma, cfg.gamma_max)
  trees = trees_to_compile(cfg)
  return DecodeSetup(
      target=target, drafts=drafts, target_params=abstract.abstract_params(target, mesh, cfg.dtype),
      batch=batch, prompt_len=cfg.max_input_length, max_decode_len=cfg.max_decode_length,
      gammas={name: gamma for name in drafts}, trees=trees, samplings=distinct_samplings(cfg),
      rule=cfg.rule, runs_autoregressive=cfg.runs_autoregressive or (gamma == 0 and not trees),
      runs_speculative=cfg.runs_speculative and (gamma > 0 or bool(trees)),
      feature_parallel=cfg.feature.parallel)


def decode_programs(setup: DecodeSetup, mesh: Mesh) -> list[Program]:
  """Prefill and loop programs of every draft (and the autoregressive baseline): the runner's
  `Decoder` on the mesh (`decoder.prefill_program`, then `decoder.loop_program`); a chain's
  (scheme, drafter) is `draft_schemes.plan`'s, as the runner's (a feature-level draft's
  parallel block where `feature_parallel`); a tree takes the draft's default drafter."""
  # pylint: disable=import-outside-toplevel
  from specdec_jax.decoding import decoder as decoder_lib, start
  from specdec_jax.decoding.autoregressive import Autoregressive
  from specdec_jax.decoding.draft_schemes import plan
  s = setup
  inputs = abstract.abstract_batch((s.batch, s.prompt_len), np.int32, mesh, s.target.axis_rules)
  rng = abstract.abstract_key(mesh)
  runs = []  # (prefill name and kind, loop kind, label, info, draft, params, plan) per pair
  if s.runs_speculative:
    for dname, (draft, dparams) in s.drafts.items():
      gamma = s.gammas[dname]
      if gamma > 0:
        runs.append((f"{SPEC_PREFILL}[draft={dname},gamma={gamma}]", SPEC_PREFILL, SPEC_LOOP,
                     f"draft={dname},gamma={gamma},", dict(draft=dname, gamma=gamma),
                     draft, dparams, plan(draft, gamma, parallel=s.feature_parallel)))
      runs += [_tree_run(dname, draft, dparams, tree) for tree in s.trees
               if isinstance(draft, (Model, FeatureDraft))]  # model-free: no masked block
  if s.runs_autoregressive:
    runs.append((AR_PREFILL, AR_PREFILL, AR_LOOP, "", {}, None, None, (Autoregressive(), None)))
  programs = []
  for pname, prefill_kind, loop_kind, label, info, draft, dparams, (scheme, drafter) in runs:
    params = decoder_lib.Params(s.target_params, dparams)
    decoders = [decoder_lib.Decoder(s.target, draft, scheme, sampling, rule=s.rule,
                                    max_decode_len=s.max_decode_len, mesh=mesh, drafter=drafter)
                for sampling in s.samplings]
    for d in decoders:
      start.check_cache_len(d, s.prompt_len)
    programs.append(Program(
        pname, prefill_kind,
        lambda _, d=decoders[0], params=params: (
            decoder_lib.prefill_program, (d, params, inputs, rng), {}), info=info))
    for d in decoders:
      programs.append(Program(
          f"{loop_kind}[{label}temperature={d.sampling.temperature:g}]", loop_kind,
          lambda compiled, d=d, params=params, pname=pname: (
              decoder_lib.loop_program,
              (d, params, abstract.like_outputs(compiled[pname]), None), {}),
          has_loop=True, needs=pname, info=dict(info, temperature=d.sampling.temperature)))
  return programs


def _tree_run(dname: str, draft, dparams, scheme) -> tuple:
  """One tree's (prefill name, kinds, label, info, draft, params, (scheme, drafter)) for
  `decode_programs`:
  its own prefill, since the caches' slack grows with the node count (`scheme.gamma`). A static
  tree's info has its parents; a dynamic tree (`DynamicTreeScheme`) has none, its budget
  instead (width and branch in its label: two budgets may share N and D)."""
  tree = scheme.tree
  shape = (dict(tree_parents=list(tree.parents)) if hasattr(tree, "parents")
           else dict(tree_dynamic=dataclasses.asdict(tree)))
  kind = "" if hasattr(tree, "parents") else f"dynamic/width{tree.width}/branch{tree.branch}/"
  label = f"draft={dname},tree={kind}{tree.num_nodes}n/depth{tree.max_depth},"
  info = dict(draft=dname, gamma=scheme.gamma, tree_nodes=tree.num_nodes,
              tree_depth=tree.max_depth, **shape)
  return (f"{SPEC_PREFILL}[{label[:-1]}]", SPEC_PREFILL, SPEC_LOOP, label, info, draft, dparams,
          (scheme, None))


# ---- training -------------------------------------------------------------------------------------
def train_programs(tcfg, mesh: Mesh, rules: sh.Rules, model_cfg, teacher_cfg=None
                   ) -> list[Program]:
  """The train step (microbatches inside) for every distinct batch shape of the mixture, with the
  state laid out as the trainer places it (`training.placement`, `training.sharded`)."""
  from specdec_jax.training import sharded as sharded_lib  # pylint: disable=import-outside-toplevel
  from specdec_jax.training import step as step_lib  # pylint: disable=import-outside-toplevel
  from specdec_jax.training.train_state import TrainState  # pylint: disable=import-outside-toplevel
  model = sh.with_rules(Model(model_cfg.replace(dtype=tcfg.dtype, scan_layers=False)), rules)
  micro = tcfg.batch_size // tcfg.num_microbatches
  sh.validate(mesh, model, rules, name=f"model {tcfg.model}", batch_size=micro)
  teacher, teacher_params = None, None
  if teacher_cfg is not None:
    teacher = sh.with_rules(Model(teacher_cfg.replace(dtype=tcfg.dtype, scan_layers=False)), rules)
    sh.validate(mesh, teacher, rules, name="teacher", batch_size=micro)
    teacher_params = abstract.abstract_params(teacher, mesh, None)
  tm = sharded_lib.TrainMesh(mesh, rules)
  params = abstract.abstract_params(model, mesh, None)  # float32, as the trainer keeps them
  optimizer = step_lib.make_optimizer(tcfg)
  opt_sh = tm.opt_state_shardings(optimizer, params, jax.tree.map(lambda x: x.sharding, params))
  opt_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                           jax.eval_shape(optimizer.init, params), opt_sh)
  state = TrainState(params=params, opt_state=opt_state,
                     step=abstract.abstract_scalar(np.int32, mesh),
                     tokens=abstract.abstract_scalar(np.int32, mesh),
                     seconds=abstract.abstract_scalar(np.float32, mesh))
  step = step_lib.make_train_step(model, tcfg, optimizer, teacher,
                                  state_shardings=jax.tree.map(lambda x: x.sharding, state),
                                  replicated=tm.replicated)
  programs, seen = [], set()
  for spec in tcfg.tasks:
    shapes = batch_shapes(model.config, spec, tcfg.batch_size)
    key = tuple(sorted((k, v) for k, (v, _) in shapes.items()))
    if key in seen:
      continue
    seen.add(key)
    batch = {k: abstract.abstract_batch(shape, dt, mesh, rules) for k, (shape, dt) in shapes.items()}
    lengths = (f"{spec.input_len}/{spec.target_len}" if model.config.is_encoder_decoder
               else f"{spec.target_len}")
    programs.append(Program(
        f"{TRAIN_STEP}[{spec.name},len={lengths},batch={tcfg.batch_size},"
        f"microbatches={tcfg.num_microbatches}]", TRAIN_STEP,
        lambda _, batch=batch: (step, (state, batch, teacher_params), {}),
        info=dict(task=spec.name, batch_size=tcfg.batch_size,
                  num_microbatches=tcfg.num_microbatches)))
  return programs


def batch_shapes(model_cfg, spec, batch_size: int) -> dict[str, tuple[tuple[int, ...], Any]]:
  """The arrays `training.data.batch_at` yields for `spec` (T5: encoder inputs, decoder inputs
  = targets shifted right; decoder-only: the sequence without its last token)."""
  length = spec.target_len if model_cfg.is_encoder_decoder else spec.target_len - 1
  out = {"decoder_input_tokens": ((batch_size, length), np.int32),
         "decoder_target_tokens": ((batch_size, length), np.int32),
         "loss_weights": ((batch_size, length), np.float32)}
  if model_cfg.is_encoder_decoder:
    out["encoder_input_tokens"] = ((batch_size, spec.input_len), np.int32)
  return out
