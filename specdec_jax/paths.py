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


class ReadOnlyAssetsError(PermissionError):
  """A command was asked to write inside the package's shipped assets."""


def inside_assets(path: str) -> bool:
  """Whether `path` (relative to the working directory, as a writer opens it) resolves inside
  `ASSETS_DIR`, symbolic links followed. URLs (gs://...) never do."""
  path = str(path)
  if "://" in path:
    return False
  real = os.path.realpath(os.path.abspath(os.path.expanduser(path)))
  assets = os.path.realpath(ASSETS_DIR)
  return real == assets or real.startswith(assets + os.sep)


def check_writable(path: str, what: str = "output") -> str:
  """Returns `path`, or raises `ReadOnlyAssetsError` when it lies inside the shipped assets.

  Why one guard that every writer calls (the run, training's output and export, distillation
  data, conversion, the AOT report, the exactness report, `orbax_io.save`): a training recipe
  once exported over `specdec_jax/assets/zoo/`, silently replacing the shipped weights that every
  README command and MODEL_CARD.md figure depends on. Nothing a command writes belongs there;
  updating the zoo is a deliberate copy by hand (README "Training and distillation").
  """
  if inside_assets(path):
    raise ReadOnlyAssetsError(
        f"refusing to write {what} {path!r}: it lies inside the package's shipped assets "
        f"({ASSETS_DIR}), which every command treats as read-only. Write under an --output_dir "
        "elsewhere (e.g. runs/...); to update the shipped zoo, copy a finished export there by "
        "hand.")
  return path


def under_run(output_dir: str, path: str) -> str:
  """`path` under the run's `output_dir` when relative, as given when absolute or a URL.

  Why: an export belongs to its run, like its checkpoints; a relative path against the working
  directory once let the zoo recipes replace the shipped weights in specdec_jax/assets/zoo."""
  path = os.path.expanduser(str(path))
  if "://" in path or os.path.isabs(path):
    return path
  return os.path.join(output_dir, path)
