"""Builders of the three local tasks from Debian and PyPI packages (`scripts/build_data.py`).

Why a package: each module holds one step of the recipe in assets/data/SOURCES.md, so the pure
parts (text cleaning, .mo reading, description and docstring parsing, splits) can be read and
tested without the network; only `fetch` and the `build_*` functions touch the archive.

  fetch         Fetcher: private apt lists, apt-get download, dpkg-deb -x, pip download
  text          folding, sentence splitting, placeholder / markup checks, pair filters
  blocks        text of the innermost block elements of HTML and Mallard pages
  mo            (msgid, msgstr) of gettext .mo catalogues
  descriptions  Debian package descriptions (apt's Translation-<lang> files)
  translation   the translate_en_de sources and `build_translation`
  summaries     package descriptions and manual pages, `build_summaries`
  code_complete standard library functions with docstrings, `build_code`
  splits        sha1 buckets, the committed-valid holdout, writing <task>/<split>.jsonl.xz
"""
