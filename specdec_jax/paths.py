"""Where things are: the repository root, the package's assets, and how a user's path resolves.

Why a ground-floor module: the entry points (their gin search paths), the data door (shipped
tasks, the vocabulary), the runner (checkpoints, n-gram tables) and the AOT tool all resolve
paths the same way, and none of them should reach into another layer (least of all the gin
module) to learn where the repository is. It imports nothing of the project.
"""
from __future__ import annotations

import os
from pathlib import Path

# The repository root in a source checkout (editable install), the site-packages dir otherwise.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The shipped files: data/ (the local tasks), vocab/ (the SentencePiece model), zoo/.
ASSETS_DIR = Path(__file__).resolve().parent / "assets"


def resolve_path(path: str) -> str:
  """A path as given if it exists (or is absolute), else relative to the repository root."""
  path = os.path.expanduser(str(path))
  if os.path.isabs(path) or os.path.exists(path):
    return path
  candidate = os.path.join(PACKAGE_PARENT, path)
  return candidate if os.path.exists(candidate) else path
