"""Debian package descriptions as apt's Translation-<lang> files hold them.

Why: the same parsing serves two tasks. The English and German descriptions of a package,
matched by `Description-md5`, give translation pairs (ddtp); an English long description and
its short description give a summarisation example. A long description is a list of lines that
start with a space; " ." separates paragraphs, lines with more than one leading space are
verbatim (lists, code), the rest is wrapped running text (Debian Policy, "Description").
"""
from __future__ import annotations

import re


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
