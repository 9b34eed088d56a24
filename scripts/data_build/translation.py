"""translate_en_de: English -> German pairs from Debian packages and PyPI wheels.

Why: human translations of software and documentation are the only parallel text a machine
with access to nothing but the Debian archive and PyPI can get, and there is plenty of it:
help pages (LibreOffice, GNOME, Debian Reference), gettext catalogues, the Debian Description
Translation Project and the Ding dictionary's example sentences. Each `src_*` yields raw
(en, de) pairs; `build_translation` folds them, filters them with `text.good_pair` and
de-duplicates them by lower-cased English, the sources taken in `SOURCES` order.
"""
from __future__ import annotations

import re
import time
import zipfile

from absl import logging

from data_build.blocks import pairs_by_order, parse_blocks
from data_build.descriptions import (description_paragraphs, paragraph_segments,
                                                 parse_translations)
from data_build.mo import read_mo
from data_build.text import aligned_pairs, fold, good_pair, strip_mnemonic

SOURCES = ["ding", "lohelp", "ddtp", "gnomehelp", "debref", "mo_base", "mo_gcc", "mo_lo",
           "mo_pypi", "mo_plone"]
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
  for src in SOURCES:
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
