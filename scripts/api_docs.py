r"""The API reference (docs/api.md), generated from the public objects' signatures and docstrings.

  python scripts/api_docs.py            # rewrite docs/api.md
  python scripts/api_docs.py --check    # exit 1 if docs/api.md differs from the code

Why generated: a hand-kept reference drifts from the code it describes; this one is rendered from
the docstrings, and a test (tests/test_api_docs.py) fails when the committed page is stale.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "api.md")

# (module, public names), in reading order: the high-level API, then the research surface.
SECTIONS = (
    ("specdec_jax.api", ("load", "Pair", "Generation", "Benchmark")),
    ("specdec_jax.decoding.decoder", ("Decoder", "Params")),
    ("specdec_jax.decoding.speculative", ("Chain",)),
    ("specdec_jax.decoding.autoregressive", ("Autoregressive",)),
    ("specdec_jax.decoding.adaptive", ("AdaptiveConfig",)),
    ("specdec_jax.decoding.sampling", ("SamplingConfig",)),
    ("specdec_jax.decoding.acceptance", ("tokenwise", "block")),
    ("specdec_jax.seam", ("Decodable", "Cache")),
    ("specdec_jax.checkpoints.loader", ("load_model",)),
)


def _signature(obj) -> str:
  try:
    return str(inspect.signature(obj))
  except (TypeError, ValueError):
    return "(...)"


def _members(cls) -> list[tuple[str, object]]:
  """Public methods and properties defined on `cls` itself, in source order."""
  out = []
  for name, value in cls.__dict__.items():
    if name.startswith("_") or name == "replace":  # flax.struct's, not ours
      continue
    if isinstance(value, property) or inspect.isfunction(value):
      out.append((name, value))
  return out


def _entry(name: str, obj, level: str = "###") -> list[str]:
  kind = "class" if inspect.isclass(obj) else "def"
  sig = "" if isinstance(obj, property) else _signature(obj)
  lines = [f"{level} `{name}`", "", "```python", f"{kind} {name}{sig}", "```", ""]
  doc = inspect.getdoc(obj)
  if doc:
    lines += [doc, ""]
  return lines


def render() -> str:
  """The page's text."""
  sys.path.insert(0, ROOT)
  lines = ["# API reference", "",
           "Generated from the code by `python scripts/api_docs.py` (do not edit by hand). The",
           "README's Python API section shows them in use; DESIGN.md says why they are shaped so.",
           ""]
  for module_name, names in SECTIONS:
    module = importlib.import_module(module_name)
    lines += [f"## `{module_name}`", ""]
    for name in names:
      obj = getattr(module, name)
      lines += _entry(name, obj)
      if inspect.isclass(obj):
        for member, value in _members(obj):
          lines += _entry(f"{name}.{member}", value, "####")
  return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is stale")
  args = ap.parse_args(argv)
  text = render()
  current = open(PAGE).read() if os.path.exists(PAGE) else ""
  if args.check:
    print("docs/api.md is current" if text == current else "docs/api.md is stale: run "
          "python scripts/api_docs.py")
    return 0 if text == current else 1
  with open(PAGE, "w") as f:
    f.write(text)
  print(f"wrote {PAGE}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
