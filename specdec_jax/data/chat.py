"""Prompts as an instruct model expects them: the task's text as one user turn of the model's
own chat template, with an instruction per input field and, for code, the assistant's reply begun.

Why a prompt format and not new task files: the same documents and HumanEval problems are read
either way, so a run with `RunConfig.prompt_format='chat'` and one with 'plain' measure the same
examples; the format is recorded in the run's fingerprint and config. The template is the
checkpoint's (`tokenizer_config.json`'s `chat_template`, Jinja, rendered as transformers renders
it: `messages`, `add_generation_prompt=True`), so a converted GGUF prompts exactly as its
upstream chat format does.
- summaries ask for one sentence, Chen et al.'s XSum setting;
- code asks for the function and begins the reply with a ```python fence and the prompt itself
  (as EvalPlus prompts instruct models), so the model writes the body the prompt asks for and
  the completion is scored like a plain one (`metrics.code_exec` stops at the closing fence);
- `inputs` / seqio text goes in as written.
"""
from __future__ import annotations

import dataclasses

FORMATS = ("plain", "chat")
# input field -> (user turn, assistant prefix); {text} is the example's text without its prefix.
TURNS = {
    "document": ("Summarize the following text in one sentence.\n\n{text}", ""),
    "prompt": ("Complete the following Python function.\n\n```python\n{text}```",
               "```python\n{text}"),
    "en": ("Translate the following text from English to German.\n\n{text}", ""),
    "inputs": ("{text}", ""),
    "seqio_text": ("{text}", ""),
}


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
    out.append(dataclasses.replace(
        ex, inputs=render(template, user.format(text=text), reply.format(text=text))))
  return out
