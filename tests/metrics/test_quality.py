"""Quality metrics by task (specdec_jax/metrics/quality.py)."""
import pytest

from specdec_jax.metrics import quality


def test_metric_by_task_and_field():
  assert quality.metric_for("translate_en_de") == "bleu"
  assert quality.metric_for("summarize") == "rougeL"  # one-line summaries
  assert quality.metric_for("cnn_dailymail") == "rouge"  # headline ROUGE-2
  assert quality.metric_for("code_complete") == "exact_match"
  assert quality.metric_for("/x/my.jsonl", "en") == "bleu"
  assert quality.metric_for("/x/my.jsonl", "document") == "rouge"
  assert quality.metric_for("/x/my.jsonl", "input_ids") == "exact_match"


def test_scores():
  refs = ["das ist ein kleiner test", "wir sehen uns morgen früh"]
  assert quality.score("bleu", refs, refs)["bleu"] == pytest.approx(100.0)
  assert quality.score("bleu", ["x y z", "a b"], refs)["bleu"] < 5
  r = quality.score("rouge", refs, refs)
  assert r["rouge"] == pytest.approx(100.0) and r["rougeL"] == pytest.approx(100.0)
  r = quality.score("rougeL", ["the cat sat on a mat"], ["the cat sat on the mat"])
  assert 50 < r["rougeL"] < 100 and r["rouge2"] < r["rougeL"]
  assert quality.score("exact_match", ["a ", "b"], ["a", "c"])["exact_match"] == 0.5
  with pytest.raises(ValueError, match="references"):
    quality.score("bleu", ["a"], [])


def test_bootstrap_interval_contains_the_point_estimate():
  preds = ["a b c d", "a b x d", "e f g h", "e f g x"]
  refs = ["a b c d", "a b c d", "e f g h", "e f g h"]
  lo, hi = quality.bootstrap_interval(quality.exact_match, preds, refs, samples=100)
  assert lo <= quality.exact_match(preds, refs) <= hi
