"""seqio task registration: the papers' tasks and the local tasks, when the `seqio` extra is installed.

Why optional: seqio pulls in TensorFlow (~3 GB); the local path (JSONL tasks, runs, tests) never
imports it. Importing this module is cheap; `register_tasks()` imports seqio on first use and
registers, once per process:

- `wmt_t2t_ende_v003`: TFDS `wmt_t2t_translate/de-en:1.0.0`, inputs "translate English to German: "
  + en, targets de (T5's task of the same name, without the `t5` package); BLEU.
- `cnn_dailymail`: TFDS `cnn_dailymail:3.4.0`, inputs "summarize: " + article, targets highlights
  (T5's `cnn_dailymail_v002`); ROUGE.
  Both use the T5 v1.1 SentencePiece vocabulary (32,100 ids) and T5's tokenize + append-EOS.
- `specdec_translate_en_de`, `specdec_summarize`, `specdec_code_complete`: the shipped local
  tasks (same inputs, prefixes and references as specdec_jax.data.local_tasks) with the shipped 8k
  vocabulary, through a FunctionDataSource (no TFDS, no download).

`load_examples(task, split, n)` turns a seqio task's examples into local `Example`s (input ids as
seqio tokenized them, input and reference text from the `*_pretokenized` features), which is how a
run's `TASK` may name a seqio task.
"""
from __future__ import annotations

import importlib.util
from typing import Any

from specdec_jax.data import local_tasks

T5_VOCABULARY = "gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model"
PAPER_TASKS = {
    "wmt_t2t_ende_v003": dict(tfds_name="wmt_t2t_translate/de-en:1.0.0", metric="bleu"),
    "cnn_dailymail": dict(tfds_name="cnn_dailymail:3.4.0", metric="rouge"),
    # Chen et al. (2023): XSum for a decoder-only model (prompt: XSUM_TEMPLATE); ROUGE-2.
    "xsum": dict(tfds_name="xsum:1.1.0", metric="rouge"),
}
# A completion-style prompt (no task prefix: a decoder-only LM continues it with the summary).
XSUM_TEMPLATE = ("Article: ", "\n\nOne-sentence summary:")
LOCAL_PREFIX = "specdec_"
LOCAL_SEQIO_TASKS = {LOCAL_PREFIX + name: name for name in local_tasks.LOCAL_TASKS}
TASK_METRICS = {**{k: v["metric"] for k, v in PAPER_TASKS.items()},
                LOCAL_PREFIX + "translate_en_de": "bleu", LOCAL_PREFIX + "summarize": "rougeL",
                LOCAL_PREFIX + "code_complete": "exact_match"}
SPLIT_ALIASES = {"valid": "validation", "validation": "valid"}

_REGISTERED: list[str] = []


def seqio_available() -> bool:
  """Whether seqio is installed (checked without importing it, i.e. without TensorFlow)."""
  return importlib.util.find_spec("seqio") is not None


def all_task_names() -> list[str]:
  return [*PAPER_TASKS, *LOCAL_SEQIO_TASKS]


def is_seqio_task(name: str) -> bool:
  """True for the names this module registers (and, if seqio is installed, any registered task)."""
  if name in PAPER_TASKS or name in LOCAL_SEQIO_TASKS:
    return True
  if not seqio_available() or "/" in name or name.endswith((".jsonl", ".xz", ".gz")):
    return False
  register_tasks()
  import seqio
  return name in seqio.TaskRegistry.names()


def _require_seqio():
  if not seqio_available():
    raise ImportError("seqio tasks need the seqio extra: pip install 'specdec_jax[seqio]' "
                      "(or use a local task / JSONL path)")
  import seqio
  return seqio


def _metric(kind: str):
  from specdec_jax.metrics import quality

  def fn(targets, predictions):
    return quality.score(kind, list(predictions), list(targets))
  fn.__name__ = kind
  return fn


def _text_preprocessor(input_key: str, target_key: str, prefix: str, suffix: str = ""):
  """x -> {inputs: prefix + x[input_key] + suffix, targets: x[target_key]} (T5's translate /
  summarize; XSum's completion prompt)."""
  import tensorflow as tf

  def fn(ds):
    return ds.map(lambda x: {"inputs": tf.strings.join([prefix, x[input_key], suffix]),
                             "targets": x[target_key]},
                  num_parallel_calls=tf.data.AUTOTUNE)
  return fn


def _local_dataset_fn(local_name: str):
  def dataset_fn(split: str, shuffle_files: bool = False, seed: int | None = None):
    import tensorflow as tf
    del shuffle_files, seed  # one file per split
    split = split if split in local_tasks.SPLITS else SPLIT_ALIASES.get(split, split)
    examples = local_tasks.load_examples(local_name, split)
    return tf.data.Dataset.from_tensor_slices({
        "inputs": [ex.inputs for ex in examples],
        "targets": [ex.reference or "" for ex in examples]})
  return dataset_fn


