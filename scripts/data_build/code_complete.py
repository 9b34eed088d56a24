"""code_complete: CPython 3.11 standard library functions with docstrings.

Why: a HumanEval-like task needs functions whose docstring says what the body does; the
standard library ships in Debian packages, is PSF-licensed and has thousands of them. The prompt
is the signature and docstring (decorators included), the solution the body after it, both
dedented; there are no unit tests, so the task measures acceptance and speed, not pass@k.
"""
from __future__ import annotations

import ast

SOURCES = ["stdlib"]
# Debian packages holding usr/lib/python3.11.
STDLIB_PACKAGES = ["libpython3.11-minimal", "libpython3.11-stdlib", "python3-distutils",
                   "python3-tk"]
_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__",
              "turtledemo", "_bundled", "pydoc_data"}


def functions(tree):
  """Module-level functions and methods (of classes at any depth), not nested functions."""
  stack = list(tree.body)
  while stack:
    node = stack.pop(0)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      yield node
    elif isinstance(node, ast.ClassDef):
      stack.extend(node.body)


def code_examples(source: str, rel: str):
  """Rows {prompt, canonical_solution, task_id} of the functions of one source file.

  Kept: functions whose docstring ends its line with the closing triple quotes and is followed,
  from a later line on, by 2 to 40 non-blank lines, every line of the function (decorators
  included) indented by at least as many spaces as the `def`. task_id is
  "<rel>:<name>:<line of the def>".
  """
  try:
    tree = ast.parse(source)
  except SyntaxError:
    return
  lines = source.splitlines(keepends=True)
  for fn in functions(tree):
    body = fn.body
    if len(body) < 2 or not (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                             and isinstance(body[0].value.value, str)):
      continue
    start = min([fn.lineno] + [d.lineno for d in fn.decorator_list]) - 1
    doc_end, end = body[0].end_lineno, fn.end_lineno
    if body[1].lineno <= doc_end or lines[doc_end - 1].rstrip()[-3:] not in ('"""', "'''"):
      continue
    indent = fn.col_offset
    chunk = lines[start:end]
    if any(line.strip() and not line.startswith(" " * indent) for line in chunk):
      continue
    chunk = [line[indent:] if line.strip() else "\n" for line in chunk]
    chunk[-1] = chunk[-1] if chunk[-1].endswith("\n") else chunk[-1] + "\n"
    split = doc_end - start
    prompt, solution = "".join(chunk[:split]), "".join(chunk[split:])
    n_lines = sum(1 for line in chunk[split:] if line.strip())
    if 2 <= n_lines <= 40:
      yield {"prompt": prompt, "canonical_solution": solution,
             "task_id": f"{rel}:{fn.name}:{fn.lineno}"}


def src_stdlib(roots):
  """Examples of every .py file of the packages but symlinks and `_SKIP_DIRS` (tests, IDLE, ...)."""
  for pkg in STDLIB_PACKAGES:
    if pkg not in roots:
      continue
    base = roots[pkg] / "usr/lib/python3.11"
    for path in sorted(base.rglob("*.py")):
      parts = path.relative_to(base).parts
      if any(p in _SKIP_DIRS for p in parts) or path.is_symlink():
        continue
      rel = "stdlib/" + "/".join(parts)
      yield from code_examples(path.read_text(encoding="utf-8", errors="replace"), rel)


def build_code(fetcher, sources):
  """Rows {prompt, canonical_solution, task_id}, the first of each (prompt, solution)."""
  if "stdlib" not in sources:
    return []
  rows, seen = [], set()
  for row in src_stdlib(fetcher.packages(STDLIB_PACKAGES)):
    if (row["prompt"], row["canonical_solution"]) not in seen:
      seen.add((row["prompt"], row["canonical_solution"]))
      rows.append(row)
  return rows
