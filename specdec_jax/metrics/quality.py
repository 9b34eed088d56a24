"""Output quality as fits the task: BLEU (sacrebleu) for translation, ROUGE (rouge-score) for
summaries, exact match otherwise (code completion, any JSONL with plain `targets`).

Why both outputs are scored: speculative decoding is lossless, so at temperature 0 the speculative
score must equal the autoregressive one and at temperature 1 it must sit within the bootstrap
interval of it; a gap is a bug report, not a tuning knob. `bootstrap_interval` gives that interval.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence

# Headlines: ROUGE-2 for CNN/DailyMail's multi-sentence highlights (T5's reported figure); ROUGE-L
# for the local one-line summaries, where a small model's ROUGE-2 is zero on most examples and its
# bootstrap interval collapses to [0, 0], which says nothing about speculative vs autoregressive.
TASK_METRICS = {"translate_en_de": "bleu", "summarize": "rougeL", "code_complete": "exact_match",
                # seqio tasks (specdec_jax.data.seqio_tasks)
                "wmt_t2t_ende_v003": "bleu", "cnn_dailymail": "rouge", "xsum": "rouge",
                "specdec_translate_en_de": "bleu", "specdec_summarize": "rougeL",
                "specdec_code_complete": "exact_match"}
FIELD_METRICS = {"en": "bleu", "document": "rouge"}


def metric_for(task: str, input_field: str | None = None) -> str:
  """'bleu', 'rouge' (headline ROUGE-2), 'rougeL' or 'exact_match' for a shipped task name or the input field of a JSONL."""
  if task in TASK_METRICS:
    return TASK_METRICS[task]
  return FIELD_METRICS.get(input_field or "", "exact_match")


def bleu(predictions: Sequence[str], references: Sequence[str]) -> float:
  """Corpus BLEU (sacrebleu defaults: 13a tokenizer, exp smoothing), 0..100."""
  import sacrebleu
  return float(sacrebleu.corpus_bleu(list(predictions), [list(references)]).score)


def rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
  """Mean F-measures of ROUGE-1/2/L (with stemming, as in T5's evaluation), 0..100."""
  from rouge_score import rouge_scorer
  names = ("rouge1", "rouge2", "rougeL")
  scorer = rouge_scorer.RougeScorer(list(names), use_stemmer=True)
  totals = dict.fromkeys(names, 0.0)
  for pred, ref in zip(predictions, references):
    scores = scorer.score(ref, pred)
    for n in names:
      totals[n] += scores[n].fmeasure
  count = max(len(predictions), 1)
  return {n: 100.0 * totals[n] / count for n in names}


def exact_match(predictions: Sequence[str], references: Sequence[str]) -> float:
  """Fraction (0..1) of predictions equal to their reference after stripping whitespace ends."""
  if not predictions:
    return 0.0
  return sum(p.strip() == r.strip() for p, r in zip(predictions, references)) / len(predictions)


def score(metric: str, predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
  """{name: value} for the metric; the headline value is under the metric's own name."""
  if len(predictions) != len(references):
    raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
  if metric == "bleu":
    return {"bleu": bleu(predictions, references)}
  if metric == "rouge":
    r = rouge(predictions, references)
    return {"rouge": r["rouge2"], **r}
  if metric == "rougeL":
    return rouge(predictions, references)
  if metric == "exact_match":
    return {"exact_match": exact_match(predictions, references)}
  raise ValueError(f"unknown quality metric {metric!r}; known: bleu, rouge, rougeL, exact_match")


def bootstrap_interval(metric_fn: Callable[[Sequence[str], Sequence[str]], float],
                       predictions: Sequence[str], references: Sequence[str],
                       samples: int = 200, level: float = 0.95, seed: int = 0
                       ) -> tuple[float, float]:
  """Percentile bootstrap interval of a corpus metric over resampled examples."""
  rng = random.Random(seed)
  n = len(predictions)
  if n == 0:
    return (0.0, 0.0)
  values = []
  for _ in range(samples):
    idx = [rng.randrange(n) for _ in range(n)]
    values.append(metric_fn([predictions[i] for i in idx], [references[i] for i in idx]))
  values.sort()
  lo = values[int((1 - level) / 2 * (samples - 1))]
  hi = values[int((1 + level) / 2 * (samples - 1))]
  return (lo, hi)


def headline(metric: str, scores: dict[str, float] | None) -> float | None:
  return None if scores is None else scores.get(metric)
