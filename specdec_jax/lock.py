"""One writer per output directory: an advisory lock every writing job holds while it runs.

Why: two runs started into one directory both appended to predictions.jsonl and batches.jsonl
(16 lines for 8 examples) and a later resume reported a doubled histogram; two training jobs
would interleave checkpoints. The lock is `fcntl.flock` on `<dir>/.specdec.lock`: the kernel
releases it when the holder exits, however it exits (SIGKILL included), so a stale lock of a
killed process is simply taken over by the next job; there is nothing to clean up. The file
records the holder's pid and command, so a refused job can say who holds the directory.
Advisory: it binds only jobs that take it (every entry point that writes a directory does).
POSIX only (the platforms JAX runs on).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator

LOCK_FILE = ".specdec.lock"


class DirectoryLocked(RuntimeError):
  """Another live process holds the output directory."""


def _holder(path: str) -> str:
  try:
    with open(path) as f:
      info = json.load(f)
    return f"pid {info.get('pid')}: {info.get('command')!r}, since {info.get('since')}"
  except (OSError, ValueError):
    return "a process that has not written its name yet"


@contextlib.contextmanager
def hold(directory: str, job: str) -> Iterator[str]:
  """Holds `directory`'s lock for the body (creating the directory); raises `DirectoryLocked`
  naming the holder if another process has it. Yields the lock file's path."""
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, LOCK_FILE)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise DirectoryLocked(
          f"{directory} is being written by another {job} ({_holder(path)}); wait for it to "
          "finish or choose another output directory") from None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "command": " ".join(sys.argv),
                             "job": job, "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
    os.fsync(fd)
    yield path
  finally:
    os.close(fd)  # closing the descriptor releases the flock
