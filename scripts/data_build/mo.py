"""(msgid, msgstr) pairs of compiled gettext catalogues (`.mo` files).

Why: German software messages ship in Debian packages and wheels only in compiled form, and the
format is simple enough (GNU gettext: magic, revision, count, offsets of two tables of
(length, offset) pairs) that reading it needs no gettext tools on the build machine.
"""
from __future__ import annotations

import re
import struct


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
