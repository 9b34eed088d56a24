"""The run pipeline's loading half: the prompts, the target and the drafts, placed and packed as
they decode, and the run's Decoder for any draft and scheme (`decoder_for`). What follows
a load: the tuner resolves the points (runner/autotune.py, measuring through
runner/measure.py), the batches are decoded (runner/decode.py), the metrics collected
(runner/collect.py).

Why this shape: for each temperature the autoregressive baseline and every speculative point of
that temperature decode the same batch in the same process, timed interleaved (specdec_jax/timing.py),
and the batch is appended to the result files before the next one starts (runner/store.py). The
published metrics are then computed from those files alone (runner/collect.py), so a killed and
resumed run reports exactly what an uninterrupted one would, up to timing noise.

Every decode is a `decoding.decoder.Decoder` (`decoder_for`). On a mesh (`RunConfig.mesh`,
gin/mesh/*.gin) the same Decoder carries the mesh and runs its donated-state programs: every
process feeds only the rows its devices hold, the results are gathered, and only process 0 writes
(runner/experiment.py). Anything chosen from local timings is agreed first.
"""
from __future__ import annotations

import dataclasses

from absl import logging

from specdec_jax import sharding
from specdec_jax.checkpoints import loader
from specdec_jax.data import hf_tokenizer, ngram_tables, tasks
from specdec_jax.decoding.autoregressive import Autoregressive
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.models import packed
from specdec_jax.runner import drafts as drafts_lib
from specdec_jax.runner import inputs as inputs_lib, prompt_sets, schedule
from specdec_jax.runner.run_config import DraftSpec, RunConfig, draft_specs


@dataclasses.dataclass
class Loaded:
  """Everything decoded against: the target, the drafts and the prompts."""

  target: object
  target_params: object
  target_name: str
  drafts: dict
  prompts: inputs_lib.Prompts       # the measured prompts
  calibration: inputs_lib.Prompts   # the prompts 'auto', the costs and the prediction use
  mesh: object = None  # jax.sharding.Mesh of a sharded run
  held_out: bool = True             # calibration prompts disjoint from the measured ones

  def data_parallel(self) -> int:
    """Rows a batch must be a multiple of: the size of the mesh axes `batch` maps to."""
    if self.mesh is None:
      return 1
    return sharding.data_parallel_size(self.mesh, self.target.axis_rules)


def run_vocabulary(cfg: RunConfig) -> str | None:
  """`RunConfig.vocabulary`, else the tokenizer.json of a Hugging Face checkpoint directory the
  target is read from (its text prompts tokenized as the model was trained), else None (the
  task's own or the shipped SentencePiece vocabulary)."""
  if cfg.vocabulary:
    return cfg.vocabulary
  if loader.is_preset(cfg.target_checkpoint):
    return None
  return hf_tokenizer.beside(loader.local_path(cfg.target_checkpoint))


