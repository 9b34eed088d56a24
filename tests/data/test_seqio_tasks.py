"""seqio registration: the local tasks through seqio give the local path's ids and references.

Skipped without the seqio extra (CI installs it). The paper tasks are only checked for
registration (their TFDS data is not available offline).
"""
import subprocess
import sys

import pytest

from specdec_jax.data import local_tasks, seqio_tasks


def test_module_imports_without_tensorflow():
  code = ("import sys; import specdec_jax.data.seqio_tasks as s; "
          "from specdec_jax.data import tasks; "
          "assert tasks.is_seqio('translate_en_de') is False; "
          "assert tasks.is_seqio('configs/local/smoke_prompts.jsonl') is False; "
          "assert 'tensorflow' not in sys.modules and 'seqio' not in sys.modules, 'TF imported'")
  subprocess.run([sys.executable, "-c", code], check=True)


def test_names():
  assert {"wmt_t2t_ende_v003", "cnn_dailymail", "specdec_translate_en_de"} <= set(
      seqio_tasks.all_task_names())
  assert seqio_tasks.is_seqio_task("cnn_dailymail")
  assert not seqio_tasks.is_seqio_task("configs/local/smoke_prompts.jsonl")


@pytest.fixture(scope="module")
def seqio():
  return pytest.importorskip("seqio")


def test_paper_tasks_register(seqio):
  names = seqio_tasks.register_tasks()
  for name in ("wmt_t2t_ende_v003", "cnn_dailymail"):
    assert name in names and name in seqio.TaskRegistry.names()
    task = seqio.get_mixture_or_task(name)
    assert isinstance(task.source, seqio.TfdsDataSource)
    assert set(task.output_features) == {"inputs", "targets"}


@pytest.mark.parametrize("name", ["translate_en_de", "summarize", "code_complete"])
def test_local_task_through_seqio_matches_local_path(seqio, name):
  from specdec_jax.data import vocabulary
  got = seqio_tasks.load_examples("specdec_" + name, "valid", 3, max_input_length=4096)
  want = local_tasks.load_examples(name, "valid", 3)
  vocab = vocabulary.default_vocabulary()
  want_ids = local_tasks.tokenize_examples(want, vocab, add_eos=True)
  assert [list(e.input_ids) for e in got] == want_ids
  assert [e.reference for e in got] == [e.reference for e in want]
  assert [e.inputs for e in got] == [e.inputs for e in want]
  task = seqio.get_mixture_or_task("specdec_" + name)
  assert len(task.metric_fns) == 1
  decoded = seqio_tasks.vocabulary("specdec_" + name).decode(want_ids[0][:-1])
  assert decoded == vocab.decode(want_ids[0][:-1])


@pytest.mark.slow
def test_run_on_a_seqio_task(seqio, tmp_path):
  import gin
  from specdec_jax import run
  gin.clear_config()
  try:
    (m,) = run.run(["configs/local/smoke.gin"], str(tmp_path), [
        "TASK = 'specdec_translate_en_de'", "NUM_EXAMPLES = 2", "MAX_DECODE_LENGTH = 4",
        "MODE = 'autoregressive'", "RunConfig.repeats = 1"])
  finally:
    gin.clear_config()
  assert m["num_examples"] == 2 and m["quality"]["metric"] == "bleu"
  assert m["quality"]["num_references"] == 2
