"""The pure parts of the data builders (scripts/data_build): no network, no packages.

scripts/build_data.py itself needs the Debian archive and PyPI and is never run here; these
tests pin the cleaning, parsing and splitting rules that decide what a rebuild contains. The
builders are not part of the installed package (they shell out to apt-get and pip), so scripts/
goes on sys.path, as `python scripts/build_data.py` has it.
"""
import hashlib
import json
import lzma
import os
import struct
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "scripts"))

from data_build import parsing  # noqa: E402  (after sys.path)
from data_build import sources  # noqa: E402  (after sys.path)
from data_build import tasks  # noqa: E402

# ------------------------------------------------------------------------------------------------
# parsing: text


def test_fold_nfc_and_whitespace():
  assert parsing.fold(" a\u0301\n\t b  ") == "\u00e1 b"


@pytest.mark.parametrize("paragraph, expected", [
    ("Open the file. Then close it!", ["Open the file.", "Then close it!"]),
    # English and German abbreviations, German ordinals: no split after them.
    ("Use e.g. the file. Dr. Smith agrees.", ["Use e.g. the file.", "Dr. Smith agrees."]),
    ("Das ist z. B. ein Test. Er kam am 3. Mai. Dann ging er.",
     ["Das ist z. B. ein Test.", "Er kam am 3. Mai.", "Dann ging er."]),
    ("Siehe Nr. 5 und vgl. Abb. 12 im Text. Fertig.",
     ["Siehe Nr. 5 und vgl. Abb. 12 im Text.", "Fertig."]),
    # ... so a sentence that ends in a one- or two-digit number is not split off either.
    ("The answer is 42. Next one.", ["The answer is 42. Next one."]),
    # German quotes: the closing quote stays with its sentence, the opening one starts the next.
    ("Er sagte: „Das ist gut.“ Dann ging er. „Kommst du?“ fragte sie.",
     ["Er sagte: „Das ist gut.“", "Dann ging er.", "„Kommst du?“ fragte sie."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    # No split before a lower-case word or inside a number.
    ("Version 3.2 is out. see below.", ["Version 3.2 is out. see below."]),
])
def test_sentences(paragraph, expected):
  assert parsing.sentences(paragraph) == expected


def test_placeholders_and_markup():
  assert parsing.placeholders("Copy %1$s to %2$d, {name} ${HOME} %(count)d %%") == [
      "${HOME}", "%%", "%(count)d", "%d", "%s", "{name}"]
  # Translators may reorder positional arguments.
  assert parsing.placeholders("%2$s von %1$s") == parsing.placeholders("%s of %s")
  assert parsing.markup("<b>Save</b> &amp; <a href='x'>go</a>") == ["a", "a", "b", "b", "&amp;"]


@pytest.mark.parametrize("en, de, ok", [
    ("cannot open %s", "kann %s nicht öffnen", True),
    ("cannot open %s", "kann %d nicht öffnen", False),           # placeholder differs
    ("cannot open %s", "kann nicht öffnen", False),              # placeholder lost
    ("Hello {name}, welcome", "Hallo {user}, willkommen", False),
    ("Click <b>Save</b> now", "Klicken Sie jetzt auf Speichern", False),  # markup lost
    ("Click <b>Save</b> now", "Klicken Sie jetzt auf <i>Speichern</i>", False),
    ("Click <b>Save</b> now", "Klicken Sie jetzt auf <b>Speichern</b>", True),
    ("Tom &amp; Jerry show", "Tom und Jerry Sendung", False),
    ("Settings", "Settings", False),                             # untranslated
    ("OK", "ok", False),
    ("42 %", "42 %", False),
    ("Save the current document to disk", "Speichern", False),   # ratio far below 0.4
    ("", "leer", False),
])
def test_good_pair(en, de, ok):
  assert parsing.good_pair(en, de) is ok


def test_aligned_pairs_splits_only_when_counts_match():
  assert parsing.aligned_pairs("Open the file. Then  close it.",
                            "Öffnen Sie die Datei. Dann schließen Sie sie.") == [
      ("Open the file.", "Öffnen Sie die Datei."), ("Then close it.", "Dann schließen Sie sie.")]
  assert parsing.aligned_pairs("Open the file. Then close it.",
                            "Öffnen Sie die Datei und\nschließen Sie sie.") == [
      ("Open the file. Then close it.", "Öffnen Sie die Datei und schließen Sie sie.")]


def test_aligned_sentences_are_filtered_one_by_one():
  pairs = parsing.aligned_pairs("Open %s now. Then close <b>it</b>.",
                             "Öffne %d jetzt. Dann schließe <b>sie</b>.")
  assert len(pairs) == 2
  assert [parsing.good_pair(en, de) for en, de in pairs] == [False, True]


def test_strip_mnemonic():
  assert parsing.strip_mnemonic("_Open file", "Datei _öffnen") == ("Open file", "Datei öffnen")
  assert parsing.strip_mnemonic("~Save", "~Speichern") == ("Save", "Speichern")
  # Only when both sides have exactly one.
  assert parsing.strip_mnemonic("_Open file", "Datei öffnen") == ("_Open file", "Datei öffnen")
  assert parsing.strip_mnemonic("a_b_c word", "a_b_c Wort") == ("a_b_c word", "a_b_c Wort")
  assert parsing.strip_mnemonic("&File", "&Datei") == ("File", "Datei")
  # An HTML entity is not a Qt accelerator.
  assert parsing.strip_mnemonic("Save &amp; Close", "Speichern &amp; Schlie\u00dfen") == (
      "Save &amp; Close", "Speichern &amp; Schlie\u00dfen")


# ------------------------------------------------------------------------------------------------
# parsing: blocks


def test_block_parser_innermost_hidden_and_br():
  parser = parsing.BlockParser({"p", "li", "title"}, {"script", "head"})
  parser.feed('<html><head><title>T</title></head><body>'
              '<p id="a">Press <b>Save</b>.<br>Done</p>'
              '<ul><li id="l">Item <p id="inner">Inner</p> tail</li></ul>'
              '<p id="h">Keys: <span hidden id="mac">Cmd</span>'
              '<span hidden id="default1">Ctrl</span></p>'
              '<script>x()</script><p>A &amp; B</p></body></html>')
  parser.close()
  assert parser.blocks == [("a", "Press Save. Done", True), ("inner", "Inner", True),
                           ("h", "Keys: Ctrl", True), (None, "A & B", True)]


def test_mallard_xref_link_marks_block_broken(tmp_path):
  page = tmp_path / "x.page"
  page.write_text('<page><title>Net</title><p>See <link xref="x"/> now.</p>'
                  '<p>Run <code>ls</code> here.</p></page>', encoding="utf-8")
  parsed = parsing.parse_blocks(page, {"p", "title"}, {"code"}, void=frozenset())
  assert parsed == [(None, "Net", True), (None, "See  now.", False), (None, "Run  here.", True)]
  assert parsing.pairs_by_order(parsed, parsed) == [("Net", "Net"), ("Run  here.", "Run  here.")]
  assert parsing.pairs_by_order(parsed, parsed[:2]) == []


# ------------------------------------------------------------------------------------------------
# parsing: .mo catalogues


def _mo_bytes(entries, endian="<"):
  """A GNU .mo catalogue of (msgid, msgstr) byte strings, without a hash table."""
  n = len(entries)
  orig, trans = 28, 28 + 8 * n
  data_start = trans + 8 * n
  strings, orig_table, trans_table = b"", b"", b""
  for column, table in ((0, "orig"), (1, "trans")):
    for entry in entries:
      s = entry[column]
      pair = struct.pack(endian + "2I", len(s), data_start + len(strings))
      strings += s + b"\x00"
      if table == "orig":
        orig_table += pair
      else:
        trans_table += pair
  header = struct.pack(endian + "7I", 0x950412DE, 0, n, orig, trans, 0, 0)
  return header + orig_table + trans_table + strings


def test_read_mo_entries_charset_plural_context():
  entries = [
      (b"", b"Content-Type: text/plain; charset=ISO-8859-1\n"),
      (b"cannot open %s", "kann %s nicht öffnen".encode("latin-1")),
      (b"%d file\x00%d files", b"%d Datei\x00%d Dateien"),      # plural: skipped
      (b"menu\x04Save", b"Speichern"),                          # context: dropped
      (b"untranslated", b""),                                   # empty msgstr: skipped
  ]
  assert list(parsing.read_mo(_mo_bytes(entries))) == [
      ("cannot open %s", "kann %s nicht öffnen"), ("Save", "Speichern")]
  assert list(parsing.read_mo(_mo_bytes(entries, endian=">"))) == list(
      parsing.read_mo(_mo_bytes(entries)))


def test_read_mo_without_header_is_utf8_and_rejects_other_files():
  data = _mo_bytes([(b"Quit", "Beenden ✓".encode())])
  assert list(parsing.read_mo(data)) == [("Quit", "Beenden ✓")]
  assert list(parsing.read_mo(b"\x00" * 4 + data[4:])) == []
  assert list(parsing.read_mo(data[:20])) == []
  # Cut inside the offset tables: nothing, not a struct.error.
  two = _mo_bytes([(b"Quit", b"Beenden"), (b"Open", b"Offnen")])
  assert list(parsing.read_mo(two[:36])) == []


# ------------------------------------------------------------------------------------------------
# parsing: descriptions

_STANZAS = """\
Package: foo
Description-md5: 0123456789abcdef0123456789abcdef
Description-en: tool that frobs files
 Foo frobs files quickly
 and safely.
 .
 Features:
  * fast frobbing
    of many files
  - safe mode
  o legacy mode
 .
 Example:
   foo --frob x

Package: bar
Description-md5: 0123456789abcdef0123456789abcdef
Description-en: the same md5 again
 ignored

Package: baz
Description-md5: fedcba9876543210fedcba9876543210
Description-de: Werkzeug
 Ein Absatz.
"""


def test_parse_translations_first_md5_wins_and_language_filter():
  en = parsing.parse_translations(_STANZAS, "en")
  assert list(en) == ["0123456789abcdef0123456789abcdef"]
  pkg, short, long_lines = en["0123456789abcdef0123456789abcdef"]
  assert (pkg, short) == ("foo", "tool that frobs files")
  assert long_lines[:3] == [" Foo frobs files quickly", " and safely.", " ."]
  assert len(long_lines) == 11
  de = parsing.parse_translations(_STANZAS, "de")
  assert de == {"fedcba9876543210fedcba9876543210": ("baz", "Werkzeug", [" Ein Absatz."])}


def test_description_paragraphs_text_and_segments():
  _, _, long_lines = parsing.parse_translations(_STANZAS, "en")[
      "0123456789abcdef0123456789abcdef"]
  paras = parsing.description_paragraphs(long_lines)
  assert paras == [["Foo frobs files quickly", "and safely."],
                   ["Features:", " * fast frobbing", "   of many files", " - safe mode",
                    " o legacy mode"],
                   ["Example:", "  foo --frob x"]]
  assert [parsing.paragraph_text(p) for p in paras] == [
      "Foo frobs files quickly and safely.",
      "Features:\n * fast frobbing\n   of many files\n - safe mode\n o legacy mode",
      "Example:\n  foo --frob x"]
  assert [parsing.paragraph_segments(p) for p in paras] == [
      ["Foo frobs files quickly and safely."],
      ["Features:", "fast frobbing of many files", "safe mode", "legacy mode"],
      ["Example: foo --frob x"]]


def test_description_paragraphs_ignore_empty_separators():
  assert parsing.description_paragraphs([" .", " a", " .", " .", " b", " ."]) == [["a"],
                                                                                      ["b"]]


# ------------------------------------------------------------------------------------------------
# tasks: code_complete

_SOURCE = '''\
import os


@staticmethod
def add(a, b):
    """Return the sum of a and b.

    Works for numbers.
    """
    total = a + b
    return total


def short(x):
    """One line of body is too short."""
    return x


def no_doc(x):
    y = x
    return y


def same_line(x):
    """Doc."""; y = x
    return y


class K:
    def method(self, n):
        \'\'\'Count to n.\'\'\'
        out = []
        for i in range(n):
            out.append(i)
        return out

    def outer(self):
        """Outer."""
        def inner():
            """Nested functions are part of the body, not examples."""
            a = 1
            return a
        return inner()
'''


def test_code_examples_prompt_is_signature_and_docstring():
  rows = list(tasks.code_examples(_SOURCE, "stdlib/m.py"))
  assert [r["task_id"] for r in rows] == ["stdlib/m.py:add:5", "stdlib/m.py:method:30",
                                          "stdlib/m.py:outer:37"]
  assert rows[0] == {
      "prompt": '@staticmethod\ndef add(a, b):\n    """Return the sum of a and b.\n\n'
                '    Works for numbers.\n    """\n',
      "canonical_solution": "    total = a + b\n    return total\n",
      "task_id": "stdlib/m.py:add:5"}
  # Methods are dedented to column 0.
  assert rows[1]["prompt"] == "def method(self, n):\n    '''Count to n.'''\n"
  assert rows[1]["canonical_solution"] == ("    out = []\n    for i in range(n):\n"
                                           "        out.append(i)\n    return out\n")
  assert rows[2]["canonical_solution"].startswith("    def inner():\n")


def test_code_examples_limits_and_bad_source():
  def source(n_lines):
    return 'def f():\n    """Doc."""\n' + "".join(f"    x{i} = {i}\n" for i in range(n_lines))

  assert [r["task_id"] for r in tasks.code_examples(source(40), "m.py")] == ["m.py:f:1"]
  assert list(tasks.code_examples(source(41), "m.py")) == []
  assert [r["task_id"] for r in tasks.code_examples(source(2), "m.py")] == ["m.py:f:1"]
  assert list(tasks.code_examples(source(1), "m.py")) == []
  assert list(tasks.code_examples("def (:\n", "m.py")) == []


# ------------------------------------------------------------------------------------------------
# sources: splits


def _documented_bucket(key):
  b = int(hashlib.sha1(key.encode("utf-8")).hexdigest(), 16) % 1000
  return "test" if b < 10 else "valid" if b < 20 else "train"


def _key_in(split, prefix):
  return next(f"{prefix}{i}" for i in range(100_000) if sources.bucket(f"{prefix}{i}") == split)


def test_bucket_is_sha1_mod_1000():
  keys = [f"key {i}" for i in range(3000)] + ["über", "stdlib/ftplib.py", ""]
  assert [sources.bucket(k) for k in keys] == [_documented_bucket(k) for k in keys]
  assert {sources.bucket(k) for k in keys} == {"train", "valid", "test"}


def test_split_key():
  assert sources.split_key("translate_en_de", {"en": "Hello World", "de": "x"}) == "hello world"
  # Sibling packages sharing one description share a split.
  assert sources.split_key("summarize", {"id": "libfoo-dev", "document": "Foo does x."}) == (
      sources.split_key("summarize", {"id": "libfoo-doc", "document": "Foo does x."}))
  # All functions of one file share a split.
  assert sources.split_key("code_complete", {"task_id": "stdlib/a/b.py:f:12"}) == "stdlib/a/b.py"


def _read(path):
  with lzma.open(path, "rt", encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def test_write_task_buckets_holdout_and_train_only(tmp_path):
  task = "translate_en_de"
  en_train, en_valid, en_test = (_key_in(s, "sentence ") for s in ("train", "valid", "test"))
  en_held = _key_in("train", "held ")          # in the committed valid, buckets to train here
  en_ui = _key_in("valid", "ui string ")       # train-only source, buckets to valid
  en_ui_held = _key_in("train", "ui held ")
  committed = tmp_path / "committed" / task
  committed.mkdir(parents=True)
  with lzma.open(committed / "valid.jsonl.xz", "wt", encoding="utf-8") as f:
    for en in (en_held.upper(), en_ui_held, en_valid):   # keys are lower-cased
      f.write(json.dumps({"en": en, "de": "x", "src": "ddtp"}) + "\n")
  rows = [{"en": en_train, "de": "a", "src": "ddtp"}, {"en": en_valid, "de": "b", "src": "ddtp"},
          {"en": en_test, "de": "c", "src": "ding"}, {"en": en_held, "de": "d", "src": "ddtp"},
          {"en": en_ui, "de": "e", "src": "mo_base"},
          {"en": en_ui_held, "de": "f", "src": "mo_gcc"}]
  info = {}
  sources.write_task(tmp_path / "out", task, rows, info, holdout_from=str(tmp_path / "committed"),
                     train_only=sources.TRAIN_ONLY_DEFAULT, xz_preset=0)
  out = tmp_path / "out" / task
  assert [r["en"] for r in _read(out / "train.jsonl.xz")] == [en_train, en_ui]
  assert _read(out / "valid.jsonl.xz") == [{"de": "b", "en": en_valid, "src": "ddtp"}]
  assert [r["en"] for r in _read(out / "test.jsonl.xz")] == [en_test]
  assert info[task] == {"rows": {"train": 2, "valid": 1, "test": 1},
                        "by_source": {"train": {"ddtp": 1, "mo_base": 1}, "valid": {"ddtp": 1},
                                      "test": {"ding": 1}},
                        "dropped_from_train_as_committed_valid": 2}


def test_holdout_keys_disabled_or_missing(tmp_path):
  assert sources.holdout_keys("summarize", "") == set()
  assert sources.holdout_keys("summarize", str(tmp_path)) == set()


# ------------------------------------------------------------------------------------------------
# sources: fetching (subprocess replaced: no network)


def test_wheels_downloads_missing_and_returns_only_the_asked_ones(tmp_path, monkeypatch):
  f = sources.Fetcher(tmp_path)
  (tmp_path / "pypi").mkdir()
  (tmp_path / "pypi" / "Django-4.2-py3-none-any.whl").write_bytes(b"")   # cached
  (tmp_path / "pypi" / "stale_pkg-1.0-py3-none-any.whl").write_bytes(b"")  # an earlier run's
  calls = []

  def fake_run(cmd, **kw):
    calls.append(cmd)
    (tmp_path / "pypi" / "sphinx-7.0-py3-none-any.whl").write_bytes(b"")

  monkeypatch.setattr(f, "_run", fake_run)
  got = [p.name for p in f.wheels(["django==4.2", "Sphinx==7.0"])]
  assert got == ["Django-4.2-py3-none-any.whl", "sphinx-7.0-py3-none-any.whl"]
  assert len(calls) == 1 and calls[0][-1] == "Sphinx==7.0"


def test_translation_file_updates_the_lists_first(tmp_path, monkeypatch):
  f = sources.Fetcher(tmp_path)
  updated = []
  monkeypatch.setattr(f, "update", lambda: updated.append(True))
  with pytest.raises(RuntimeError, match="no Translation-en"):
    f.translation_file("en")
  assert updated == [True]
