"""summarize: documents and their one-line summaries from Debian package metadata.

Why: Debian holds two large sets of headline-style summaries written by people, each next to the
text it summarises: a package's long description and its short description, and a manual page's
DESCRIPTION section and its NAME line (rendered with `man -l`, never installed). Paragraphs that
many documents share (licence notes, the blurb of a -dev/-doc/-data family) are removed, because
they say nothing about the one document.
"""
from __future__ import annotations

import collections
import concurrent.futures
import gzip
import os
import re
import subprocess
import unicodedata
from pathlib import Path

from absl import logging

from data_build.descriptions import (description_paragraphs, paragraph_text,
                                                 parse_translations)
from data_build.text import fold

SOURCES = ["debian-descriptions", "manpages"]
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