def load(cfg: RunConfig, mesh=None) -> Loaded:
  """The prompts, the target and every draft of the run, placed on `mesh` (a sharded run) with
  the target and draft rules of `cfg.mesh`."""
  if cfg.runs_speculative:
    drafts_lib.check_feature_run(cfg, draft_specs(cfg))
  data = tasks.load(cfg.task, cfg.split, None, vocabulary=run_vocabulary(cfg),
                    max_input_length=cfg.max_input_length, tfds_data_dir=cfg.tfds_data_dir,
                    prompt_format=cfg.prompt_format)
  sets = prompt_sets.choose(len(data.examples), num_examples=cfg.num_examples,
                            calibration_examples=cfg.auto.calibration_examples,
                            calibration=cfg.calibration, sample=cfg.sample_examples, seed=cfg.seed)
  chosen = list(dict.fromkeys(sets.measured + sets.calibration))  # tokenized together: one width
  data = dataclasses.replace(data, examples=[data.examples[i] for i in chosen])
  preset_vocab = data.preset_vocab_size
  target, tparams = loader.load_model(cfg.target_checkpoint, vocab_size=preset_vocab,
                                      dtype=cfg.dtype, seed=cfg.seed)
  drafts = {}
  if cfg.runs_speculative:
    tables = {}

    def tables_fn():  # estimated once per run, shared by unigram and bigram
      if "t" not in tables:
        tables["t"] = ngram_tables.tables_for_run(
            cfg.ngram_tables, lambda: tasks.ngram_examples(
                cfg.task, data.examples, cfg.ngram_train_examples,
                tfds_data_dir=cfg.tfds_data_dir), data.vocab, target, log=logging.info)
      return tables["t"]
    settings = drafts_lib.DraftSettings.for_run(cfg, preset_vocab, data.examples)
    for spec in draft_specs(cfg):
      drafts[spec] = drafts_lib.load_draft(spec, target, tparams, settings, tables_fn=tables_fn,
                                           target_name=cfg.target_checkpoint)
  both = inputs_lib.Prompts.tokenized(data, target, cfg.max_input_length,
                                      truncate=cfg.truncate_inputs, buckets=cfg.prompt_buckets)
  where = {i: j for j, i in enumerate(chosen)}
  prompts = both.take([where[i] for i in sets.measured])
  calibration = both.take([where[i] for i in sets.calibration])
  if mesh is not None:  # gin/mesh/*.gin: target model-parallel, model drafts on fewer chips
    target, tparams, drafts = sharding.place_models(mesh, cfg.mesh, target, tparams, drafts,
                                                   batch_size=cfg.batch_size)
  # The weights in the layout the decode's matmul reads (packed once for the CPU kernel; on a
  # mesh XLA's dot, unchanged); everything below decodes, calibrates and times these.
  target, tparams = packed.for_backend(target, tparams, matmul=cfg.matmul, mesh=mesh)
  drafts = {k: packed.for_backend(d, dp, matmul=cfg.matmul, mesh=mesh,
                                  panels=cfg.draft_panels, role="draft")
            for k, (d, dp) in drafts.items()}
  name = DraftSpec("model", cfg.target_checkpoint).name
  return Loaded(target, tparams, name, drafts, prompts, calibration, mesh, sets.held_out)


def padded(positions, multiple: int) -> list:
  """`positions` with its last entry repeated up to a multiple of `multiple` (a short last batch
  on a data-parallel mesh); the extra rows are decoded and dropped."""
  positions = list(positions)
  return positions + positions[-1:] * (-len(positions) % multiple)


def global_batch(prompts: inputs_lib.Prompts, loaded: Loaded, positions
                 ) -> tuple[object, int]:
  """(inputs every program can take, real rows) of `prompts` at `positions`: numpy without a
  mesh, else a global array batch-sharded over the mesh (the same full batch on every process)."""
  rows = len(positions)
  if loaded.mesh is None:
    return prompts.batch(positions), rows
  batch = prompts.batch(padded(positions, loaded.data_parallel()))
  return sharding.shard_batch(batch, loaded.mesh, loaded.target.axis_rules), rows


def sampling_of(cfg: RunConfig, temperature: float) -> SamplingConfig:
  return SamplingConfig(temperature=float(temperature), top_k=int(cfg.top_k),
                        top_p=float(cfg.top_p))


def decoder_for(cfg: RunConfig, loaded: Loaded, temperature: float, spec: DraftSpec | None = None,
                scheme=Autoregressive()) -> tuple[Decoder, Params]:
  """The run's Decoder for a draft (None: the autoregressive baseline) and scheme (an int: the
  chain at that gamma), with its params; on the run's mesh when it has one. A feature-level
  draft's chain is built with the run's options (`schedule.decoding_scheme`,
  `drafts.chain_options`: its parallel block, prompt lookup first)."""
  draft, dparams = loaded.drafts[spec] if spec is not None else (None, None)
  scheme, drafter = schedule.decoding_scheme(scheme, draft, **drafts_lib.chain_options(cfg))
  decoder = Decoder(loaded.target, draft, scheme, sampling_of(cfg, temperature), rule=cfg.rule,
                    max_decode_len=cfg.max_decode_length, mesh=loaded.mesh, drafter=drafter)
  return decoder, Params(loaded.target_params, dparams)
