"""Prompts as an instruct model expects them: the task's text as one user turn of the model's
own chat template, with an instruction per input field and, for code, the assistant's reply begun.

Why a prompt format and not new task files: the same documents and HumanEval problems are read
either way, so a run with `RunConfig.prompt_format='chat'` and one with 'plain' measure the same
examples; the format is recorded in the run's fingerprint and config. The template is the
checkpoint's (`tokenizer_config.json`'s `chat_template`, Jinja, rendered as transformers renders
it: `messages`, `add_generation_prompt=True`), so a converted GGUF prompts exactly as its
upstream chat format does.
- summaries ask for one sentence, Chen et al.'s XSum setting;
- code asks as EvalPlus asks instruct models (its `make_raw_chat_prompt`): the problem in a
  fenced block of the user turn, the reply begun with EvalPlus's sentence and a ```python fence,
  so the model writes a self-contained function. The example keeps the problem's own text
  (`metadata['source_text']`) and says its completion is a whole script
  (`metadata['completion_form']`): `metrics.code_exec` runs the reply's code up to its closing
  fence after the problem's prompt (whose imports it uses; its definition replaces the stub).
  Revision 1 began the reply with the prompt itself, and SmolLM2-135M closed the fence at once
  and explained in prose: its "HumanEval" outputs held no code;
- `inputs` / seqio text goes in as written.
"""
from __future__ import annotations

import dataclasses

FORMATS = ("plain", "chat")
# What the turns below ask, by number: a chat run's fingerprint and a distillation job's key hold
# it, so a run or a data job written with other turns is refused, not resumed (revision 2: code
# asks as EvalPlus does; summaries and translations are revision 1's).
REVISION = 2
EVALPLUS_REPLY = ("Below is a Python script with a self-contained function that solves the "
                  "problem and passes corresponding tests:\n")
# input field -> (user turn, assistant prefix); {text} is the example's text without its prefix,
# {stripped} the same without surrounding whitespace.
TURNS = {
    "document": ("Summarize the following text in one sentence.\n\n{text}", ""),
    "prompt": ("Please provide a self-contained Python script that solves the following problem "
               "in a markdown code block:\n```\n{stripped}\n```\n", EVALPLUS_REPLY + "```python\n"),
    "en": ("Translate the following text from English to German.\n\n{text}", ""),
    "inputs": ("{text}", ""),
    "seqio_text": ("{text}", ""),
}
# input field -> what the reply holds where it is not the plain continuation ('body'): 'script',
# a whole program (`metrics.code_exec.program`).
COMPLETION_FORMS = {"prompt": "script"}


def check_format(prompt_format: str) -> None:
  if prompt_format not in FORMATS:
    raise ValueError(f"prompt_format {prompt_format!r} is not one of {FORMATS}")


def render(template: str, user: str, prefix: str = "") -> str:
  """The chat text of one user turn with the generation prompt, then `prefix` (the reply begun)."""
  from jinja2 import ext, sandbox  # pylint: disable=import-outside-toplevel
  # transformers' settings; sandboxed, since the template comes with a downloaded file.
  env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                              extensions=[ext.loopcontrols])
  return env.from_string(template).render(
      messages=[{"role": "user", "content": user}], add_generation_prompt=True) + prefix


def apply(examples, vocab, prompt_format: str):
  """`examples` with their text put in `prompt_format` ('plain': unchanged)."""
  check_format(prompt_format)
  if prompt_format == "plain":
    return examples
  template = getattr(vocab, "chat_template", None)
  if not template:
    raise ValueError(f"prompt_format='chat' needs a tokenizer with a chat template "
                     f"(tokenizer_config.json `chat_template`); the run's vocabulary {vocab!r} "
                     "has none")
  from specdec_jax.data.local_tasks import INPUT_PREFIXES  # pylint: disable=import-outside-toplevel
  out = []
  for ex in examples:
    if ex.input_ids is not None:
      raise ValueError(f"example {ex.index} gives `input_ids`: they cannot be put in a chat "
                       "template; use prompt_format='plain'")
    if ex.input_field not in TURNS:
      raise ValueError(f"example {ex.index}: no chat turn for input field {ex.input_field!r} "
                       f"(known: {sorted(TURNS)})")
    prefix = INPUT_PREFIXES.get(ex.input_field, "")
    text = ex.inputs[len(prefix):] if ex.inputs.startswith(prefix) else ex.inputs
    user, reply = TURNS[ex.input_field]
    fill = dict(text=text, stripped=text.strip())
    metadata = dict(ex.metadata, source_text=text,
                    completion_form=COMPLETION_FORMS.get(ex.input_field, "body"))
    out.append(dataclasses.replace(ex, inputs=render(template, user.format(**fill),
                                                     reply.format(**fill)), metadata=metadata))
  return out
