"""Downloads of Debian packages and PyPI wheels, unpacked but never installed.

Why: the builders must run on a machine whose only internet access is the Debian archive and
PyPI, without root and without changing the system: `apt-get update` goes into a private lists
folder under `work_dir`, packages are fetched with `apt-get download` and unpacked with
`dpkg-deb -x`, wheels with `pip download --no-deps`. Everything is cached in `work_dir`, so a
second build downloads nothing.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from absl import logging


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
