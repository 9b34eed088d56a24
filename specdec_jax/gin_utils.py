"""Gin flag handling shared by the entry points (`run`, `train`), in T5X's style.

Why a module of its own: every binary takes `--gin_file` (repeatable), `--gin.NAME=VALUE`,
`--gin_bindings` and `--gin_search_paths`, and must treat them identically: the same default
search paths (the working directory, the repository root, the installed package's parent), the
same rewriting of `--gin.NAME=VALUE`, and the same strictness. Gin itself rejects an unknown
configurable or parameter, but happily creates a new macro from a typo (`--gin.TEMPRATURE=1`
silently does nothing), so `parse_gin_flags` refuses a macro binding that no config file declares.
Library code never imports this module; only the entry points and `configurables` do.
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence

import gin

from specdec_jax.paths import PACKAGE_PARENT

_GIN_FLAG = re.compile(r"^--gin\.([^=]+)=(.*)$", re.DOTALL)
_MACRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def rewrite_gin_args(argv: Sequence[str]) -> list[str]:
  """`--gin.NAME=VALUE` -> `--gin_bindings=NAME = VALUE`; other arguments pass unchanged.

  Strings keep gin syntax: `--gin.TASK="'summarize'"` or `--gin.TASK=\\"summarize\\"`. As a
  convenience a bare word that is not a gin literal or reference (`--gin.MODE=benchmark`) is
  quoted, so shells need no nested quotes for the common case.
  """
  out = []
  for arg in argv:
    m = _GIN_FLAG.match(arg)
    if m is None:
      out.append(arg)
      continue
    name, value = m.group(1).strip(), m.group(2).strip()
    out.append(f"--gin_bindings={name} = {_quote_bare_word(value)}")
  return out


def _quote_bare_word(value: str) -> str:
  """Quotes identifiers that gin would otherwise read as an unknown reference."""
  literal_words = {"None", "True", "False"}
  if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-./]*", value) and value not in literal_words:
    return repr(value)
  if re.fullmatch(r"[./~][^\s'\"]*", value):  # a path
    return repr(value)
  return value


def default_search_paths(extra: Sequence[str] = ()) -> list[str]:
  """User paths first, then the working directory, then the repository / package parent."""
  paths = [*extra, os.getcwd(), PACKAGE_PARENT]
  seen, out = set(), []
  for p in paths:
    p = os.path.abspath(os.path.expanduser(p))
    if p not in seen:
      seen.add(p)
      out.append(p)
  return out


def binding_name(binding: str) -> str:
  """The left-hand side of one `NAME = VALUE` binding string."""
  return binding.split("=", 1)[0].strip()


def macro_defined(name: str) -> bool:
  try:
    gin.query_parameter(f"%{name}")
    return True
  except ValueError:
    return False


def check_macro_bindings(bindings: Sequence[str]) -> None:
  """Raises if a binding sets a macro that the parsed config files never declared."""
  unknown = [binding_name(b) for b in bindings
             if _MACRO_NAME.match(binding_name(b)) and not macro_defined(binding_name(b))]
  if unknown:
    raise ValueError(
        f"unknown gin binding(s) {unknown}: no config file declares these macros. Check the "
        "spelling against the 'Required / commonly overridden' header of the entry gin file, or "
        "bind a configurable parameter (e.g. --gin.RunConfig.repeats=5).")


def _harden_system_path_reader() -> None:
  """Makes gin's Python-package file lookup tolerate namespace packages.

  For a relative path such as `configs/local/smoke.gin` that is not under the working directory,
  gin asks importlib for a package `configs.local`; when the repository root is importable (an
  editable install) that is a namespace package whose `origin` is None, and gin crashes with a
  TypeError instead of trying the next search path. Wrapping the check restores the search.
  """
  try:
    from gin import config as gin_config, resource_reader
  except ImportError:  # pragma: no cover - layout of another gin version
    return
  readers = getattr(gin_config, "_FILE_READERS", None)
  if not isinstance(readers, list):  # pragma: no cover
    return
  for i, (reader, check) in enumerate(readers):
    if check is resource_reader.system_path_file_exists:
      def safe_check(path, _check=check):
        try:
          return _check(path)
        except TypeError:
          return False
      readers[i] = (reader, safe_check)


def add_search_paths(extra: Sequence[str] = ()) -> None:
  """Registers the default search paths (and `extra` first) with gin."""
  _harden_system_path_reader()
  for path in default_search_paths(extra):
    gin.add_config_file_search_path(path)


def parse_gin_flags(gin_files: Sequence[str], gin_bindings: Sequence[str] = (),
                    search_paths: Sequence[str] = (), finalize: bool = True) -> None:
  """Adds the search paths, parses the files, checks macro bindings, then applies the bindings.

  Files are parsed in order, later ones overriding earlier ones; bindings come last. Unknown
  configurables and parameters raise (gin's `skip_unknown=False`), and so do unknown macros.
  """
  if not gin_files:
    raise ValueError("no --gin_file given; e.g. --gin_file=configs/local/smoke.gin")
  add_search_paths(search_paths)
  gin_bindings = [b for b in gin_bindings if b.strip()]
  gin.parse_config_files_and_bindings(list(gin_files), None, finalize_config=False,
                                      skip_unknown=False)
  check_macro_bindings(gin_bindings)
  gin.parse_config_files_and_bindings(None, list(gin_bindings), finalize_config=finalize,
                                      skip_unknown=False)


def run(main) -> None:
  """absl `app.run(main)` after rewriting `--gin.NAME=VALUE` arguments."""
  from absl import app
  app.run(main, argv=rewrite_gin_args(sys.argv))


def config_text() -> str:
  """The operative config (what was actually used), else the full config if nothing ran yet."""
  return gin.operative_config_str() or gin.config_str()


def write_config(output_dir: str, writer=None, step: int = 0) -> str:
  """Writes the operative config to OUTPUT_DIR/config.gin and as a TensorBoard text summary.

  The operative config lists only what was actually used; it is written after the run's
  configurables have been called. Falls back to the full config before that.
  """
  text = config_text()
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, "config.gin"), "w") as f:
    f.write(text)
  if writer is not None:
    # Markdown: indent by four spaces so TensorBoard renders it as code.
    writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), step)
  return text


def define_entry_flags(output_dir_help: str) -> None:
  """The flags every gin entry point shares (--gin_file, --gin_bindings, --gin_search_paths,
  --output_dir), defined once per process: run, train, distill_data and aot import together (tests,
  scripts), and absl refuses a flag defined twice."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  if "gin_file" in flags.FLAGS:
    return
  flags.DEFINE_multi_string("gin_file", [], "Gin config files, parsed in order.")
  flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings (also given as --gin.NAME=VALUE).")
  flags.DEFINE_list("gin_search_paths", [], "Extra gin search paths (before the defaults: "
                    "working directory, repository root).")
  flags.DEFINE_string("output_dir", None, output_dir_help)
