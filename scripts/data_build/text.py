"""Text cleaning shared by the translation sources: folding, sentence splitting, pair filters.

Why: the sources differ (dictionary lines, help pages, gettext catalogues, package
descriptions), the cleaning rules of SOURCES.md do not: Unicode NFC with folded whitespace,
pairs whose format placeholders or markup differ are dropped (one side would teach the model to
invent or lose a `%s` or a tag), and multi-sentence paragraphs are split 1:1 only when both sides
split into the same number of sentences.
"""
from __future__ import annotations

import re
import unicodedata

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
