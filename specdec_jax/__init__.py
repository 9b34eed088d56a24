"""specdec_jax: exact speculative decoding for T5 and decoder-only models in JAX/Flax.

The public Python API (`specdec_jax/api.py`; README "Python API"):

  import specdec_jax as sd
  pair = sd.load(target, draft, task="translate_en_de")   # as `python -m specdec_jax.run` loads
  out = pair.generate(["The car is in the garage."], gamma=3)  # -> Generation: texts, ids, alpha
  pair.benchmark(texts, gamma=3).speedup                  # autoregressive vs speculative, timed

- `load(target, draft=None, *, task, head_vocab, vocabulary, max_input_length, dtype, seed)`
  -> `Pair`: checkpoints or presets, packed, the draft's head restricted and paired as in a run.
- `Pair.generate(inputs, *, gamma, temperature, top_k, top_p, max_new_tokens, batch_size, seed)`
  -> `Generation`; `Pair.benchmark(inputs, *, repeats, **generate_options)` -> `Benchmark`;
  `Pair.decoder(...)` -> the `decoding.decoder.Decoder` they run, for research code.
- `humaneval(num_problems)` -> HumanEval's problems; `pass_at_k(problems, completions, ks)` runs
  completions against their tests in the sandbox (`metrics.code_exec`).

Why the names load lazily: `import specdec_jax` stays free of JAX (entry points parse their flags
first, and the data and vocabulary modules are used without it); the first use of a name imports
`specdec_jax.api`.
"""
from __future__ import annotations

_API = ("load", "Pair", "Generation", "Benchmark", "humaneval", "pass_at_k")
__all__ = list(_API)


def __getattr__(name: str):
  if name in _API:
    from specdec_jax import api  # pylint: disable=import-outside-toplevel
    return getattr(api, name)
  raise AttributeError(f"module 'specdec_jax' has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_API))
