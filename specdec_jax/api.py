"""The public Python API: load a target and a draft as the CLI does, decode strings or token ids.

  import specdec_jax as sd
  pair = sd.load("specdec_jax/assets/zoo/t5_target", "specdec_jax/assets/zoo/t5_shared_draft",
                 task="translate_en_de", head_vocab=3072)
  out = pair.generate(["The car is in the garage."], gamma=3)
  out.texts, out.ids, out.alpha, out.tokens_per_call
  pair.benchmark(texts, gamma=3).speedup   # autoregressive / speculative wall time, interleaved

Why a module of its own, and why it calls what it calls: `python -m specdec_jax.run` loads the
target through the one model loader (`checkpoints.loader`), makes the draft through
`runner.drafts.load_draft` (kind and vocabulary checked against the target, a shared-encoder
draft's pairing record checked against the target's encoder, the output head restricted to the
checkpoint's token ranking), packs both for the CPU matmul kernel (`models.packed.for_backend`),
builds one `decoding.decoder.Decoder` per scheme and decodes fixed-width batches through the front
door (`Decoder.generate`), timed by the one timer (`timing.interleaved`). A hand-built pipeline
that skipped any of these ran slower than plain decoding (no packing, the full head, one compile
per prompt length) or drafted noise without an error (a foreign shared-encoder draft). So this
module calls those same functions and adds only what a caller of Python needs: strings in and out
(`data.tasks.tokenize`, the task's input prefix), and length buckets.

Buckets: every compiled program is specialised to its batch shape, and compiling a whole decode
takes seconds on a CPU. Prompts are right-padded to the next multiple of `WIDTH_MULTIPLE` tokens
and a short batch is filled up to the next power of two rows (with copies of its last prompt,
decoded and dropped), so a new prompt length or a few prompts more do not compile again. Padding
does not change the output (the pad id is masked), and the counters are per example, so the
filler rows are left out of them.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Optional

import jax
import numpy as np

from specdec_jax import seam, timing
from specdec_jax.checkpoints import loader
from specdec_jax.data import hf_tokenizer, humaneval as humaneval_lib, local_tasks, ngram_tables, tasks
from specdec_jax.decoding.adaptive import AdaptiveConfig
from specdec_jax.decoding.decoder import Decoder, Params
from specdec_jax.decoding.sampling import SamplingConfig
from specdec_jax.decoding.tree.dynamic import DynamicTreeScheme
from specdec_jax.decoding.tree.scheme import TreeScheme
from specdec_jax.metrics import acceptance_stats, code_exec
from specdec_jax.models import packed
from specdec_jax.runner import drafts as drafts_lib, schedule
from specdec_jax.runner.run_config import NON_MODEL_DRAFTS, DraftSpec, checkpoint_kind
from specdec_jax.api_results import Benchmark, Generation

WIDTH_MULTIPLE = 32
# The input field whose prefix a shipped task's strings get ("translate English to German: ").
TASK_FIELDS = {task: field for field, task in tasks.FIELD_TASKS.items()}
NGRAM_TRAIN_EXAMPLES = 20000  # RunConfig.ngram_train_examples' default
# HumanEval for a pair loaded with task='humaneval': its problems, and pass@k of completions.
humaneval = humaneval_lib.problems
pass_at_k = code_exec.score


def load(target: str, draft: Optional[str] = None, *, task: Optional[str] = None,
         head_vocab: int = 0, vocabulary: Any = None, max_input_length: int = 512,
         dtype: Optional[str] = None, seed: int = 0, draft_panels: str = "auto") -> Pair:
  """Loads a target and a draft exactly as `python -m specdec_jax.run` loads them.

  Args:
    target: a checkpoint directory (this project's, T5X or Hugging Face; a relative path is also
      looked for under the repository root, so the zoo's paths work from any directory) or a
      preset name for random weights (`specdec_jax.models.model_config.PRESETS`).
    draft: a checkpoint or preset for a model draft; a feature-level draft's export (a directory
      with `feature_draft_config.json`, trained for this very target: its pairing record is
      checked; it decodes with `FeatureDrafter`); 'unigram', 'bigram' or 'prompt_lookup' for a
      model-free draft (the first two estimate n-gram tables on `task`'s train split); a corpus
      index (an .npz of scripts/corpus_index.py over the target's tokenizer) for corpus lookup
      (a run's `DRAFT='corpus_lookup'` with `RunConfig.lookup_corpus`); None: the target alone
      (only `gamma=0` decodes).
    task: a shipped task ('translate_en_de', 'summarize', 'code_complete') or 'humaneval' (which
      drafts as 'code_complete'; its problems: `humaneval()`, scored by `pass_at_k`). Strings get
      its input prefix ("translate English to German: ", "summarize: ", none for code), and a
      restricted head takes its token ranking. None: strings are fed as given, the ranking is
      the mixture's.
    head_vocab: K > 0 restricts the draft's output head to the K tokens its checkpoint's
      `head_ranking.json` ranks first (the run's `draft_head_vocab`; configs/local/ende.gin uses
      3072). Exact for any K: only alpha and the draft's step time change. 0: the full head.
    vocabulary: a SentencePiece `.model` file (or a tokenizer.json) to tokenize strings and
      detokenize outputs with; None: the tokenizer.json beside a checkpoint target (a Hugging
      Face directory, a converted GGUF, a fetched name such as 'smollm2-135m-instruct'), as a
      run reads it, else the shipped one; False: none (token ids in and out only). A random preset takes the
      vocabulary's padded size, as in a run whose task has text; with False it keeps its own.
    max_input_length: prompts longer than this many tokens are cut to it, EOS kept (the run's
      `max_input_length`).
    dtype: the compute dtype ('float32' or 'bfloat16'); None: the checkpoint's (the zoo computes
      in float32; bfloat16 is ~20x slower on CPU).
    seed: the random init of a preset (a preset draft gets seed + 1, so it is not a copy).
    draft_panels: a model draft's packed weights (the run's `draft_panels`): 'auto' (lossless
      bfloat16 or float32 panels), 'float32', 'int8' (per-column int8: a cheaper, different
      draft; outputs keep the target's distribution) or 'q4' (Q4_1's 4-bit blocks: SmolLM2's
      own projection weights); 'int8' and 'q4' need the CPU kernel (one CPU device).

  Returns:
    A `Pair`, its weights packed for the CPU matmul kernel where that is faster (one CPU device).

  Raises:
    ValueError or FileNotFoundError, as the run does, before anything is compiled: a draft of
    another kind or vocabulary than the target, a shared-encoder draft whose pairing record names
    another target, `head_vocab` without a ranking, a missing checkpoint, an unknown task.
  """
  _check_load_args(task, head_vocab, max_input_length)
  if draft_panels not in packed.PANELS:
    raise ValueError(f"draft_panels must be one of {packed.PANELS}, got {draft_panels!r}")
  task = _standing_for(task)
  if vocabulary is None and not loader.is_preset(target):
    vocabulary = hf_tokenizer.beside(loader.local_path(target))  # the run's rule (pipeline)
  vocab = None if vocabulary is False else tasks.load_vocabulary(vocabulary, required=False)
  preset_vocab = None if vocab is None else vocab.padded_vocab_size
  target_model, target_params = loader.load_model(target, vocab_size=preset_vocab, dtype=dtype,
                                                   seed=seed)
  draft_model = draft_params = None
  if draft is not None:
    settings = drafts_lib.DraftSettings(vocab_size=preset_vocab, dtype=dtype, seed=seed,
                                        head_vocab=head_vocab, task=task,
                                        lookup_corpus=_corpus(draft), panels=draft_panels)
    draft_model, draft_params = drafts_lib.load_draft(
        _draft_spec(draft), target_model, target_params, settings,
        tables_fn=_tables_fn(task, vocab, target_model), target_name=target)
    draft_model, draft_params = packed.for_backend(draft_model, draft_params,
                                                   panels=draft_panels, role="draft")
  target_model, target_params = packed.for_backend(target_model, target_params)
  return Pair(target_model, draft_model, Params(target_params, draft_params), vocab=vocab,
              task=task, max_input_length=max_input_length, names=(target, draft))


def _check_load_args(task, head_vocab, max_input_length) -> None:
  shipped = task in local_tasks.LOCAL_TASKS
  if task is not None and not shipped and humaneval_lib.samples(task) is None:
    raise ValueError(f"task must be None, a shipped task ({', '.join(local_tasks.LOCAL_TASKS)}) or "
                     f"'humaneval', got {task!r}")
  for name, value, least in (("head_vocab", head_vocab, 0),
                             ("max_input_length", max_input_length, 1)):
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
      raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


def _standing_for(task: Optional[str]) -> Optional[str]:
  """HumanEval prompts are code completions: no prefix, the code task's n-gram tables and token
  ranking (`data.humaneval`: the task stands for `code_complete`, as in a run)."""
  return "code_complete" if task is not None and humaneval_lib.samples(task) else task


def _corpus(draft) -> Optional[str]:
  """A draft named by a corpus index file is corpus lookup over it."""
  return draft if isinstance(draft, str) and draft.endswith(".npz") else None


def _draft_spec(draft: str) -> DraftSpec:
  if not isinstance(draft, str):
    raise TypeError(f"draft must be a checkpoint path, a preset name, a corpus index (.npz) or "
                    f"one of {NON_MODEL_DRAFTS}, got {type(draft).__name__}")
  if _corpus(draft):
    return DraftSpec("corpus_lookup")
  return DraftSpec(draft) if draft in NON_MODEL_DRAFTS else DraftSpec(checkpoint_kind(draft),
                                                                      draft)


def _tables_fn(task, vocab, target):
  """The n-gram tables of a unigram or bigram draft, estimated on `task`'s train split (cached on
  disk, `data.ngram_tables`) as a run without `ngram_tables` does; None without a task."""
  if task is None:
    return None
  return lambda: ngram_tables.tables_for_run(
      None, lambda: tasks.ngram_examples(task, [], NGRAM_TRAIN_EXAMPLES), vocab, target)


@dataclasses.dataclass(frozen=True)
class _Batch:
  """Prompts `first`.. `first + rows - 1`, padded to a bucket: int32 [rows', width]."""

  first: int
  rows: int
  inputs_BxP: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class Pair:
  """A target and its draft as a run decodes them; made by `load`.

  Attributes:
    target, draft: the models behind the decoding seam (`specdec_jax.seam`), as they decode:
      packed for the CPU kernel, the draft's head restricted. draft is None for the target alone.
    params: their weights, `decoding.decoder.Params(target, draft)`.
    vocab: the SentencePiece vocabulary strings are tokenized with (None if there is none).
    task: the shipped task whose prefix strings get (None: no prefix).
    max_input_length: prompts are cut to this many tokens.
    names: (target, draft) as given to `load`.
  """

  target: Any
  draft: Any
  params: Params
  vocab: Any = None
  task: Optional[str] = None
  max_input_length: int = 512
  names: tuple = ()
  _timed: set = dataclasses.field(default_factory=set, init=False, repr=False)  # (decoder, shape)

  def decoder(self, gamma: Any = None, *, temperature: float = 0.0, top_k: int = 0,
              top_p: float = 1.0, max_new_tokens: int = 64, tree: Any = None,
              parallel: bool = False, lookup_gamma: int = 0, lookup_ngram: int = 2
              ) -> Decoder:
    """The `Decoder` `generate` runs (checked when made: `decoding.start.check_decoder`); for
    research code that drives `init`, `iteration` and `run` itself.

    Args:
      gamma: draft tokens per target call; 0: plain autoregressive decoding with the target
        alone (the baseline); 'adaptive': a per-example draft length up to 8
        (`decoding.adaptive`, any draft); 'tree': a static draft tree per target call, `tree`
        (`decoding.tree`; model drafts only; a feature-level draft drafts it, static or
        dynamic, from the target's states, `decoding.drafter`); None: 4 with a draft, else 0;
        or the scheme itself (`Chain(3)`, a `TreeScheme`, `DynamicTreeScheme`,
        `LookupTreeScheme`, `AdaptiveConfig`, or `runner.schedule.FeatureChain(2,
        lookup_gamma=6)`: a feature draft's chain with its options), as a run's GAMMA may be.
      temperature: 0 decodes greedily (the speculative output then equals the target's own,
        token for token); > 0 samples, exactly from the target's distribution.
      top_k: sample among the k most likely tokens only (0: off); applied alike to the target
        and the draft, as every logits processor is (exactness needs it).
      top_p: sample from the smallest set of tokens holding this much probability (1.0: off).
      max_new_tokens: tokens generated per prompt at most (the run's MAX_DECODE_LENGTH).
      tree: with gamma='tree', the tree: a branching per depth ((3, 2, 1), the default: 3 + 6
        + 6 drafted nodes, depth 3), a `decoding.tree.Tree`, a `TreeScheme` (its verifier too),
        or a `DynamicTreeScheme` (a dynamic, EAGLE-2-style tree). Refused beside a gamma that
        is a scheme object (that object is the tree).
      parallel: a feature-level draft proposes the whole block in one call
        (`decoding.drafter.FeatureDrafter(parallel=True)`: mask entries, trained by the block
        loss; the run's `RunConfig.feature.parallel`); False: one call per drafted token.
      lookup_gamma: > 0 with a feature-level draft or a model self-draft: prompt lookup drafts
        this many tokens in the iterations whose last n-gram matches at least `lookup_ngram`
        tokens, the draft `gamma` elsewhere (`decoding.lookup_feature`; a self-draft drafting in
        the target's cache, `decoding.lookup_token`; the run's `RunConfig.feature.lookup_gamma`).
    """
    if gamma is None:
      gamma = 0 if self.draft is None else 4
    if tree is not None and gamma != schedule.TREE:
      raise ValueError(f"tree= chooses the tree of gamma='tree'; with gamma={gamma!r} it would "
                       "be ignored (a scheme object given as gamma is its own tree)")
    gamma, given = schedule.lower(gamma)  # a scheme object (Chain, TreeScheme, ...) in shorthand
    if "feature_parallel" in given:  # a FeatureChain: its fields are these keyword arguments
      if parallel or lookup_gamma:
        raise ValueError("a FeatureChain gamma carries its own parallel / lookup_gamma options")
      parallel, lookup_gamma, lookup_ngram = (given["feature_parallel"],
                                              given["feature_lookup_gamma"],
                                              given["feature_lookup_ngram"])
    gamma = int(gamma) if _is_int(gamma) else gamma
    if gamma not in (schedule.ADAPTIVE, schedule.TREE) and not (_is_int(gamma) and gamma >= 0):
      raise ValueError(f"gamma must be an integer >= 0 (0: the target alone), 'adaptive', "
                       f"'tree' or a scheme, got {gamma!r} ('auto' is the run's autotuner: "
                       "python -m specdec_jax.run with GAMMA = 'auto')")
    value = (given.get("tree") or _tree_scheme(tree) if gamma == schedule.TREE
             else given.get("adaptive") or AdaptiveConfig() if gamma == schedule.ADAPTIVE
             else gamma)
    schedule.check_pair(gamma, self.draft, parallel=parallel, lookup_gamma=lookup_gamma,
                        trees=[value] if gamma == schedule.TREE else [])
    scheme, drafter = schedule.decoding_scheme(value, self.draft, parallel=parallel,
                                               lookup_gamma=lookup_gamma,
                                               lookup_ngram=lookup_ngram)
    draft = None if gamma == 0 else self.draft
    if scheme.needs_draft and draft is None:
      raise ValueError(f"gamma={gamma!r} drafts, but this Pair has no draft: load(target, "
                       "draft=...), or gamma=0 for the target alone")
    return Decoder(self.target, draft, scheme,
                   SamplingConfig(float(temperature), top_k, float(top_p)),
                   max_decode_len=max_new_tokens, drafter=drafter)

  def tokenize(self, inputs) -> list[list[int]]:
    """The token ids the target reads for `inputs` (see `generate`): strings with the task's
    prefix and, for T5, EOS; ids as given (trailing pad ids dropped)."""
    prompts = _prompts(inputs)
    field = TASK_FIELDS.get(self.task, "inputs")
    examples = [local_tasks.example_from_record(
        {field: p} if isinstance(p, str) else {local_tasks.IDS_FIELD: p}, i, f"prompt {i}")
                for i, p in enumerate(prompts)]
    has_text = tasks.needs_text(examples)
    if has_text and self.vocab is None:
      raise ValueError("string prompts need a vocabulary: load(..., vocabulary='x.model'), or "
                       "pass token ids")
    ids = tasks.tokenize(examples, self.vocab if has_text else None,
                         model_vocab_size=self.target.vocab_size,
                         encoder_decoder=seam.is_encoder_decoder(self.target),
                         max_input_length=self.max_input_length)
    return [row[:max(i for i, t in enumerate(row) if t) + 1] for row in ids]

  def detokenize(self, ids: Sequence[int]) -> Optional[str]:
    """Text of generated ids up to EOS; None when the target's ids are not the vocabulary's."""
    vocab = tasks.vocab_for_decoding(self.vocab, self.target.vocab_size)
    return None if vocab is None else vocab.decode(list(ids))

  def generate(self, inputs, *, batch_size: int = 1, seed: int = 0, **decoding) -> Generation:
    """Decodes `inputs`: speculatively with the draft, or with the target alone (gamma=0).

    Args:
      inputs: a string, a list of strings, a list of token ids, or a list of such lists (or a
        2-D int array of right-padded rows). Strings get the task's prefix and are tokenized
        with the vocabulary (T5: EOS appended); ids are fed exactly as given (no EOS added), as
        a JSONL `input_ids` line is.
      batch_size: prompts decoded together. 1 (the default, the papers' and the main command's
        setting) measures latency; a larger batch raises throughput, and speculation pays less.
      seed: the sampling key (batch k starting at prompt i uses fold_in(key(seed), i), as a run).
      **decoding: how to decode, `decoder`'s keyword arguments: gamma, temperature, top_k,
        top_p, max_new_tokens, tree, parallel, lookup_gamma, lookup_ngram (e.g.
        `generate(texts, gamma=4, temperature=1.0)`).

    Returns:
      A `Generation`: texts, ids, the acceptance counters and the wall time.
    """
    decoder = self.decoder(**decoding)
    results, seconds, compile_seconds = [], 0.0, 0.0
    for batch in self._batches(inputs, batch_size):
      result, s, c = self._timed_call(decoder, batch, seed)
      results.append((batch, result))
      seconds, compile_seconds = seconds + s, compile_seconds + c
    return self._generation(decoder, results, seconds, compile_seconds)

  def benchmark(self, inputs, *, repeats: int = 3, **options) -> Benchmark:
    """Decodes `inputs` with the target alone and speculatively, batch by batch, the two timed
    side by side by `timing.interleaved` (each program's first call untimed, then `repeats`
    rounds in rotating order, the median kept), exactly as a run in MODE='benchmark' times them.

    Args:
      inputs: as `generate`'s.
      repeats: timed rounds per batch (the run's `repeats`).
      **options: `generate`'s keyword arguments (gamma must not be 0).
    """
    decoding = {k: v for k, v in options.items() if k not in ("batch_size", "seed")}
    spec, ar = self.decoder(**decoding), self.decoder(**dict(decoding, gamma=0))
    if spec.draft is None:
      raise ValueError("benchmark compares speculative with autoregressive decoding: give a "
                       "gamma > 0 (and load a draft)")
    if not _is_int(repeats) or repeats < 1:
      raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    decoders = {"ar": ar, "spec": spec}
    results, seconds = {k: [] for k in decoders}, {k: 0.0 for k in decoders}
    for batch in self._batches(inputs, options.get("batch_size", 1)):
      inputs_BxP, rng = self._device_inputs(batch, options.get("seed", 0))
      calls = {k: (lambda d=d: d.generate(self.params, inputs_BxP, rng))
               for k, d in decoders.items()}
      outs, medians = timing.interleaved(calls, repeats)
      for k in decoders:
        results[k].append((batch, outs[k]))
        seconds[k] += medians[k]
    return Benchmark(*(self._generation(decoders[k], results[k], seconds[k], None)
                       for k in ("ar", "spec")))

  # ---- batches, calls, results ---------------------------------------------------------------
  def _batches(self, inputs, batch_size: int) -> list[_Batch]:
    """`inputs` tokenized, in batches of `batch_size` padded to their buckets."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
      raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    ids = self.tokenize(inputs)
    out = []
    for first in range(0, len(ids), batch_size):
      rows = ids[first:first + batch_size]
      filled = rows + rows[-1:] * (min(batch_size, _next_power_of_two(len(rows))) - len(rows))
      width = -(-max(len(r) for r in rows) // WIDTH_MULTIPLE) * WIDTH_MULTIPLE
      inputs_BxP = local_tasks.batch_inputs(filled, pad_to=width, pad_id=self.target.pad_id)
      out.append(_Batch(first, len(rows), inputs_BxP))
    return out

  def _device_inputs(self, batch: _Batch, seed: int):
    if not isinstance(seed, int) or isinstance(seed, bool):
      raise ValueError(f"seed must be an integer, got {seed!r}")
    return (jax.device_put(batch.inputs_BxP),
            jax.random.fold_in(jax.random.key(seed), batch.first))

  def _timed_call(self, decoder: Decoder, batch: _Batch, seed: int):
    """(result, decode seconds, compile seconds). The first call of a decoder at a batch shape
    compiles it (or finds it compiled); it is then called once more and that call is timed."""
    inputs_BxP, rng = self._device_inputs(batch, seed)

    def call():
      t0 = time.perf_counter()
      result = jax.block_until_ready(decoder.generate(self.params, inputs_BxP, rng))
      return result, time.perf_counter() - t0
    result, seconds = call()
    key = (decoder, batch.inputs_BxP.shape)
    if key in self._timed:
      return result, seconds, 0.0
    self._timed.add(key)
    _, again = call()
    return result, again, max(0.0, seconds - again)

  def _generation(self, decoder: Decoder, results, seconds: float,
                  compile_seconds: Optional[float]) -> Generation:
    ids, counters = [], []
    for batch, result in results:
      tokens, lengths = np.asarray(result.tokens_BxN), np.asarray(result.lengths_B)
      ids += [tokens[i, :lengths[i]].astype(int).tolist() for i in range(batch.rows)]
      counters.append(acceptance_stats.counters_to_dict(result.counters, batch.rows))
    texts = [self.detokenize(row) for row in ids]
    return Generation(texts=None if None in texts else texts, ids=ids,
                      counters=acceptance_stats.merge(counters), seconds=seconds,
                      compile_seconds=compile_seconds, gamma=decoder.gamma,
                      temperature=decoder.sampling.temperature)


def _prompts(inputs) -> list:
  """`inputs` as a list of prompts, each a string or a list of ints; a TypeError or ValueError
  naming the prompt that is neither."""
  if isinstance(inputs, np.ndarray):
    inputs = inputs.tolist() if inputs.ndim == 2 else [inputs.tolist()]
  if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs
                                 and all(_is_int(t) for t in inputs)):
    inputs = [inputs]
  if not isinstance(inputs, (list, tuple)):
    raise TypeError(f"inputs must be a string, a list of strings or a list of token-id lists, "
                    f"got {type(inputs).__name__}")
  if not inputs:
    raise ValueError("no prompts: inputs is empty")
  out = []
  for i, p in enumerate(inputs):
    if isinstance(p, np.ndarray):
      p = p.tolist()
    if isinstance(p, str):
      if not p.strip():
        raise ValueError(f"prompt {i} is an empty string")
      out.append(p)
    elif isinstance(p, (list, tuple)):
      if not all(_is_int(t) for t in p):
        raise TypeError(f"prompt {i}: token ids must be ints, got "
                        f"{sorted({type(t).__name__ for t in p if not _is_int(t)})}")
      out.append([int(t) for t in p])
    else:
      raise TypeError(f"prompt {i} is a {type(p).__name__}; a prompt is a string or a list of "
                      "token ids")
  return out


def _tree_scheme(tree) -> TreeScheme | DynamicTreeScheme:
  """gamma='tree''s scheme: `tree` as given (a TreeScheme or a DynamicTreeScheme), or a
  branching / Tree with the 'auto' verifier; None: the (3, 2, 1) tree."""
  if tree is None:
    return TreeScheme()
  return tree if isinstance(tree, (TreeScheme, DynamicTreeScheme)) else TreeScheme(tree)


def _is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _next_power_of_two(n: int) -> int:
  return 1 << (n - 1).bit_length()
