"""SHA-256 checksums of the committed data files.

Why: a rebuild from Debian/PyPI packages (scripts/build_data.py) matches the committed evaluation
files closely but not byte for byte, so reported numbers are only comparable when they were
computed on exactly the committed files. `verify()` says whether a copy is intact; the sums live
in `assets/data/SHA256SUMS` in the format of `sha256sum` (so `sha256sum -c SHA256SUMS` works too).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from specdec_jax.paths import ASSETS_DIR

ASSETS_DATA_DIR = ASSETS_DIR / "data"
SUMS_FILENAME = "SHA256SUMS"


class ChecksumError(ValueError):
  """Raised when data files are missing or differ from their recorded checksums."""


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(chunk_size), b""):
      digest.update(block)
  return digest.hexdigest()


def read_sums(sums_path: str | os.PathLike) -> dict[str, str]:
  """Parses a `sha256sum` listing into {relative path: hex digest}."""
  sums = {}
  for lineno, line in enumerate(Path(sums_path).read_text().splitlines(), 1):
    if not line.strip() or line.startswith("#"):
      continue
    parts = line.split(maxsplit=1)
    if len(parts) != 2 or len(parts[0]) != 64:
      raise ChecksumError(f"{sums_path}:{lineno}: not a sha256sum line: {line!r}")
    sums[parts[1].lstrip("*").strip()] = parts[0].lower()
  return sums


def write_sums(data_dir: str | os.PathLike, pattern: str = "*/*.jsonl.xz") -> Path:
  """Writes `data_dir/SHA256SUMS` for the files matching `pattern`, sorted by path."""
  data_dir = Path(data_dir)
  files = sorted(p.relative_to(data_dir).as_posix() for p in data_dir.glob(pattern))
  lines = [f"{sha256_file(data_dir / f)}  {f}\n" for f in files]
  out = data_dir / SUMS_FILENAME
  out.write_text("".join(lines))
  return out


def verify(data_dir: str | os.PathLike = ASSETS_DATA_DIR,
           files: list[str] | None = None) -> dict[str, str]:
  """Checks files under `data_dir` against `data_dir/SHA256SUMS`.

  Args:
    data_dir: folder holding SHA256SUMS and the files it lists.
    files: relative paths to check (default: every file listed).
  Returns:
    {relative path: digest} of the verified files.
  Raises:
    ChecksumError listing every missing or modified file (or files not in the listing).
  """
  data_dir = Path(data_dir)
  sums_path = data_dir / SUMS_FILENAME
  if not sums_path.is_file():
    raise ChecksumError(f"no {SUMS_FILENAME} in {data_dir}")
  sums = read_sums(sums_path)
  problems, verified = [], {}
  for rel in (files if files is not None else sorted(sums)):
    if rel not in sums:
      problems.append(f"{rel}: not listed in {sums_path}")
      continue
    path = data_dir / rel
    if not path.is_file():
      problems.append(f"{rel}: missing")
      continue
    actual = sha256_file(path)
    if actual != sums[rel]:
      problems.append(f"{rel}: sha256 {actual} != recorded {sums[rel]}")
      continue
    verified[rel] = actual
  if problems:
    raise ChecksumError(f"data in {data_dir} failed verification:\n  " + "\n  ".join(problems))
  return verified
