"""What one run does: `RunConfig` (filled from gin macros by `run.py`) and its sweep points.

Why a plain dataclass: the pipeline is testable without gin, and gin stays at the edge
(`configurables.py` registers this class as the `RunConfig` configurable). A *sweep* is any run
where `gamma`, `temperature`, `draft` or `draft_checkpoint` is a list: the pipeline runs the
cartesian product, grouping points by temperature so the autoregressive baseline of a temperature
is decoded and timed once, interleaved with every speculative point of that temperature.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Sequence
from typing import Any

from specdec_jax.checkpoints import feature_draft_io as feature_ckpt
from specdec_jax.decoding import prompt_cache
from specdec_jax.paths import resolve_path
from specdec_jax.runner import fingerprint as fingerprint_lib
from specdec_jax.runner import keys, prompt_sets, schedule, settings

MODES = ("speculative", "autoregressive", "benchmark", "sweep")
MODEL_DRAFT = "model"
# A DRAFT='model' checkpoint holding a feature_draft_config.json is a feature-level draft
# (checkpoints/feature_draft_io.py): its DraftSpec gets this kind; it decodes with FeatureDrafter.
FEATURE_DRAFT = "feature"
NON_MODEL_DRAFTS = ("unigram", "bigram", "prompt_lookup", "corpus_lookup")
CHECKPOINT_DRAFTS = (MODEL_DRAFT, FEATURE_DRAFT)
AUTO, ADAPTIVE, TREE = schedule.AUTO, schedule.ADAPTIVE, schedule.TREE  # GAMMA's shorthands
MATMULS = ("auto", "xla", "kernel", "hybrid")
DRAFT_PANELS = ("auto", "float32", "int8", "q4")
PROMPT_FORMATS, GAMMA_WORDS = ("plain", "chat"), schedule.WORDS  # = data.chat.FORMATS


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """One decoding run. Field names mirror the gin macros (lower case).

  gamma: int >= 1, 'auto' (chosen from measured alpha, c and v; 0 = autoregressive), 'adaptive'
    (a per-example draft length inside the loop, `decoding.adaptive`, up to gamma_max), or a list;
    or the scheme object itself, bound by gin (`@Chain()`, `@TreeScheme()`,
    `@DynamicTreeScheme()`, `@LookupTreeScheme()`, `@AdaptiveConfig()`, `@Auto()`): lowered to
    the shorthand and the fields below when the config is made (`runner.schedule.lower`).
  adaptive: the `decoding.adaptive.AdaptiveConfig` of GAMMA='adaptive' (gin: `RunConfig.adaptive
    = @AdaptiveConfig()`); None: `AdaptiveConfig(gamma_max=gamma_max)`.
  tree: the `decoding.tree.TreeScheme` of GAMMA='tree' (a static draft tree verified in one target
    call; gin: `gin/decoding/tree.gin`, `RunConfig.tree = @TreeScheme()`), or a
    `decoding.tree.DynamicTreeScheme` (an EAGLE-2-style dynamic tree; gin:
    `gin/decoding/dynamic_tree.gin`); None: the (3, 2, 1) tree with the 'auto' verifier.
  auto.trees (shorthand `tree_candidates`): trees GAMMA='auto' weighs beside the chains
    (`gin/decoding/auto_tree.gin`): each a branching per depth such as (3, 2, 1), a
    `decoding.tree.Tree`, a TreeScheme or a DynamicTreeScheme
    (`gin/decoding/auto_dynamic_tree.gin`); the cost model picks a chain's gamma, a tree or 0
    (runner/calibrate.py).
  draft: 'model' (weights at draft_checkpoint) or a non-model drafter, or a list of them. A
    draft_checkpoint that is a feature-level draft's export (`feature_draft_config.json` beside
    its weights) is one (DraftSpec kind 'feature', decoded with `FeatureDrafter`, its
    parallel block where `feature.parallel`).
  repeats: timed repetitions per batch and program (the median counts; the compile is excluded).
  """

  mode: str = "benchmark"
  target_checkpoint: str = "t5_test_target"
  draft_checkpoint: Any = "t5_test_draft"
  draft: Any = MODEL_DRAFT
  task: str = "translate_en_de"
  num_examples: int | None = 8
  batch_size: int = 4
  gamma: Any = 4
  temperature: Any = 0.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  max_decode_length: int = 32
  # Knobs with sensible defaults (bind as RunConfig.<name> in gin).
  split: str = "valid"
  max_input_length: int = 256
  # A prompt longer than max_input_length: True cuts it (a T5 input keeps its EOS last) and logs
  # one warning with the count; False refuses the run, naming the first such example.
  truncate_inputs: bool = True
  # Pad each batch to its width bucket (`runner.inputs.bucket_width`); False: to the longest.
  prompt_buckets: bool = True
  # A SentencePiece .model, or a Hugging Face tokenizer.json (or the directory holding it); None:
  # the tokenizer.json of an HF checkpoint directory the target is read from, else the shipped one.
  vocabulary: str | None = None
  prompt_format: str = "plain"  # or 'chat': the tokenizer's chat template (data/chat.py)
  dtype: str | None = None
  rule: str = "tokenwise"
  repeats: int = 3
  gamma_max: int = 8
  # GAMMA='auto''s settings, a `settings.Auto` (its fields say what each does; gin: `RunConfig.auto
  # = @Auto()` or the shorthand keywords below), settled when the config is made (`_settle`).
  auto: Any = None
  # Which prompts calibrate ('auto', c, v, the loops' costs, speedup_predicted): 'held_out' draws
  # auto_calibration_examples prompts of the split by SEED and never reports them; 'in_sample'
  # calibrates on the first measured prompts (runner/prompt_sets.py says why held out).
  calibration: str = "held_out"
  # True: the NUM_EXAMPLES measured prompts are a seeded uniform draw from the split (standing for
  # the split); False: the split's first ones.
  sample_examples: bool = False
  resume: bool = True
  plots: bool = True
  # A specdec_jax.sharding.MeshConfig (gin/mesh/*.gin binds it); None: one device, unsharded.
  mesh: Any = None
  adaptive: Any = None
  tree: Any = None
  # Dense layers' matmul while decoding (models/packed.py): 'auto' (the packed CPU kernel on one
  # CPU device, XLA's dot elsewhere), 'xla', 'kernel', 'hybrid' (kernel from 2 rows).
  matmul: str = "auto"
  # Model-free drafts (unigram, bigram, prompt_lookup fallback): a .npz of tables
  # (data.ngram_tables.save_tables), or None to estimate them on the task's train split.
  ngram_tables: str | None = None
  ngram_train_examples: int = 20000
  # DRAFT='corpus_lookup': the corpus index it retrieves from (an .npz of scripts/corpus_index.py,
  # e.g. over the target's own replies to training prompts; data/corpus_index.py).
  lookup_corpus: str | None = None
  # Model drafts: the output head restricted to the K first tokens of the checkpoint's
  # head_ranking.json (checkpoints/head_ranking.py, models/head_vocab.py: exact); 0: full head.
  draft_head_vocab: int = 0
  # Model drafts' weights (models/packed.py): 'auto' (lossless), 'float32', 'int8', 'q4' (lossy).
  draft_panels: str = "auto"
  draft_prompt_cache: str = "auto"  # 'auto', 'own', 'target', 'shared' (decoding/prompt_cache)
  # A feature-level draft's chain options, a `settings.FeatureOptions` (`@FeatureOptions()`,
  # GAMMA = @FeatureChain() or the shorthand keywords below), settled likewise.
  feature: Any = None
  # seqio tasks: where TFDS finds prepared data (None: TFDS_DATA_DIR / its default).
  tfds_data_dir: str | None = None
  progress_every_s: float = 10.0
  # Shorthand keywords (gin files and records spell them so): each sets one field of `auto` or
  # `feature`; none is stored (`settings.SHORTHANDS`, in this order).
  tree_candidates: dataclasses.InitVar[Any] = None
  auto_calibration_examples: dataclasses.InitVar[Any] = None
  auto_timing_examples: dataclasses.InitVar[Any] = None
  auto_calibration_gamma: dataclasses.InitVar[Any] = None
  auto_min_speedup: dataclasses.InitVar[Any] = None
  auto_each_gamma: dataclasses.InitVar[Any] = None
  feature_parallel: dataclasses.InitVar[Any] = None
  feature_lookup_gamma: dataclasses.InitVar[Any] = None
  feature_lookup_ngram: dataclasses.InitVar[Any] = None

  def __post_init__(self, *shorthands):
    if self.mode not in MODES:
      raise ValueError(f"MODE must be one of {MODES}, got {self.mode!r}")
    self._settle(dict(zip(settings.SHORTHANDS, shorthands)))
    for g in as_list(self.gamma):
      schedule.check_value(g)
    for t in as_list(self.temperature):
      if isinstance(t, bool) or not isinstance(t, (int, float)) or not (
          0 <= t and math.isfinite(t)):
        raise ValueError(f"TEMPERATURE must be a finite number >= 0 (0 = greedy), got {t!r}")
    for d in as_list(self.draft):
      if d != MODEL_DRAFT and d not in NON_MODEL_DRAFTS:
        raise ValueError(f"DRAFT must be {MODEL_DRAFT!r} or one of {NON_MODEL_DRAFTS}, got {d!r}")
    if self.num_examples is not None and self.num_examples < 1:
      raise ValueError(f"NUM_EXAMPLES must be >= 1 or None (all), got {self.num_examples}")
    positive = dict(batch_size=self.batch_size, max_decode_length=self.max_decode_length,
                    repeats=self.repeats, gamma_max=self.gamma_max,
                    max_input_length=self.max_input_length)
    for name, value in positive.items():
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name.upper()} must be an integer >= 1, got {value!r}")
    if (not isinstance(self.draft_head_vocab, int) or isinstance(self.draft_head_vocab, bool)
        or self.draft_head_vocab < 0):
      raise ValueError(f"DRAFT_HEAD_VOCAB must be an integer >= 0 (0 = the full head), got "
                       f"{self.draft_head_vocab!r}")
    for name, allowed in (("matmul", MATMULS), ("draft_panels", DRAFT_PANELS), ("prompt_format",
                          PROMPT_FORMATS), ("calibration", prompt_sets.CALIBRATION_MODES),
                          ("draft_prompt_cache", prompt_cache.PROMPT_CACHES)):
      if getattr(self, name) not in allowed:
        raise ValueError(f"RunConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
    if not isinstance(self.top_k, int) or self.top_k < 0:
      raise ValueError(f"TOP_K must be an integer >= 0 (0 = off), got {self.top_k!r}")
    if not 0.0 < float(self.top_p) <= 1.0:
      raise ValueError(f"TOP_P must be in (0, 1] (1 = off), got {self.top_p!r}")

  def _settle(self, shorthands: dict) -> None:
    """GAMMA in shorthand, and `auto` / `feature` settled, from every place that may set them
    (`runner.settings`): the same setting given two values is refused."""
    defaults = {f.name: f.default for f in dataclasses.fields(self)}
    given = settings.bound(self.auto, self.feature, shorthands,
                           {k: getattr(self, k) for k in settings.FIELDS
                            if getattr(self, k) not in (defaults[k], None)})
    gamma, fields = schedule.lower(self.gamma, given)
    for name, value in dict(settings.settled({**given, **fields}), gamma=gamma).items():
      object.__setattr__(self, name, value)  # frozen: set once, here

  def adaptive_config(self):
    """The AdaptiveConfig of GAMMA='adaptive' (`adaptive`, or the default up to gamma_max)."""
    from specdec_jax.decoding.adaptive import AdaptiveConfig  # pylint: disable=import-outside-toplevel
    return self.adaptive if self.adaptive is not None else AdaptiveConfig(gamma_max=self.gamma_max)

  def tree_scheme(self):
    """The TreeScheme of GAMMA='tree' (`tree`, or the (3, 2, 1) tree, verifier 'auto')."""
    from specdec_jax.decoding.tree.scheme import TreeScheme  # pylint: disable=import-outside-toplevel
    return self.tree if self.tree is not None else TreeScheme((3, 2, 1))

  def tree_candidate_schemes(self) -> tuple:
    """`tree_candidates` as schemes (`schedule.candidate_schemes`: a branching or a Tree gets
    `tree_scheme()`'s verifier), without repeats, in the order given."""
    return schedule.candidate_schemes(as_list(self.auto.trees), self.tree_scheme().verifier)

  @property
  def is_sweep(self) -> bool:
    return self.mode == "sweep" or any(
        isinstance(x, (list, tuple)) for x in (self.gamma, self.temperature, self.draft,
                                               self.draft_checkpoint))

  @property
  def runs_autoregressive(self) -> bool:
    return self.mode in ("autoregressive", "benchmark", "sweep")

  @property
  def runs_speculative(self) -> bool:
    return self.mode != "autoregressive"

  def fingerprint(self) -> dict[str, Any]:
    """What must not change between a killed run and its resumption (`runner.fingerprint`)."""
    return fingerprint_lib.of(self)


@dataclasses.dataclass(frozen=True)
class DraftSpec:
  """One draft: kind 'model' with a checkpoint (path or preset), 'feature' with a feature-level
  draft's checkpoint, or a non-model drafter.

  `label`: the name results are filed under when the checkpoint's folder name is not unique in
  the run (`draft_specs` sets it); otherwise the folder name (a feature draft exported as the
  trainer's `D/export`: D's name, so a result does not read 'export').
  """

  kind: str
  checkpoint: str | None = None
  label: str | None = None

  @property
  def name(self) -> str:
    if self.label is not None:
      return self.label
    if self.kind not in CHECKPOINT_DRAFTS:
      return self.kind
    path = os.path.normpath(self.checkpoint)
    if self.kind == FEATURE_DRAFT and os.path.basename(path) == "export":
      path = os.path.dirname(path) or path
    return os.path.basename(path)


@dataclasses.dataclass(frozen=True)
class Point:
  """One speculative configuration of a sweep (gamma may still be 'auto' until calibrated)."""

  draft: DraftSpec
  gamma: Any
  temperature: float

  @property
  def key(self) -> str:
    return keys.point(self.draft.name, self.gamma, self.temperature)


as_list = schedule.as_list


def draft_specs(cfg: RunConfig) -> list[DraftSpec]:
  """The run's drafts, each under a name no other draft of the run has.

  Why: results, run keys and TensorBoard runs are filed by draft name, and two checkpoints in
  folders of the same name (`runs/a/export`, `runs/b/export`) would otherwise share one: one draft
  decoded, both rows reporting it. Clashing names grow by parent folders until they differ
  (`a/export`, `b/export`); the same draft named twice is one draft.
  """
  specs = []
  for kind in as_list(cfg.draft):
    if kind == MODEL_DRAFT:
      specs.extend(DraftSpec(checkpoint_kind(str(c)), str(c))
                   for c in as_list(cfg.draft_checkpoint))
    else:
      specs.append(DraftSpec(kind))
  specs = unique(specs)
  names = [s.name for s in specs]
  out = []
  for s, name in zip(specs, names):
    if names.count(name) > 1 and s.kind in CHECKPOINT_DRAFTS:
      s = dataclasses.replace(s, label=_distinct_suffix(s, [o for o in specs if o != s]))
    out.append(s)
  clash = [n for n in unique(x.name for x in out) if [x.name for x in out].count(n) > 1]
  if clash:
    raise ValueError(f"drafts {[x.checkpoint or x.kind for x in out if x.name in clash]} cannot "
                     f"be told apart by name ({clash[0]!r}); give distinct checkpoint paths")
  return out


def checkpoint_kind(checkpoint: str) -> str:
  """FEATURE_DRAFT for a feature-level draft's checkpoint directory, else MODEL_DRAFT (a model
  checkpoint or a preset: `checkpoints.loader` tells those apart)."""
  return FEATURE_DRAFT if feature_ckpt.is_feature_draft(resolve_path(checkpoint)) else MODEL_DRAFT


def _distinct_suffix(spec: DraftSpec, others: Sequence[DraftSpec]) -> str:
  """The shortest trailing part of `spec`'s checkpoint path that no other draft's path ends with."""
  parts = os.path.normpath(os.path.abspath(spec.checkpoint)).split(os.sep)
  other_paths = [os.path.normpath(os.path.abspath(o.checkpoint)).split(os.sep)
                 for o in others if o.kind in CHECKPOINT_DRAFTS]
  for k in range(1, len(parts) + 1):
    tail = parts[-k:]
    if all(p[-k:] != tail for p in other_paths):
      return "/".join(tail)
  return "/".join(parts)


def temperatures(cfg: RunConfig) -> list[float]:
  return [float(t) for t in as_list(cfg.temperature)]


def points(cfg: RunConfig) -> list[Point]:
  """Speculative points in run order: temperature outermost, then draft, then gamma."""
  if not cfg.runs_speculative:
    return []
  return [Point(d, g, t) for t, d, g in itertools.product(
      temperatures(cfg), draft_specs(cfg), as_list(cfg.gamma))]


def unique(seq: Sequence) -> list:
  seen, out = set(), []
  for x in seq:
    if x not in seen:
      seen.add(x)
      out.append(x)
  return out
