"""Small files from local paths or URLs (gs://, file://, ...) through tensorstore's kvstores.

The public T5 checkpoints live on GCS (`gs://t5-data/...`) and the gin files name them so; the
arrays are read by tensorstore anyway, so the few small files around them (the msgpack, Orbax's
`_METADATA`, `model_config.json`) go through the same kvstore layer rather than another GCS client.
Any `scheme://` path is treated as a URL; everything else is a local path.
"""
from __future__ import annotations

import json
import os
from typing import Any

import tensorstore as ts


def is_url(path: str) -> bool:
  return "://" in path


def join(base: str, *parts: str) -> str:
  if not is_url(base):
    return os.path.join(base, *parts)
  return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


def dirname(path: str) -> str:
  return path.rstrip("/").rsplit("/", 1)[0] if is_url(path) else os.path.dirname(os.path.abspath(path))


def _split(url: str) -> tuple[str, str]:
  head, _, name = url.rstrip("/").rpartition("/")
  return head + "/", name


def read_bytes(path: str) -> bytes | None:
  """The file's contents, or None if it does not exist."""
  if not is_url(path):
    if not os.path.isfile(path):
      return None
    with open(path, "rb") as f:
      return f.read()
  directory, name = _split(path)
  result = ts.KvStore.open(directory).result().read(name).result()
  return bytes(result.value) if result.state == "value" else None


def read_json(path: str, what: str = "file") -> Any:
  """The parsed JSON at `path`; a missing, non-UTF-8 or malformed file raises `ValueError`
  naming the file (and line), not a bare `JSONDecodeError` or `TypeError` from deep inside.

  Why: a truncated `_METADATA` or a hand-edited `model_config.json` gave errors that named no
  file; with several checkpoints and sidecars in one run, the user had to guess which one.
  """
  raw = read_bytes(path)
  if raw is None:
    raise FileNotFoundError(f"{what} {path} does not exist")
  try:
    return json.loads(raw.decode("utf-8"))
  except UnicodeDecodeError as e:
    raise ValueError(f"{what} {path} is not UTF-8 text (byte {e.start}): corrupt or not "
                     "JSON") from None
  except json.JSONDecodeError as e:
    raise ValueError(f"{what} {path} is not valid JSON: {e.msg} at line {e.lineno}, column "
                     f"{e.colno}") from None


def exists(path: str) -> bool:
  """Whether a file exists (for URLs: a key; directories are not keys)."""
  if not is_url(path):
    return os.path.isfile(path)
  return read_bytes(path) is not None


def write_text(path: str, text: str) -> None:
  if not is_url(path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, path)
    return
  directory, name = _split(path)
  ts.KvStore.open(directory).result().write(name, text.encode()).result()


def kvstore_url(path: str) -> str:
  """A directory as a tensorstore kvstore URL (local paths become absolute file:// URLs)."""
  url = path if is_url(path) else "file://" + os.path.abspath(path)
  return url.rstrip("/") + "/"
