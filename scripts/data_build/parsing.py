"""Reading the raw formats the sources ship: text cleaning, HTML / Mallard blocks, gettext
`.mo` catalogues and Debian package descriptions.

Why one module: these are the pure parts of a build, functions of bytes and strings that touch
no network and no package, so they can be read and tested (tests/data/test_build.py) on their
own; `tasks` combines them into each task's rows.

Text cleaning (`fold`, `sentences`, `placeholders`, `markup`, `strip_mnemonic`, `good_pair`,
`aligned_pairs`), shared by the translation sources. Why: the sources differ (dictionary lines,
help pages, gettext catalogues, package descriptions), the cleaning rules of SOURCES.md do not:
Unicode NFC with folded whitespace, pairs whose format placeholders or markup differ are dropped
(one side would teach the model to invent or lose a `%s` or a tag), and multi-sentence
paragraphs are split 1:1 only when both sides split into the same number of sentences.

Blocks (`BlockParser`, `parse_blocks`, `pairs_by_order`): text of the innermost block elements
of HTML (LibreOffice help, Debian Reference) and Mallard (GNOME help) pages. Why: translated
help pages keep the block structure of the English original, so paragraphs, headings and table
cells can be paired by their `id` (LibreOffice) or by their order (GNOME, Debian Reference)
without any sentence aligner. Only innermost blocks are kept, so a list item holding paragraphs
gives its paragraphs, never their concatenation.

Gettext catalogues (`read_mo`): (msgid, msgstr) pairs of compiled `.mo` files. Why: German
software messages ship in Debian packages and wheels only in compiled form, and the format is
simple enough (GNU gettext: magic, revision, count, offsets of two tables of (length, offset)
pairs) that reading it needs no gettext tools on the build machine.

Debian package descriptions (`parse_translations`, `description_paragraphs`, `paragraph_text`,
`paragraph_segments`), as apt's Translation-<lang> files hold them. Why: the same parsing serves
two tasks. The English and German descriptions of a package, matched by `Description-md5`, give
translation pairs (ddtp); an English long description and its short description give a
summarisation example. A long description is a list of lines that start with a space; " ."
separates paragraphs, lines with more than one leading space are verbatim (lists, code), the
rest is wrapped running text (Debian Policy, "Description").
"""
from __future__ import annotations

import html.parser
import re
import struct
import unicodedata
from pathlib import Path


# ================================================================================================
# Text cleaning: folding, sentence splitting, pair filters
# ================================================================================================


_WS = re.compile(r"\s+")


def fold(text: str) -> str:
  """NFC, whitespace runs to one space, stripped."""
  return _WS.sub(" ", unicodedata.normalize("NFC", text)).strip()


_SENT_SPLIT = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"”“»«)]))\s+(?=[\"„“«»(]?[A-ZÄÖÜ0-9])")
_ABBREV = re.compile(
    r"(?:\b(?:[A-Za-zÄÖÜäöü]\.\s?){1,3}|\b(?:etc|bzw|ca|Nr|Dr|Mr|Mrs|Ms|Prof|vs|usw|ggf|evtl|inkl|"
    r"bspw|sog|vgl|Abb|Kap|Tel|Str|No|Fig|approx|resp|incl|ff|zB|Hr|Fr|St|Jh|Jhd)\.|\b\d{1,2}\.)$")


def sentences(text: str) -> list[str]:
  """Splits after . ! ? (and a closing quote) before a capital or digit, not after abbreviations.

  A piece that ends with an English or German abbreviation ("e.g.", "z. B.", "Nr.") or a German
  ordinal ("3.") is joined with the next one by a single space.
  """
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
  """printf, Python %(name)s, ${var} and {field} placeholders, sorted; `%1$s` counts as `%s`.

  Positions are dropped because translators reorder them legitimately.
  """
  return sorted(re.sub(r"^%\d+\$", "%", p) for p in _PLACEHOLDER.findall(text))


def markup(text: str) -> list[str]:
  """Tag names (opening and closing) and character entities, sorted."""
  return sorted(_TAG.findall(text)) + sorted(re.findall(r"&\w+;", text))


def strip_mnemonic(en: str, de: str) -> tuple[str, str]:
  """GTK '_File' / LibreOffice '~File' / Qt '&File' accelerators, when both sides have one."""
  for ch in "_~&":
    # '&' before "amp;" / "#39;" is an HTML entity, not an accelerator.
    pat = re.compile(re.escape(ch) + (r"(?=\w)(?!#?\w+;)" if ch == "&" else r"(?=\w)"))
    if en.count(ch) == 1 and de.count(ch) == 1 and pat.search(en) and pat.search(de):
      en, de = pat.sub("", en), pat.sub("", de)
  return en, de


def good_pair(en: str, de: str) -> bool:
  """Whether a folded (en, de) pair is kept: a real, plausibly long translation, same format.

  Drops empty and untranslated pairs, English without two consecutive ASCII letters, English of
  more than 150 words, length ratios outside 0.4-3 (unless the lengths differ by at most 15
  characters) and pairs whose placeholders or markup differ.
  """
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


# ================================================================================================
# Blocks of HTML and Mallard pages
# ================================================================================================


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
  """[(id, text, ok)] of the innermost `blocks` elements of the page at `path`."""
  parser = BlockParser(blocks, skip, void)
  parser.feed(path.read_text(encoding="utf-8", errors="replace"))
  parser.close()
  return parser.blocks


def pairs_by_order(en_blocks, de_blocks):
  """Blocks paired by position; nothing when the counts differ (the structure is not the same)."""
  if len(en_blocks) != len(de_blocks):
    return []
  return [(e[1], d[1]) for e, d in zip(en_blocks, de_blocks) if e[2] and d[2]]


# ================================================================================================
# Gettext .mo catalogues
# ================================================================================================


def read_mo(data: bytes):
  """(msgid, msgstr) of a gettext .mo catalogue; plural and empty entries skipped.

  Little- and big-endian catalogues are read; anything else (less than a header, tables past
  the end of a truncated file) yields nothing. The charset is the one the header entry (empty msgid) names, utf-8 if none; a
  msgctxt prefix is dropped from the msgid, and entries that do not decode are skipped.
  """
  if len(data) < 28:
    return
  magic = struct.unpack("<I", data[:4])[0]
  end = "<" if magic == 0x950412DE else ">" if magic == 0xDE120495 else None
  if end is None:
    return
  n, orig, trans = struct.unpack(end + "3I", data[8:20])
  entries = []
  try:
    for k in range(n):
      olen, ooff = struct.unpack(end + "2I", data[orig + 8 * k:orig + 8 * k + 8])
      tlen, toff = struct.unpack(end + "2I", data[trans + 8 * k:trans + 8 * k + 8])
      entries.append((data[ooff:ooff + olen], data[toff:toff + tlen]))
  except struct.error:
    return  # a truncated catalogue: its tables point past the end of the file
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


# ================================================================================================
# Debian package descriptions (apt's Translation-<lang> files)
# ================================================================================================


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
