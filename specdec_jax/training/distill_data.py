"""The sequence-level distillation data job: decode a task's training prompts with the target (or
the draft, or a mix of both) and write the continuations as it goes (`training.seqdata`).

Why it is shaped this way:
- DistillSpec trains the draft on sequences the target generates (greedy or sampled), or the draft
  itself generates (on-policy), because that is the distribution the draft will be asked to
  predict while drafting, not the references of the data. This job produces such datasets; the
  trainer then reads a finished directory as a task (`TaskSpec.name` = its path).
- Generation runs in the framework's own batched on-device loop through its public front door
  (`decoding.decoder.Decoder`, autoregressive), so it is what a decode run does, jitted
  once per task (prompts padded to `TaskSpec.input_len`, a short last batch padded with copies
  of its last row whose outputs are dropped).
- Everything a batch depends on is a pure function of (seed, task, batch number): which model
  generates it (`mix_fraction` of the batches come from `mix_model`) and the sampling key. So a
  killed job that resumes regenerates a lost batch exactly as the uninterrupted one would have,
  and each example is written exactly once (`seqdata` says how).
- A job refuses to continue a directory written with other settings (`generation_key.json`):
  half the examples from one model and half from another would be a silent mixture.
- Decoder-only generators (the code pair) decode each prompt (the task's input, no EOS;
  `data.decoder_prompts`) and write its continuation; the index records `kind: decoder`, and the
  trainer reads such a directory as prompt + continuation sequences (a T5 model refuses it, and
  a decoder-only model a T5 directory).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from absl import logging

from specdec_jax import paths, sharding
from specdec_jax.checkpoints import detect_format, fetch, identity, loader, orbax_io, pairing
from specdec_jax.data import chat
from specdec_jax.data import tasks as tasks_lib
from specdec_jax.data import vocabulary as vocab_lib
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.models.model_config import ModelConfig, get_preset
from specdec_jax.training import data as data_lib
from specdec_jax.training import seqdata
from specdec_jax.training import shared_encoder
from specdec_jax.training import sharded as sharded_lib

KEY_FILE = "generation_key.json"


@dataclasses.dataclass(frozen=True)
class DistillDataConfig:
  """What to generate (gin binds it in `specdec_jax.distill_data`).

  Attributes:
    model: the generator checkpoint (the target, for DistillSpec's sequence-level KD).
    tasks: the source tasks; each one's train split prompts (`TaskSpec.input_len` tokens, the
      first `max_examples`) are decoded to at most `TaskSpec.target_len` tokens.
    temperature: 0 decodes greedily; > 0 samples at that temperature.
    mix_model: a second generator (the draft: on-policy data), or None. A shared-encoder draft
      may be one: it decodes on `model`'s encoder output, and only beside the target it was
      trained on (its paired_target.json).
    mix_fraction: fraction of the batches `mix_model` generates (chosen per batch from the seed).
    batch_size: prompts per decode call.
    seed: batch-to-generator choice and sampling keys.
    vocabulary: SentencePiece model for local tasks, a tokenizer.json (or its checkpoint directory,
      or a fetched checkpoint's name: `data.tasks.load_vocabulary`); None for the shipped 8k one.
    mesh: a `sharding.MeshConfig`: each generator is sharded with the target rules on that mesh
      (prompts over the data axis), as in training; None decodes on one device. Not part of the
      generation key: a job may resume on another mesh.
  """
  model: str
  tasks: Sequence[data_lib.TaskSpec]
  temperature: float = 0.0
  mix_model: str | None = None
  mix_fraction: float = 0.0
  batch_size: int = 64
  seed: int = 0
  vocabulary: str | None = None
  mesh: Any = None

  def __post_init__(self):
    if not self.tasks:
      raise ValueError("DistillDataConfig.tasks is empty: name at least one TaskSpec")
    if self.batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
    if not self.temperature >= 0.0:
      raise ValueError(f"temperature must be >= 0 (0: greedy), got {self.temperature}")
    if not 0.0 <= self.mix_fraction <= 1.0:
      raise ValueError(f"mix_fraction must lie in [0, 1], got {self.mix_fraction}")
    if self.mix_fraction > 0.0 and not self.mix_model:
      raise ValueError(f"mix_fraction is {self.mix_fraction} but no mix_model is named")
    names = [task_dir_name(s) for s in self.tasks]
    if len(set(names)) != len(names):
      raise ValueError(f"two tasks would share an output directory: {names}")


def task_dir_name(spec: data_lib.TaskSpec) -> str:
  """A task's subdirectory: its local name, or a file's name without extensions."""
  base = os.path.basename(os.path.normpath(spec.name)).split(".")[0]
  return re.sub(r"[^A-Za-z0-9_\-]", "_", base) or "task"


def generation_key(cfg: DistillDataConfig) -> dict[str, Any]:
  """Everything an example depends on (JSON-able); a resumed job must match it exactly."""
  key = dataclasses.asdict(dataclasses.replace(cfg, mesh=None))
  del key["mesh"]
  key["tasks"] = [dataclasses.asdict(t) for t in cfg.tasks]
  for task in key["tasks"]:  # the chat turns' wording, `data.chat.REVISION` (not for 'plain')
    del task["loss_on"]  # a training setting: no example depends on it
    if task.get("prompt_format", "plain") != "plain":
      task["chat_revision"] = chat.REVISION
  key["model_contents"] = identity.content_digest(fetch.resolve(cfg.model))
  key["mix_model_contents"] = identity.content_digest(fetch.resolve(cfg.mix_model))
  key["vocabulary_contents"] = identity.content_digest(
      str(fetch.resolve(cfg.vocabulary) or vocab_lib.DEFAULT_VOCAB_PATH))
  return json.loads(json.dumps(key, default=str))


def _check_key(cfg: DistillDataConfig, output_dir: str) -> None:
  path = os.path.join(output_dir, KEY_FILE)
  key = generation_key(cfg)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      old = json.load(f)
    changed = sorted(k for k in set(key) | set(old) if key.get(k) != old.get(k))
    if changed:
      raise ValueError(
          f"{output_dir} holds sequences generated with different {changed} (now "
          f"{ {k: key.get(k) for k in changed} }, was { {k: old.get(k) for k in changed} }); "
          "continuing would mix two datasets: use a new --output_dir")
    return
  os.makedirs(output_dir, exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(key, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


def peek_config(path_or_preset: str) -> ModelConfig | None:
  """A preset's or a specdec checkpoint's config without reading weights; None for other formats
  (checked once they are loaded)."""
  path_or_preset = fetch.resolve(path_or_preset)
  fmt = detect_format(path_or_preset)
  if fmt == "preset":
    return get_preset(path_or_preset)
  return orbax_io.read_config(path_or_preset) if fmt == "specdec" else None


def _check_generator(path: str, cfg: ModelConfig | None, vocab, *, is_mix: bool = False) -> None:
  if cfg is None:
    return
  if cfg.is_encoder_decoder and cfg.shares_encoder and not is_mix:
    raise ValueError(f"{path} is a shared-encoder draft (no encoder of its own): it cannot "
                     "generate alone; name it as mix_model beside its target as model (it then "
                     "decodes on the target's encoder output)")
  if cfg.vocab_size < vocab.vocab_size:
    raise ValueError(f"generator {path} has vocab_size {cfg.vocab_size}, smaller than the "
                     f"vocabulary's {vocab.vocab_size}")


def _load(path: str, vocab, mesh, batch_size: int, *, is_mix: bool = False):
  """(model, params, placement of a prompt batch): on one device, or sharded over `mesh`."""
  model, params = loader.load_model(path, dtype="float32", sharding=loader.HOST, scan_layers=False)
  _check_generator(path, model.config, vocab, is_mix=is_mix)
  if mesh is None:
    return model, jax.tree.map(jax.numpy.asarray, params), lambda x: x
  tm, model, _ = sharded_lib.setup(mesh, model, batch_size=batch_size, name=f"generator {path}")
  params = tm.place(params, tm.param_shardings(model))
  return model, params, lambda x: tm.batch({"x": x})["x"]


def _with_target_encoder(cfg: DistillDataConfig, generators: dict):
  """A shared-encoder mix_model decodes on `model`'s encoder output (on-policy data for a draft
  that reads its target's encoder): only beside the target it was trained on."""
  draft, dparams, place = generators[cfg.mix_model]
  target, tparams, _ = generators[cfg.model]
  pairing.check(cfg.mix_model, draft_name=cfg.mix_model, target_name=cfg.model,
                target_params=tparams)
  model, params = shared_encoder.standalone(draft, dparams, target, tparams)
  return model, params, place


def uses_mix(cfg: DistillDataConfig, task_idx: int, batch: int) -> bool:
  """Whether `mix_model` generates batch `batch` of task `task_idx` (pure in its arguments)."""
  if cfg.mix_fraction <= 0.0:
    return False
  return bool(np.random.default_rng([cfg.seed, task_idx, batch]).random() < cfg.mix_fraction)


def _batch_rng(seed: int, task_idx: int, batch: int) -> jax.Array:
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), task_idx), batch)