def register_tasks(tfds_data_dir: str | None = None, t5_vocabulary: str = T5_VOCABULARY
                   ) -> list[str]:
  """Registers the paper and local tasks in seqio's TaskRegistry (once); returns their names."""
  if _REGISTERED:
    return list(_REGISTERED)
  seqio = _require_seqio()
  from specdec_jax.data import vocabulary as vocab_lib

  def features(vocab):
    return {"inputs": seqio.Feature(vocab, add_eos=True, required=False),
            "targets": seqio.Feature(vocab, add_eos=True)}
  tokenize = [seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder(),
              seqio.preprocessors.append_eos_after_trim]
  t5_vocab = seqio.SentencePieceVocabulary(t5_vocabulary)  # loaded lazily, on first use
  paper_pre = {
      "wmt_t2t_ende_v003": _text_preprocessor("en", "de", local_tasks.INPUT_PREFIXES["en"]),
      "cnn_dailymail": _text_preprocessor("article", "highlights",
                                          local_tasks.INPUT_PREFIXES["document"]),
      "xsum": _text_preprocessor("document", "summary", *XSUM_TEMPLATE),
  }
  names = []
  for name, spec in PAPER_TASKS.items():
    if name not in seqio.TaskRegistry.names():
      seqio.TaskRegistry.add(
          name, source=seqio.TfdsDataSource(tfds_name=spec["tfds_name"],
                                            tfds_data_dir=tfds_data_dir),
          preprocessors=[paper_pre[name], *tokenize], output_features=features(t5_vocab),
          metric_fns=[_metric(spec["metric"])])
    names.append(name)
  local_vocab = seqio.SentencePieceVocabulary(str(vocab_lib.DEFAULT_VOCAB_PATH),
                                             extra_ids=vocab_lib.DEFAULT_EXTRA_IDS)
  for name, local_name in LOCAL_SEQIO_TASKS.items():
    if name not in seqio.TaskRegistry.names():
      seqio.TaskRegistry.add(
          name, source=seqio.FunctionDataSource(_local_dataset_fn(local_name),
                                                splits=["train", "validation", "valid"]),
          preprocessors=list(tokenize), output_features=features(local_vocab),
          metric_fns=[_metric(TASK_METRICS[name])])
    names.append(name)
  _REGISTERED.extend(names)
  return names


class SeqioVocabulary:
  """The slice of the local vocabulary interface a run needs, over a seqio vocabulary."""

  def __init__(self, vocab):
    self._v = vocab

  @property
  def vocab_size(self) -> int:
    return int(self._v.vocab_size)

  @property
  def padded_vocab_size(self) -> int:
    return -(-self.vocab_size // 128) * 128

  eos_id = property(lambda self: int(self._v.eos_id))
  pad_id = property(lambda self: int(self._v.pad_id))

  def encode(self, text: str) -> list[int]:
    return list(self._v.encode(text))

  def encode_batch(self, texts) -> list[list[int]]:
    return [self.encode(t) for t in texts]

  def decode(self, ids) -> str:
    return self._v.decode([int(i) for i in ids])


def vocabulary(task: str, tfds_data_dir: str | None = None) -> SeqioVocabulary:
  """The task's targets vocabulary."""
  register_tasks(tfds_data_dir)
  import seqio
  return SeqioVocabulary(seqio.get_mixture_or_task(task).output_features["targets"].vocabulary)


def _text(x: Any) -> str | None:
  if x is None:
    return None
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def load_examples(task: str, split: str = "validation", num_examples: int | None = None, *,
                  max_input_length: int = 512, tfds_data_dir: str | None = None
                  ) -> list[local_tasks.Example]:
  """The first `num_examples` examples of a seqio task's split as local `Example`s."""
  register_tasks(tfds_data_dir)
  import seqio
  t = seqio.get_mixture_or_task(task)
  splits = list(getattr(t, "splits", ()) or ())
  if splits and split not in splits and SPLIT_ALIASES.get(split) in splits:
    split = SPLIT_ALIASES[split]
  ds = t.get_dataset({"inputs": max_input_length, "targets": 4096}, split=split, shuffle=False,
                     use_cached=False, seed=0)
  if num_examples is not None:
    ds = ds.take(num_examples)
  out = []
  for i, ex in enumerate(ds.as_numpy_iterator()):
    ids = tuple(int(v) for v in ex["inputs"])
    out.append(local_tasks.Example(
        index=i, inputs=_text(ex.get("inputs_pretokenized")),
        reference=_text(ex.get("targets_pretokenized")), input_ids=ids,
        input_field="seqio", metadata={"seqio_task": task}))
  return out
