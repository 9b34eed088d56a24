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
the key is the lower-cased English text (translation), the package or manual page name
(summaries), and the source file (code, so no function of a held-out file is trained on).
Debian point releases and new wheels change the inputs, so a rebuild is close to, not identical
with, the committed files: rows whose key is in the committed valid split (`--holdout_from`) are
never written to the rebuilt train split, so models trained on a rebuild can be evaluated on the
committed files.

Never run by the tests (it needs the network and takes minutes).
"""
from __future__ import annotations

import ast
import collections
import concurrent.futures
import glob
import gzip
import hashlib
import html.parser
import json
import lzma
import os
import re
import struct
import subprocess
import sys
import time
import unicodedata
import zipfile
from pathlib import Path

from absl import app
from absl import flags
from absl import logging

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
# pylint: disable=g-import-not-at-top
from specdec_jax.data import checksums

TASK_SOURCES = {
    "translate_en_de": ["ding", "lohelp", "ddtp", "gnomehelp", "debref", "mo_base", "mo_gcc",
                        "mo_lo", "mo_pypi", "mo_plone"],
    "summarize": ["debian-descriptions", "manpages"],
    "code_complete": ["stdlib"],
}
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
DOC_PACKAGES = {
    "lohelp": ["libreoffice-help-en-us", "libreoffice-help-de"],
    "ding": ["trans-de-en"],
    "gnomehelp": ["gnome-user-docs"],
    "debref": ["debian-reference-en", "debian-reference-de"],
    "manpages": ["manpages", "manpages-dev"],
    "stdlib": ["libpython3.11-minimal", "libpython3.11-stdlib", "python3-distutils", "python3-tk"],
}
TRAIN_ONLY_DEFAULT = ["mo_base", "mo_gcc", "mo_lo", "mo_pypi", "mo_plone"]

_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where to write <task>/<split>.jsonl.xz.")
_WORK_DIR = flags.DEFINE_string("work_dir", None,
                                "Download/extraction cache (default OUTPUT_DIR/_work); reused.")
_TASKS = flags.DEFINE_list("tasks", list(TASK_SOURCES), "Tasks to build.")
_SOURCES = flags.DEFINE_list("sources", None, "Only these sources (default: all of each task).")
_MO_PACKAGES = flags.DEFINE_list("mo_packages", MO_PACKAGES, "Debian packages with .mo files.")
_PYPI = flags.DEFINE_list("pypi_packages", PYPI_PACKAGES, "Wheels with .mo files (pip specs).")
_MAN_DIRS = flags.DEFINE_list("man_dirs", [],
                              "Extra man folders (e.g. /usr/share/man) besides downloaded pages.")
_TRAIN_ONLY = flags.DEFINE_list("train_only_sources", TRAIN_ONLY_DEFAULT,
                                "Sources kept out of valid/test (short UI strings).")
_HOLDOUT = flags.DEFINE_string(
    "holdout_from", str(checksums.ASSETS_DATA_DIR),
    "Folder with <task>/valid.jsonl.xz whose keys must not reach the rebuilt train split "
    "('' to disable).")
_BOILERPLATE = flags.DEFINE_integer(
    "boilerplate_min_count", 5, "A paragraph found in this many documents is boilerplate.")
_WORKERS = flags.DEFINE_integer("workers", 2, "Parallel man renderers.")
_XZ_PRESET = flags.DEFINE_integer("xz_preset", 9, "xz compression preset.")


# ------------------------------------------------------------------------------------------------
# Fetching: private apt lists, apt-get download, dpkg-deb -x, pip download.


class Fetcher:
  """Downloads and unpacks packages under `work_dir`, reusing what is already there."""

  def __init__(self, work_dir: Path):
    self.work = work_dir
    self.lists = work_dir / "lists"
    self.apt_opts = ["-o", f"Dir::State::Lists={self.lists}", "-o", f"Dir::Cache={work_dir / 'cache'}",
                     "-o", "Acquire::Languages=en,de"]
    self.versions: dict[str, str] = {}

  def _run(self, cmd, **kw):
    logging.info("$ %s", " ".join(map(str, cmd))[:300])
    return subprocess.run(cmd, check=True, **kw)

  def update(self):
    if list(self.lists.glob("*_i18n_Translation-de*")):
      return
    (self.lists / "partial").mkdir(parents=True, exist_ok=True)
    (self.work / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    self._run(["apt-get", "update", *self.apt_opts], stdout=subprocess.DEVNULL)

  def translation_file(self, lang: str) -> str:
    """Concatenated, decompressed Translation-<lang> files of all suites."""
    text = []
    for path in sorted(self.lists.glob(f"*_i18n_Translation-{lang}*")):
      out = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", str(path)], check=True,
                           capture_output=True)
      text.append(out.stdout.decode("utf-8", "replace"))
    if not text:
      raise RuntimeError(f"no Translation-{lang} in {self.lists}; did apt-get update fail?")
    return "\n".join(text)

  def packages(self, names: list[str]) -> dict[str, Path]:
    """{package: extracted root} for the packages the archive has (missing ones are logged)."""
    self.update()
    debs, roots = self.work / "debs", self.work / "x"
    debs.mkdir(parents=True, exist_ok=True)
    have = {p.name.split("_")[0]: p for p in debs.glob("*.deb")}
    wanted = [n for n in dict.fromkeys(names) if n not in have]
    if wanted:
      shown = subprocess.run(["apt-cache", *self.apt_opts, "show", "--no-all-versions", *wanted],
                             capture_output=True, text=True).stdout
      known = re.findall(r"^Package: (\S+)", shown, re.M)
      for name in sorted(set(wanted) - set(known)):
        logging.warning("package %s not in the archive; skipped", name)
      if known:
        self._run(["apt-get", *self.apt_opts, "download", *known], cwd=debs,
                  stdout=subprocess.DEVNULL)
      have = {p.name.split("_")[0]: p for p in debs.glob("*.deb")}
    out = {}
    for name in names:
      if name not in have:
        continue
      self.versions[name] = have[name].name
      root = roots / name
      if not root.is_dir():
        tmp = roots / (name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        self._run(["dpkg-deb", "-x", str(have[name]), str(tmp)])
        tmp.rename(root)
      out[name] = root
    return out

  def wheels(self, specs: list[str]) -> list[Path]:
    dest = self.work / "pypi"
    dest.mkdir(parents=True, exist_ok=True)
    for spec in specs:
      name = re.split(r"[=<>!~ ]", spec)[0].lower().replace("-", "_").replace(".", "_")
      if any(p.name.lower().replace("-", "_").replace(".", "_").startswith(name + "_")
             for p in dest.glob("*.whl")):
        continue
      try:
        self._run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "-q", "-d", str(dest), spec], stdout=subprocess.DEVNULL)
      except subprocess.CalledProcessError:
        logging.warning("pip download %s failed; skipped", spec)
    found = sorted(dest.glob("*.whl"))
    self.versions.update({p.name: p.name for p in found})
    return found


# ------------------------------------------------------------------------------------------------
# Text helpers shared by the translation sources.

_WS = re.compile(r"\s+")


def fold(text: str) -> str:
  return _WS.sub(" ", unicodedata.normalize("NFC", text)).strip()


_SENT_SPLIT = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"”“»«)]))\s+(?=[\"„“«»(]?[A-ZÄÖÜ0-9])")
_ABBREV = re.compile(
    r"(?:\b(?:[A-Za-zÄÖÜäöü]\.\s?){1,3}|\b(?:etc|bzw|ca|Nr|Dr|Mr|Mrs|Ms|Prof|vs|usw|ggf|evtl|inkl|"
    r"bspw|sog|vgl|Abb|Kap|Tel|Str|No|Fig|approx|resp|incl|ff|zB|Hr|Fr|St|Jh|Jhd)\.|\b\d{1,2}\.)$")


def sentences(text: str) -> list[str]:
  parts = _SENT_SPLIT.split(text)
  out = []
  for part in parts:
    if out and _ABBREV.search(out[-1]):
      out[-1] += " " + part
    else:
      out.append(part)
  return out


_PLACEHOLDER = re.compile(
    r"%(?:\d+\$)?[-+ #0']*(?:\d+|\*)?(?:\.\d+)?(?:hh|h|ll|l|L|q|j|z|t|I64|w)*[a-zA-Z<>'%]"
    r"|%\([^)]+\)[-+ #0]*\d*(?:\.\d+)?[a-zA-Z]|\$\{[^}]*\}|\{[\w.\[\]!:]*\}")
_TAG = re.compile(r"</?([a-zA-Z][\w:-]*)[^<>]*>")


def placeholders(text: str) -> list[str]:
  return sorted(re.sub(r"^%\d+\$", "%", p) for p in _PLACEHOLDER.findall(text))


def markup(text: str) -> list[str]:
  return sorted(_TAG.findall(text)) + sorted(re.findall(r"&\w+;", text))


def strip_mnemonic(en: str, de: str) -> tuple[str, str]:
  """GTK '_File' / LibreOffice '~File' / Qt '&File' accelerators, when both sides have one."""
  for ch in "_~&":
    pat = re.compile(re.escape(ch) + r"(?=\w)")
    if en.count(ch) == 1 and de.count(ch) == 1 and pat.search(en) and pat.search(de):
      en, de = pat.sub("", en), pat.sub("", de)
  return en, de


def good_pair(en: str, de: str) -> bool:
  if not en or not de or en == de or en.lower() == de.lower():
    return False
  if not re.search(r"[A-Za-z]{2}", en) or len(en.split()) > 150:
    return False
  ratio = len(de) / len(en)
  if not 0.4 <= ratio <= 3.0 and abs(len(de) - len(en)) > 15:
    return False
  return placeholders(en) == placeholders(de) and markup(en) == markup(de)


def aligned_pairs(en: str, de: str) -> list[tuple[str, str]]:
  """One pair, or one per sentence where both sides split into the same number."""
  en, de = fold(en), fold(de)
  se, sd = sentences(en), sentences(de)
  if 1 < len(se) == len(sd):
    return list(zip(se, sd))
  return [(en, de)]


# ------------------------------------------------------------------------------------------------
# Block extraction from HTML (LibreOffice help, Debian Reference) and Mallard (GNOME help).

_VOID = {"br", "img", "meta", "input", "hr", "area", "base", "col", "embed", "param", "source",
         "track", "wbr"}


class BlockParser(html.parser.HTMLParser):
  """Collects the text of innermost block elements, in document order.

  `skip` tags are dropped with their content; elements with a `hidden` attribute too, except
  LibreOffice's "default..." variant of a system-dependent span (the others name Mac keys).
  A block holding an empty self-closing `<link/>` (Mallard fills it in at render time) is marked
  broken and dropped.
  """

  def __init__(self, blocks: set[str], skip: set[str], void: set[str] = frozenset(_VOID)):
    super().__init__(convert_charrefs=True)
    self.block_tags, self.skip_tags, self.void = blocks, skip, void
    self.stack: list[dict] = []
    self.blocks: list[tuple[str | None, str, bool]] = []  # (id, text, ok)

  def _open_block(self):
    return next((f for f in reversed(self.stack) if f["block"] is not None), None)

  def _skipping(self):
    return any(f["skip"] for f in self.stack)

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    if tag in self.void:
      self.handle_startendtag(tag, list(attrs.items()))
      return
    hidden = "hidden" in attrs and not str(attrs.get("id", "")).startswith("default")
    frame = {"tag": tag, "skip": tag in self.skip_tags or hidden, "block": None,
             "id": attrs.get("id"), "child": False, "ok": True}
    if tag in self.block_tags and not self._skipping():
      parent = self._open_block()
      if parent is not None:
        parent["child"] = True
      frame["block"] = []
    self.stack.append(frame)

  def handle_startendtag(self, tag, attrs):
    block = self._open_block()
    if block is None or self._skipping():
      return
    if tag == "br":
      block["block"].append(" ")
    elif tag == "link" and "xref" in dict(attrs):
      block["ok"] = False

  def handle_endtag(self, tag):
    if not any(f["tag"] == tag for f in self.stack):
      return
    while self.stack:
      frame = self.stack.pop()
      if frame["block"] is not None and not frame["child"]:
        self.blocks.append((frame["id"], "".join(frame["block"]), frame["ok"]))
      if frame["tag"] == tag:
        break

  def handle_data(self, data):
    block = self._open_block()
    if block is not None and not self._skipping():
      block["block"].append(data)


def parse_blocks(path: Path, blocks: set[str], skip: set[str], void=frozenset(_VOID)):
  parser = BlockParser(blocks, skip, void)
  parser.feed(path.read_text(encoding="utf-8", errors="replace"))
  parser.close()
  return parser.blocks


def pairs_by_order(en_blocks, de_blocks):
  if len(en_blocks) != len(de_blocks):
    return []
  return [(e[1], d[1]) for e, d in zip(en_blocks, de_blocks) if e[2] and d[2]]


# ------------------------------------------------------------------------------------------------
# Translation sources. Each yields (en, de) before cleaning.


def src_ding(roots):
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


def read_mo(data: bytes):
  """(msgid, msgstr) of a gettext .mo catalogue; plural and empty entries skipped."""
  if len(data) < 28:
    return
  magic = struct.unpack("<I", data[:4])[0]
  end = "<" if magic == 0x950412DE else ">" if magic == 0xDE120495 else None
  if end is None:
    return
  n, orig, trans = struct.unpack(end + "3I", data[8:20])
  entries = []
  for k in range(n):
    olen, ooff = struct.unpack(end + "2I", data[orig + 8 * k:orig + 8 * k + 8])
    tlen, toff = struct.unpack(end + "2I", data[trans + 8 * k:trans + 8 * k + 8])
    entries.append((data[ooff:ooff + olen], data[toff:toff + tlen]))
  charset = "utf-8"
  for msgid, msgstr in entries:
    if not msgid:
      m = re.search(rb"charset=([\w.-]+)", msgstr)
      charset = m.group(1).decode() if m else charset
  for msgid, msgstr in entries:
    if not msgid or not msgstr or b"\x00" in msgid:
      continue
    msgid = msgid.split(b"\x04")[-1]
    try:
      yield msgid.decode(charset), msgstr.decode(charset)
    except (UnicodeDecodeError, LookupError):
      continue


def _mo_pairs(mo_files):
  for data in mo_files:
    for en, de in read_mo(data):
      en, de = strip_mnemonic(en, de)
      yield from aligned_pairs(en, de)


def src_mo_debian(roots, which):
  def files():
    for pkg, root in roots.items():
      if MO_SOURCE_OF_PACKAGE.get(pkg, "mo_base") != which:
        continue
      for path in sorted(root.rglob("*.mo")):
        if "/de/LC_MESSAGES/" in path.as_posix() or "/de_DE/LC_MESSAGES/" in path.as_posix():
          yield path.read_bytes()
  yield from _mo_pairs(files())


def src_mo_pypi(wheels, which):
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


# ------------------------------------------------------------------------------------------------
# Debian descriptions (shared by ddtp and the summaries).


def parse_translations(text: str, lang: str) -> dict[str, tuple[str, str, list[str]]]:
  """{Description-md5: (package, short description, long description lines)}."""
  out = {}
  for stanza in text.split("\n\n"):
    pkg = re.search(r"^Package: (\S+)", stanza, re.M)
    md5 = re.search(r"^Description-md5: (\S+)", stanza, re.M)
    desc = re.search(rf"^Description-{lang}: (.*)\n?((?: .*\n?)*)", stanza, re.M)
    if pkg and md5 and desc and md5.group(1) not in out:
      out[md5.group(1)] = (pkg.group(1), desc.group(1).strip(),
                           [line for line in desc.group(2).split("\n") if line])
  return out


def description_paragraphs(lines: list[str]) -> list[list[str]]:
  """Long description lines (leading space kept) split at ' .' lines."""
  paras, cur = [], []
  for line in lines:
    if line.strip() == ".":
      if cur:
        paras.append(cur)
      cur = []
    else:
      cur.append(line[1:])
  if cur:
    paras.append(cur)
  return paras


def paragraph_text(para: list[str]) -> str:
  """Wrapped lines joined by spaces; indented (verbatim, list) lines kept on their own line."""
  out = ""
  for line in para:
    if line.startswith(" "):
      out += ("\n" if out else "") + line.rstrip()
    elif out and not out.split("\n")[-1].startswith(" "):
      out += " " + line.strip()
    else:
      out += ("\n" if out else "") + line.strip()
  return out


_BULLET = re.compile(r"^\s+[-*+o]\s+")


def paragraph_segments(para: list[str]) -> list[str]:
  """Translatable pieces of a paragraph: the running text and each bullet item."""
  segs, cur = [], []
  for line in para:
    if _BULLET.match(line):
      if cur:
        segs.append(" ".join(cur))
      cur = [_BULLET.sub("", line)]
    else:
      cur.append(line.strip())
  if cur:
    segs.append(" ".join(cur))
  return [s for s in segs if s]


def remove_boilerplate(docs: dict[str, list[str]]) -> dict[str, list[str]]:
  """Drops paragraphs that occur in `--boilerplate_min_count` or more documents.

  These are licence notes, "This package contains the development files" blurbs and the intro a
  family of packages (-dev, -doc, -data, ...) shares; what remains is specific to one document.
  """
  min_count = _BOILERPLATE.value
  counts = collections.Counter(p for paras in docs.values() for p in set(paras))
  return {k: [p for p in paras if counts[p] < min_count] for k, paras in docs.items()}


def cap_words(paras: list[str], max_words: int = 1000) -> list[str]:
  out, n = [], 0
  for p in paras:
    n += len(p.split())
    if out and n > max_words:
      break
    out.append(p)
  return out


def src_descriptions(fetcher):
  en = parse_translations(fetcher.translation_file("en"), "en")
  docs, meta = {}, {}
  for _, (pkg, short, long_lines) in sorted(en.items(), key=lambda kv: kv[1][0]):
    paras = [paragraph_text(p) for p in description_paragraphs(long_lines)]
    docs[pkg], meta[pkg] = [p for p in paras if p], short
  seen = set()
  for pkg, paras in remove_boilerplate(docs).items():
    doc = "\n\n".join(cap_words(paras))
    summary = fold(meta[pkg])
    if len(doc.split()) >= 30 and summary and doc not in seen:
      seen.add(doc)
      yield {"document": unicodedata.normalize("NFC", doc), "summary": summary, "id": pkg}


# ------------------------------------------------------------------------------------------------
# Manual pages: DESCRIPTION section -> NAME line.


def render_man(path: Path) -> str | None:
  env = dict(os.environ, MANWIDTH="2000", LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="")
  try:
    out = subprocess.run(["man", "-l", "-E", "UTF-8", "--nh", "--nj", str(path)],
                         capture_output=True, env=env, timeout=60)
  except subprocess.TimeoutExpired:
    return None
  return out.stdout.decode("utf-8", "replace") if out.returncode == 0 else None


def parse_man(text: str) -> tuple[str, list[str]] | None:
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
  dirs = [r / "usr/share/man" for r in roots.values()] + [Path(d) for d in extra_dirs]
  files = {}
  for d in dirs:
    for path in sorted(d.glob("man[1-8]*/*")):
      if path.is_symlink() or not path.is_file() or path.name in files:
        continue
      head = (gzip.open(path) if path.suffix == ".gz" else open(path, "rb")).read(200)
      if head.startswith(b".so "):
        continue  # an alias of another page
      files[path.name] = path
  return files


def src_manpages(roots, extra_dirs, workers):
  files = man_files(roots, extra_dirs)
  logging.info("rendering %d manual pages", len(files))
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    rendered = dict(zip(files, pool.map(render_man, files.values())))
  docs, summaries = {}, {}
  for name, text in rendered.items():
    parsed = parse_man(text) if text else None
    if parsed:
      summaries[name], docs[name] = parsed
  for name, paras in remove_boilerplate(docs).items():
    doc = "\n\n".join(cap_words(paras))
    if len(doc.split()) >= 30:
      yield {"document": unicodedata.normalize("NFC", doc),
             "summary": fold(summaries[name]), "id": name}


# ------------------------------------------------------------------------------------------------
# Code: CPython standard library functions with docstrings.

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
  for pkg in DOC_PACKAGES["stdlib"]:
    if pkg not in roots:
      continue
    base = roots[pkg] / "usr/lib/python3.11"
    for path in sorted(base.rglob("*.py")):
      parts = path.relative_to(base).parts
      if any(p in _SKIP_DIRS for p in parts) or path.is_symlink():
        continue
      rel = "stdlib/" + "/".join(parts)
      yield from code_examples(path.read_text(encoding="utf-8", errors="replace"), rel)


# ------------------------------------------------------------------------------------------------
# Splitting and writing.


def bucket(key: str) -> str:
  b = int(hashlib.sha1(key.encode("utf-8")).hexdigest(), 16) % 1000
  return "test" if b < 10 else "valid" if b < 20 else "train"


def split_key(task: str, row: dict) -> str:
  if task == "translate_en_de":
    return row["en"].lower()
  if task == "summarize":
    return row["id"]
  return row["task_id"].split(":")[0]


def holdout_keys(task: str) -> set[str]:
  if not _HOLDOUT.value:
    return set()
  path = Path(_HOLDOUT.value) / task / "valid.jsonl.xz"
  if not path.is_file():
    logging.warning("no %s; no holdout for %s", path, task)
    return set()
  with lzma.open(path, "rt", encoding="utf-8") as f:
    return {split_key(task, json.loads(line)) for line in f if line.strip()}


def write_task(out_dir: Path, task: str, rows: list[dict], info: dict):
  held = holdout_keys(task)
  train_only = set(_TRAIN_ONLY.value)
  splits = collections.defaultdict(list)
  counts = collections.defaultdict(collections.Counter)
  dropped = 0
  for row in rows:
    key = split_key(task, row)
    split = "train" if row.get("src") in train_only else bucket(key)
    if split == "train" and key in held:
      dropped += 1
      continue
    splits[split].append(row)
    counts[split][row.get("src", task)] += 1
  (out_dir / task).mkdir(parents=True, exist_ok=True)
  for split in ("train", "valid", "test"):
    with lzma.open(out_dir / task / f"{split}.jsonl.xz", "wt", encoding="utf-8",
                   preset=_XZ_PRESET.value) as f:
      for row in splits[split]:
        f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
  info[task] = {"rows": {s: len(splits[s]) for s in ("train", "valid", "test")},
                "by_source": {s: dict(c) for s, c in counts.items()},
                "dropped_from_train_as_committed_valid": dropped}
  logging.info("%s: %s", task, info[task]["rows"])


def build_translation(fetcher, sources):
  pkgs = set()
  for s in ("lohelp", "ding", "gnomehelp", "debref"):
    if s in sources:
      pkgs.update(DOC_PACKAGES[s])
  mo_sources = {"mo_base", "mo_gcc", "mo_lo"} & set(sources)
  if mo_sources:
    pkgs.update(p for p in _MO_PACKAGES.value
                if MO_SOURCE_OF_PACKAGE.get(p, "mo_base") in mo_sources)
  roots = fetcher.packages(sorted(pkgs)) if pkgs else {}
  wheels = fetcher.wheels(_PYPI.value) if {"mo_pypi", "mo_plone"} & set(sources) else []
  mo_roots = {p: r for p, r in roots.items() if p in _MO_PACKAGES.value}
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
  for src in TASK_SOURCES["translate_en_de"]:
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


def build_summaries(fetcher, sources):
  rows, seen = [], set()
  if "debian-descriptions" in sources:
    fetcher.update()
    for row in src_descriptions(fetcher):
      rows.append({**row, "src": "debian-descriptions"})
  if "manpages" in sources:
    roots = fetcher.packages(DOC_PACKAGES["manpages"] + _MO_PACKAGES.value)
    for row in src_manpages(roots, _MAN_DIRS.value, _WORKERS.value):
      rows.append({**row, "src": "manpages"})
  out = []
  for row in rows:
    if row["id"] not in seen:
      seen.add(row["id"])
      out.append(row)
  return out


def build_code(fetcher, sources):
  if "stdlib" not in sources:
    return []
  rows, seen = [], set()
  for row in src_stdlib(fetcher.packages(DOC_PACKAGES["stdlib"])):
    if (row["prompt"], row["canonical_solution"]) not in seen:
      seen.add((row["prompt"], row["canonical_solution"]))
      rows.append(row)
  return rows


def main(argv):
  del argv
  out_dir = Path(_OUTPUT_DIR.value)
  work = Path(_WORK_DIR.value or out_dir / "_work")
  work.mkdir(parents=True, exist_ok=True)
  fetcher = Fetcher(work.resolve())
  builders = {"translate_en_de": build_translation, "summarize": build_summaries,
              "code_complete": build_code}
  info = {}
  for task in _TASKS.value:
    if task not in TASK_SOURCES:
      raise app.UsageError(f"unknown task {task}; tasks: {', '.join(TASK_SOURCES)}")
    sources = [s for s in TASK_SOURCES[task] if _SOURCES.value is None or s in _SOURCES.value]
    t0 = time.time()
    rows = builders[task](fetcher, sources)
    write_task(out_dir, task, rows, info)
    info[task]["seconds"] = round(time.time() - t0, 1)
  info["packages"] = fetcher.versions
  checksums.write_sums(out_dir)
  (out_dir / "build_info.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
  print(json.dumps({t: v["rows"] for t, v in info.items() if t in TASK_SOURCES}, indent=1))


if __name__ == "__main__":
  flags.mark_flag_as_required("output_dir")
  app.run(main)
