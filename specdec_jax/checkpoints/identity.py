"""What a local checkpoint holds, in 16 hex digits, so a run never resumes onto changed weights.

Why: a run's resume key names its checkpoints by path, and a path outlives its contents (a zoo
model retrained and exported to the same directory, a fine-tuning run overwriting its export).
Results written with the old weights must not be silently continued with the new ones.

Reading every byte of a 44 GB T5-XXL checkpoint to start a run is not acceptable either, so the
digest covers each file's relative name and size, the whole of every file up to 1 MiB (configs,
manifests, metadata) and the first and last 64 KiB of larger ones (array data: a retrained model
differs in every chunk). Orbax OCDBT data files get fresh random names on every write, so for the
format the zoo uses any re-export changes the digest.

Files that annotate a checkpoint without changing what it computes (`SIDECARS`: a draft's head
ranking, written later by scripts/head_ranking.py) are left out, so adding one does not stop a
run that started from, or distils from, that checkpoint from resuming.
"""
from __future__ import annotations

import hashlib
import os

from specdec_jax.checkpoints import storage

_WHOLE_BYTES = 1 << 20
_SAMPLE_BYTES = 1 << 16
SIDECARS = frozenset({"head_ranking.json"})


def _files(path: str) -> list[str]:
  if os.path.isfile(path):
    return [path]
  found = []
  for root, dirs, names in os.walk(path):
    dirs.sort()
    found.extend(os.path.join(root, n) for n in sorted(names)
                 if not (root == path and n in SIDECARS))
  return found


def _update(h, file_path: str) -> None:
  size = os.path.getsize(file_path)
  h.update(f"{size}\0".encode())
  with open(file_path, "rb") as f:
    if size <= _WHOLE_BYTES:
      h.update(f.read())
      return
    h.update(f.read(_SAMPLE_BYTES))
    f.seek(size - _SAMPLE_BYTES)
    h.update(f.read(_SAMPLE_BYTES))


def content_digest(path: str | None) -> str | None:
  """Digest of a local checkpoint file or directory; None for presets, URLs and absent paths.

  URLs (gs://...) are left to their path: listing a bucket to start every run costs more than
  it protects, and published checkpoints there do not change under their names.
  """
  if not path or storage.is_url(path) or not os.path.exists(path):
    return None
  h = hashlib.sha256()
  for file_path in _files(path):
    h.update(os.path.relpath(file_path, path).encode() + b"\0")
    _update(h, file_path)
  return h.hexdigest()[:16]
