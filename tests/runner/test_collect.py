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
      {"prompt": "def f():\n", "test": "def check(c): pass", "entry_point": "f", "task_id": "T/0",
       "completion_form": "body"}]
  assert collect.problems(tested, preds + [{"index": 1}]) is None  # example 1 has no tests
  assert collect.problems(tested, []) is None


def test_a_chat_templated_problem_runs_its_own_prompt_and_the_replys_script():
  """The model reads the chat template; the program must run the problem's prompt and the
  reply's code (revision 1 ran the template text itself: every chat sample failed to parse, so
  pass@1 was 0 whatever the model wrote)."""
  from specdec_jax.data import chat  # pylint: disable=import-outside-toplevel
  from specdec_jax.metrics import code_exec  # pylint: disable=import-outside-toplevel

  class Vocab:
    chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                     "{% if add_generation_prompt %}<|assistant|>{% endif %}")

  prompt = "from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    \"\"\"Sum.\"\"\"\n"
  test = "def check(c):\n    assert c([1, 2]) == 3\n"
  ex = local_tasks.Example(index=0, inputs=prompt, reference="    return sum(xs)\n",
                           input_field="prompt",
                           metadata={"test": test, "entry_point": "total", "task_id": "T/0"})
  (templated,) = chat.apply([ex], Vocab(), "chat")
  assert templated.inputs.startswith("<|user|>") and templated.inputs.endswith("```python\n")
  (problem,) = collect.problems([templated], [{"index": 0}])
  assert problem["prompt"] == prompt and problem["completion_form"] == "script"
  right = ("def total(xs: List[int]) -> int:\n    return sum(xs)\n```\n\nThis sums the list.\n"
           "```python\nprint(total([1]))\n```")
  wrong = "def total(xs: List[int]) -> int:\n    return 0\n```\n"
  demo = right.replace("```\n\nThis", "\nif __name__ == '__main__':\n    assert False\n```\nThis")
  prose = "This function sums the numbers."  # no code: the prompt's stub stays, and fails
  got = code_exec.block([problem] * 4, None, [right, wrong, demo, prose])
  passed = [o.passed for o in code_exec.check_samples([problem] * 4, [right, wrong, demo, prose])]
  assert passed == [True, False, True, False]
  assert got["speculative"]["pass_at_1"] == 0.5
