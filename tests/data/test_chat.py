"""Prompts through a chat template (`data.chat`, RunConfig.prompt_format='chat').

Why: an instruct model asked without its template answers another question, and a run that
silently fell back to plain text would report an instruct model's speed on prompts it was never
meant to read. The rendering must be the template's own (as transformers renders it), each input
field gets its instruction, and what cannot be templated is refused by name."""
import dataclasses

import pytest

from specdec_jax.data import chat, local_tasks
from specdec_jax.runner import run_config
from specdec_jax.runner import fingerprint

TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\nYou are SmolLM<|im_end|>\n' }}{% endif %}"
            "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class _Vocab:
  chat_template = TEMPLATE


def _example(field, text, **kw):
  prefix = local_tasks.INPUT_PREFIXES.get(field, "")
  return local_tasks.Example(index=3, inputs=prefix + text, reference="r", input_ids=None,
                             input_field=field, metadata={}, **kw)


def test_render_is_the_templates_own():
  got = chat.render(TEMPLATE, "hi", "ok")
  assert got == ("<|im_start|>system\nYou are SmolLM<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                 "<|im_start|>assistant\nok")


def test_fields_get_their_instruction_and_lose_the_plain_prefix():
  doc, code = chat.apply([_example("document", "The cat sat."),
                          _example("prompt", "def f(x):\n    \"\"\"Twice x.\"\"\"\n")],
                         _Vocab(), "chat")
  assert "summarize: " not in doc.inputs and "in one sentence" in doc.inputs
  assert doc.inputs.endswith("The cat sat.<|im_end|>\n<|im_start|>assistant\n")
  # code: as EvalPlus asks, the problem fenced in the user turn and the reply begun with a fence,
  # so the model writes the whole function; the example keeps the problem's own text
  assert code.inputs.endswith("```\ndef f(x):\n    \"\"\"Twice x.\"\"\"\n```\n<|im_end|>\n"
                              "<|im_start|>assistant\n" + chat.EVALPLUS_REPLY + "```python\n")
  assert code.metadata == {"source_text": "def f(x):\n    \"\"\"Twice x.\"\"\"\n",
                           "completion_form": "script"}
  assert doc.metadata["completion_form"] == "body"
  assert dataclasses.replace(doc, inputs=None).index == 3


def test_plain_is_unchanged_and_bad_input_is_refused():
  ex = [_example("document", "The cat sat.")]
  assert chat.apply(ex, None, "plain") is ex
  with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
    chat.apply(ex, object(), "chat")
  with pytest.raises(ValueError, match="cannot be put in a chat template"):
    chat.apply([dataclasses.replace(ex[0], input_ids=[5, 6])], _Vocab(), "chat")
  with pytest.raises(ValueError, match="prompt_format 'html'"):
    chat.apply(ex, _Vocab(), "html")


def test_run_config_checks_the_format_and_fingerprints_it():
  assert run_config.PROMPT_FORMATS == chat.FORMATS
  with pytest.raises(ValueError, match="prompt_format"):
    run_config.RunConfig(prompt_format="html")
  plain = fingerprint.of(run_config.RunConfig())
  assert "prompt_format" not in plain  # old run directories still resume
  chat_run = fingerprint.of(run_config.RunConfig(prompt_format="chat"))
  assert chat_run["prompt_format"] == "chat"
  assert chat_run["chat_revision"] == chat.REVISION  # other turns' runs are refused, not resumed


def test_completion_stops_at_the_closing_fence():
  from specdec_jax.metrics import code_exec
  assert code_exec.truncate_completion("    return 2 * x\n```\n\nThis doubles.") == "    return 2 * x"
