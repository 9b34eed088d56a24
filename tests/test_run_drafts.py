"""Model-free drafts (Leviathan Table 3's unigram and bigram, prompt lookup) through the runner."""
import json
import os

import pytest

from specdec_jax import run


pytestmark = pytest.mark.usefixtures("clean_gin")


@pytest.mark.slow
def test_unigram_bigram_prompt_lookup_alpha_only(tmp_path):
  out = str(tmp_path)
  metrics = run.run(["configs/local/smoke.gin"], out, [
      "DRAFT = ['bigram', 'prompt_lookup']", "MODE = 'speculative'",
      "NUM_EXAMPLES = 4", "MAX_DECODE_LENGTH = 8", "GAMMA = 2", "RunConfig.repeats = 1"])
  assert [m["draft"] for m in metrics] == ["bigram", "prompt_lookup"]
  for m in metrics:
    assert 0.0 <= m["alpha"] <= 1.0 and m["num_examples"] == 4
    assert m["speedup"] is None  # speculative mode: no baseline timed
  with open(os.path.join(out, "metrics.json")) as f:
    assert len(json.load(f)) == 2
  # The run's alpha is what the library gives for the same prompts and the same tables, built
  # through the one n-gram path the scripts use (greedy, so alpha is deterministic).
  want = {name: _library_alpha(name) for name in ("bigram", "prompt_lookup")}
  for m in metrics:
    assert m["alpha"] == pytest.approx(want[m["draft"]], abs=1e-6), m["draft"]


def _library_alpha(name):
  import jax
  from specdec_jax.data import local_tasks, ngram_tables
  from specdec_jax.models import model_free
  from specdec_jax.decoding.decoder import Decoder, Params
  from specdec_jax.decoding.sampling import SamplingConfig
  from specdec_jax.decoding.speculative import Chain
  from specdec_jax.metrics import acceptance_stats
  from specdec_jax.checkpoints.loader import load_model
  examples = local_tasks.load_examples("configs/local/smoke_prompts.jsonl", num_examples=4)
  target, tp = load_model("t5_test_target", seed=0)
  draft = model_free.make_draft(name, target)
  params = {} if name == "prompt_lookup" else jax.tree.map(
      jax.numpy.asarray, ngram_tables.tables_for_examples(examples, None, target))
  inputs = local_tasks.batch_inputs([list(ex.input_ids)[:32] for ex in examples])
  res = Decoder(target, draft, Chain(2), SamplingConfig(), max_decode_len=8).generate(
      Params(tp, params), inputs)
  return acceptance_stats.alpha_of(res.counters)


def _corpus(tmp_path, vocab=64):
  """A corpus index over random ids of the smoke target's vocabulary, as scripts/corpus_index.py
  writes one."""
  from specdec_jax.data import corpus_index
  import numpy as np
  rng = np.random.default_rng(0)
  index = corpus_index.build_corpus_index(
      [rng.integers(2, vocab, size=40).tolist() for _ in range(20)], vocab, max_ngram=3)
  path = str(tmp_path / "corpus.npz")
  corpus_index.save_index(path, index, {"vocab_size": vocab})
  return path


def test_corpus_lookup_needs_a_corpus_of_the_targets_vocabulary(tmp_path):
  base = ["DRAFT = 'corpus_lookup'", "MODE = 'speculative'", "NUM_EXAMPLES = 2",
          "MAX_DECODE_LENGTH = 4", "GAMMA = 2"]
  with pytest.raises(ValueError, match="needs RunConfig.lookup_corpus"):
    run.run(["configs/local/smoke.gin"], str(tmp_path / "a"), base)
  from specdec_jax.data import corpus_index
  bad = str(tmp_path / "other_vocab.npz")
  corpus_index.save_index(bad, corpus_index.build_corpus_index([[1, 2, 3]], 16), {"vocab_size": 16})
  with pytest.raises(ValueError, match="vocabulary of 16 ids"):
    run.run(["configs/local/smoke.gin"], str(tmp_path / "b"),
            base + [f"RunConfig.lookup_corpus = '{bad}'"])
  with pytest.raises(ValueError, match="cannot read a corpus index"):
    run.run(["configs/local/smoke.gin"], str(tmp_path / "c"),
            base + [f"RunConfig.lookup_corpus = '{tmp_path / 'missing.npz'}'"])
  assert not os.path.exists(tmp_path / "a" / "metrics.json")


def test_corpus_lookup_runs_beside_prompt_lookup(tmp_path):
  out = str(tmp_path / "run")
  metrics = run.run(["configs/local/smoke.gin"], out, [
      "DRAFT = ['corpus_lookup', 'prompt_lookup']", "MODE = 'speculative'", "NUM_EXAMPLES = 4",
      "MAX_DECODE_LENGTH = 8", "GAMMA = 2", "RunConfig.repeats = 1",
      f"RunConfig.lookup_corpus = '{_corpus(tmp_path)}'"])
  assert [m["draft"] for m in metrics] == ["corpus_lookup", "prompt_lookup"]
  for m in metrics:
    assert 0.0 <= m["alpha"] <= 1.0 and m["num_examples"] == 4


def test_a_corpus_no_draft_reads_leaves_the_fingerprint_alone(tmp_path):
  from specdec_jax.runner import fingerprint, run_config
  corpus = _corpus(tmp_path)
  plain = fingerprint.of(run_config.RunConfig(draft="prompt_lookup"))
  assert fingerprint.of(run_config.RunConfig(draft="prompt_lookup", lookup_corpus=corpus)) == plain
  used = fingerprint.of(run_config.RunConfig(draft=["prompt_lookup", "corpus_lookup"],
                                             lookup_corpus=corpus))
  assert used["lookup_corpus"] == corpus and corpus in used["contents"]