def generate(cfg: DistillDataConfig, output_dir: str, *, crash_after_batches: int | None = None
             ) -> dict[str, Any]:
  """Generates (or resumes) every task into OUTPUT_DIR/<task>/; returns a summary per task.

  `crash_after_batches` raises after that many batches of this call have been indexed,
  simulating a kill (tests).
  """
  output_dir = os.path.abspath(paths.check_writable(output_dir, "distillation data"))
  if cfg.mesh is not None:  # forced host devices must be set before jax's first device use
    sharding.force_cpu_devices(cfg.mesh.num_cpu_devices)
  vocab = tasks_lib.load_vocabulary(cfg.vocabulary, required=True)
  configs = {path: peek_config(path) for path in filter(None, (cfg.model, cfg.mix_model))}
  kinds = {c.kind for c in configs.values() if c is not None}
  if len(kinds) > 1:
    raise ValueError(f"model and mix_model are of different kinds ({sorted(kinds)}): one "
                     "directory holds one kind of sequence")
  is_mix = lambda path: path == cfg.mix_model != cfg.model  # noqa: E731
  for path, model_cfg in configs.items():
    _check_generator(path, model_cfg, vocab, is_mix=is_mix(path))
  decoder_only = kinds == {"decoder"}
  tasks = [data_lib.decoder_prompts(spec, vocab, "train") if decoder_only
           else data_lib.tokenize_task(spec, vocab, True, "train") for spec in cfg.tasks]
  generators = {path: _load(path, vocab, cfg.mesh, cfg.batch_size, is_mix=is_mix(path))
                for path in filter(None, (cfg.model, cfg.mix_model))}
  if cfg.mix_model and generators[cfg.mix_model][0].shares_encoder:
    generators[cfg.mix_model] = _with_target_encoder(cfg, generators)
  for path, (model, _, _) in generators.items():  # formats peek_config cannot read (HF, T5X)
    if (model.kind == "decoder") != decoder_only:
      raise ValueError(f"{path} is a {model.kind} model, and the job prepared "
                       f"{'decoder-only' if decoder_only else 'T5'} prompts; convert it "
                       "(python -m specdec_jax.convert) so its kind is known up front")
  _check_key(cfg, output_dir)  # bad input has raised by now, having written nothing
  sampling = SamplingConfig(temperature=cfg.temperature)
  summary, budget = {}, [crash_after_batches]
  with contextlib.ExitStack() as stack:
    if cfg.mesh is not None:
      stack.enter_context(jax.set_mesh(sharding.make_mesh(cfg.mesh)))
    for task_idx, (spec, task) in enumerate(zip(cfg.tasks, tasks)):
      summary[spec.name] = _generate_task(cfg, spec, task_idx, task, generators, sampling,
                                          os.path.join(output_dir, task_dir_name(spec)), budget)
  with open(os.path.join(output_dir, "generation_summary.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
  return summary


def _lines(inputs_NxP, rows, generator: str, result) -> str:
  """sequences.jsonl's lines of one batch (its real rows: the batch is padded to a fixed shape)."""
  tokens_BxN, lengths_B = jax.device_get((result.tokens_BxN, result.lengths_B))
  out = []
  for j, row in enumerate(rows):
    inputs = inputs_NxP[row]
    out.append(json.dumps({
        "index": int(row), "generator": generator,
        "input_ids": inputs[inputs != vocab_lib.PAD_ID].tolist(),
        "output_ids": tokens_BxN[j, :int(lengths_B[j])].tolist()}) + "\n")
  return "".join(out)


def _generate_task(cfg: DistillDataConfig, spec: data_lib.TaskSpec, task_idx: int,
                   task: data_lib.TokenizedTask, generators: dict, sampling: SamplingConfig,
                   out: str, budget: list) -> dict[str, Any]:
  n, b = task.size, cfg.batch_size
  num_batches = math.ceil(n / b)
  os.makedirs(out, exist_ok=True)
  kind = next(iter(generators.values()))[0].kind
  index = seqdata.read_index(out) or {
      "source_task": spec.name, "examples_total": n, "batch_size": b, "batches_done": 0,
      "examples_done": 0, "bytes": 0, "seconds": 0.0, "complete": False, "kind": kind}
  if (index["examples_total"], index["batch_size"]) != (n, b):
    raise ValueError(f"{out}: its index is for {index['examples_total']} examples in batches of "
                     f"{index['batch_size']}, this job has {n} in batches of {b}")
  seq_path = os.path.join(out, seqdata.SEQUENCES)
  size = os.path.getsize(seq_path) if os.path.exists(seq_path) else 0
  if size < index["bytes"]:
    raise ValueError(f"{seq_path} has {size} bytes, fewer than the {index['bytes']} its index "
                     "records as written: the directory is damaged; use a new --output_dir")
  with open(seq_path, "ab") as f:  # drop lines written after the last index update
    f.truncate(index["bytes"])
  if index["complete"]:
    logging.info("%s: complete (%d examples)", spec.name, n)
    return index
  logging.info("%s: %d examples, resuming at batch %d of %d", spec.name, n,
               index["batches_done"], num_batches)
  t0, seconds_before = time.perf_counter(), index["seconds"]
  with open(seq_path, "ab") as f:
    for k in range(index["batches_done"], num_batches):
      rows = np.arange(k * b, min((k + 1) * b, n))
      take = np.concatenate([rows, np.full(b - len(rows), rows[-1])])  # a fixed shape
      name = cfg.mix_model if uses_mix(cfg, task_idx, k) else cfg.model
      model, params, place = generators[name]
      # T5: up to target_len output tokens; decoder-only: what target_len leaves after the prompt.
      budget_len = spec.target_len - (0 if kind == "t5" else task.inputs_NxP.shape[1])
      result = Decoder(model, sampling=sampling, max_decode_len=budget_len).generate(
          Params(params), place(task.inputs_NxP[take]), _batch_rng(cfg.seed, task_idx, k))
      f.write(_lines(task.inputs_NxP, rows, name, result).encode("utf-8"))
      f.flush()
      os.fsync(f.fileno())
      index.update(batches_done=k + 1, examples_done=int(rows[-1]) + 1, bytes=f.tell(),
                   seconds=round(seconds_before + time.perf_counter() - t0, 2))
      seqdata.write_index(out, index)
      if (k + 1) % 10 == 0 or k + 1 == num_batches:
        done = index["examples_done"]
        logging.info("%s: %d / %d examples, %.1f examples/s", spec.name, done, n,
                     done / max(index["seconds"], 1e-9))
      if budget[0] is not None:
        budget[0] -= 1
        if budget[0] <= 0:
          raise RuntimeError(f"simulated crash after batch {k + 1} of {spec.name}")
  index.update(complete=True, sha256=seqdata.file_digest(out))
  seqdata.write_index(out, index)
  return index
