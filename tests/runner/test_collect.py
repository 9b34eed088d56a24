"""Which runs get pass@k (runner/collect.py): only those whose every example has unit tests."""
from specdec_jax.data import local_tasks
from specdec_jax.runner import collect


def example(index, **meta):
  return local_tasks.Example(index=index, inputs="def f():\n", reference="  return 1\n",
                             input_field="prompt", metadata=meta)


def test_problems_come_from_examples_with_tests_only():
  tested = [example(0, test="def check(c): pass", entry_point="f", task_id="T/0"), example(1)]
  preds = [{"index": 0, "text": "  return 1\n"}]
  assert collect.problems(tested, preds) == [
      {"prompt": "def f():\n", "test": "def check(c): pass", "entry_point": "f", "task_id": "T/0"}]
  assert collect.problems(tested, preds + [{"index": 1}]) is None  # example 1 has no tests
  assert collect.problems(tested, []) is None
