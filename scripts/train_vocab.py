r"""Trains the joint English/German/Python SentencePiece vocabulary of the local model zoo.

    python scripts/train_vocab.py [--output=specdec_jax/assets/vocab/local_sp8k.model]

Why these settings (each was measured on the valid sets; see the report this script prints):
- unigram, 8000 pieces including pad=0, eos=1, unk=2 and no BOS (T5's ids). The vocabulary class
  adds 100 sentinels (seqio convention) -> 8100 ids, padded to 8192 in the models.
- byte_fallback: characters outside the vocabulary become byte pieces, so code and rare
  characters never map to unk.
- normalization "identity", remove_extra_whitespaces=False: the text is not changed, so Python
  code round-trips exactly (the data is already NFC).
- allow_whitespace_only_pieces: runs of spaces (indentation) become one or two pieces instead of
  one piece per space (code solutions: ~110 instead of ~154 tokens at the median).
- "\n" is a user-defined symbol and add_dummy_prefix=False: every token boundary falls at a newline
  and decoding is concatenative, so encode(prompt) is a prefix of encode(prompt + solution) and the
  ids a model generates after a prompt decode to exactly the continuation text. With the dummy
  prefix, decoding a continuation loses a leading space (0 of 71 code valid solutions matched).
  Costs ~7% more tokens on code than letting "\n" merge into pieces like "):\n".
- split_digits: numbers are spelled digit by digit (no arbitrary number pieces).
- Training text: a seeded sample of the three train splits with the model's task prefixes
  ("translate English to German: " + en, de, "summarize: " + document, summary, prompt +
  canonical_solution), so the prefixes tokenize compactly. Never the valid split.
"""
from __future__ import annotations

import io
import random
import statistics
from pathlib import Path

from absl import app
from absl import flags

# pylint: disable=g-import-not-at-top
import sentencepiece as spm

from specdec_jax.data import checksums
from specdec_jax.data import local_tasks
from specdec_jax.data import vocabulary

_OUTPUT = flags.DEFINE_string("output", str(vocabulary.DEFAULT_VOCAB_PATH),
                              "Where to write the .model file.")
_DATA_DIR = flags.DEFINE_string("data_dir", str(local_tasks.ASSETS_DATA_DIR),
                                "Folder with <task>/{train,valid}.jsonl.xz.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 8000, "Pieces, pad/eos/unk/bytes included.")
_NUM_PAIRS = flags.DEFINE_integer("num_translation_pairs", 60000, "EN-DE pairs sampled.")
_NUM_DOCS = flags.DEFINE_integer("num_documents", 12000, "Summarisation examples sampled.")
_NUM_CODE = flags.DEFINE_integer("num_code", -1, "Code examples sampled (-1: all).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_THREADS = flags.DEFINE_integer("num_threads", 2, "Trainer threads.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show sentencepiece's training log.")

PREFIX_EN = local_tasks.INPUT_PREFIXES["en"]
PREFIX_DOC = local_tasks.INPUT_PREFIXES["document"]

TRAINER_OPTIONS = dict(
    model_type="unigram",
    pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
    byte_fallback=True,
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    add_dummy_prefix=False,
    allow_whitespace_only_pieces=True,
    split_digits=True,
    user_defined_symbols=["\n"],
    character_coverage=0.9999,
    max_sentence_length=1 << 16,
    shuffle_input_sentence=False,
)


def _records(task: str, split: str) -> list[dict]:
  return local_tasks.load_jsonl(Path(_DATA_DIR.value) / task / f"{split}.jsonl.xz")


def _sample(rows: list[dict], n: int, rng: random.Random) -> list[dict]:
  return list(rows) if n < 0 or n >= len(rows) else rng.sample(rows, n)


def training_texts(seed: int) -> list[str]:
  rng = random.Random(seed)
  texts = []
  for r in _sample(_records("translate_en_de", "train"), _NUM_PAIRS.value, rng):
    texts += [PREFIX_EN + r["en"], r["de"]]
  for r in _sample(_records("summarize", "train"), _NUM_DOCS.value, rng):
    texts += [PREFIX_DOC + r["document"], r["summary"]]
  for r in _sample(_records("code_complete", "train"), _NUM_CODE.value, rng):
    texts.append(r["prompt"] + r["canonical_solution"])
  rng.shuffle(texts)
  return texts


def report(vocab: vocabulary.SentencePieceVocabulary) -> None:
  """Prints sizes, the code round-trip rate and median tokens per example on the valid sets."""
  print(f"pieces {vocab.base_vocab_size}, with sentinels {vocab.vocab_size}, "
        f"padded {vocab.padded_vocab_size}; <extra_id_0> = {vocab.extra_id(0)}")
  code = _records("code_complete", "valid")
  texts = [t for r in code for t in (r["prompt"], r["canonical_solution"],
                                     r["prompt"] + r["canonical_solution"])]
  ok = sum(vocab.decode(vocab.encode(t)) == t for t in texts)
  print(f"code valid round trip decode(encode(x)) == x: {ok}/{len(texts)} "
        f"(prompt, solution and both, {len(code)} examples)")
  cont = 0
  for r in code:
    p, full = vocab.encode(r["prompt"]), vocab.encode(r["prompt"] + r["canonical_solution"])
    cont += full[:len(p)] == p and vocab.decode(full[len(p):]) == r["canonical_solution"]
  print(f"code valid: encode(prompt) prefixes encode(prompt+solution) and the rest decodes to the "
        f"solution: {cont}/{len(code)}")
  for task, fin, fout in [("translate_en_de", "en", "de"), ("summarize", "document", "summary"),
                          ("code_complete", "prompt", "canonical_solution")]:
    rows = _records(task, "valid")
    prefix = local_tasks.INPUT_PREFIXES[fin]
    ins = vocab.encode_batch([prefix + r[fin] for r in rows])
    outs = vocab.encode_batch([r[fout] for r in rows])
    unk = sum(ids.count(vocab.unk_id) for ids in ins + outs)
    print(f"{task:16s} valid n={len(rows):4d}: median tokens input {statistics.median(map(len, ins))}"
          f" (max {max(map(len, ins))}), target {statistics.median(map(len, outs))} "
          f"(max {max(map(len, outs))}), unk {unk}  [no EOS counted]")


def main(argv):
  del argv
  texts = training_texts(_SEED.value)
  print(f"training on {len(texts)} texts, {sum(map(len, texts)) / 1e6:.1f}M characters")
  spm.set_random_generator_seed(_SEED.value)
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts), model_writer=model, vocab_size=_VOCAB_SIZE.value,
      num_threads=_THREADS.value, minloglevel=0 if _VERBOSE.value else 2, **TRAINER_OPTIONS)
  out = Path(_OUTPUT.value)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_bytes(model.getvalue())
  print(f"wrote {out} (sha256 {checksums.sha256_file(out)})")
  report(vocabulary.SentencePieceVocabulary(out))


if __name__ == "__main__":
  app.run(main)
