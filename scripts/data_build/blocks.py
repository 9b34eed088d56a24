"""Text of the innermost block elements of HTML (LibreOffice help, Debian Reference) and Mallard
(GNOME help) pages.

Why: translated help pages keep the block structure of the English original, so paragraphs,
headings and table cells can be paired by their `id` (LibreOffice) or by their order (GNOME,
Debian Reference) without any sentence aligner. Only innermost blocks are kept, so a list item
holding paragraphs gives its paragraphs, never their concatenation.
"""
from __future__ import annotations

import html.parser
from pathlib import Path

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
