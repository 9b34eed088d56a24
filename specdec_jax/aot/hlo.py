"""Host transfers inside the compiled loops, read from the TPU HLO text.

Why: a `lax.while_loop` that sends something to the host every iteration (a callback, an infeed
or outfeed, a send/recv, an array offloaded to host memory) turns the on-device loop into a host
round trip per step, the one cost DESIGN.md's loop exists to avoid; the compiled module shows it
where the jaxpr does not (XLA may insert transfers of its own). Checked: the body and condition of
every `while` and every computation they call (fusions, conditionals, nested loops), transitively.
"""
from __future__ import annotations

import re

# A computation header: `%name (params) -> shape {` or `ENTRY %name ... {`.
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(|\{)")
_CALLED = re.compile(
    r"\b(?:body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_WHILE = re.compile(r"\bwhile\(")
# What a host transfer looks like in TPU HLO.
_HOST_PATTERNS = (
    ("host transfer", re.compile(r"is_host_transfer=true")),
    ("infeed", re.compile(r"=\s*\S+\s+infeed\(|\binfeed\(")),
    ("outfeed", re.compile(r"\boutfeed\(")),
    ("send/recv", re.compile(r"\s(?:send|recv|send-done|recv-done)\(")),
    ("host callback", re.compile(r'custom_call_target="[^"]*(?:callback|Callback|host|Host)[^"]*"')),
    ("host memory", re.compile(r"\{[^{}]*S\(5\)[^{}]*\}")),
)


def computations(hlo_text: str) -> dict[str, list[str]]:
  """Computation name -> its instruction lines."""
  out: dict[str, list[str]] = {}
  current = None
  for line in hlo_text.splitlines():
    if current is None:
      if line and not line[0].isspace() and line.rstrip().endswith("{"):
        m = _HEADER.match(line)
        if m:
          current = m.group(1)
          out[current] = []
      continue
    if line.strip() == "}":
      current = None
      continue
    out[current].append(line)
  return out


def _callees(line: str) -> list[str]:
  names = _CALLED.findall(line)
  for group in _BRANCHES.findall(line):
    names.extend(n.strip().lstrip("%") for n in group.split(",") if n.strip())
  return names


def loop_computations(comps: dict[str, list[str]]) -> set[str]:
  """Every computation that runs inside a while loop (bodies, conditions and what they call)."""
  roots = set()
  for lines in comps.values():
    for line in lines:
      if _WHILE.search(line):
        roots.update(n for n in _callees(line) if n in comps)
  seen, todo = set(), list(roots)
  while todo:
    name = todo.pop()
    if name in seen:
      continue
    seen.add(name)
    for line in comps.get(name, ()):
      todo.extend(n for n in _callees(line) if n in comps and n not in seen)
  return seen


def host_transfers_in_loops(hlo_text: str) -> list[str]:
  """'kind: instruction' for each host transfer inside a loop (empty: the loops stay on device)."""
  comps = computations(hlo_text)
  found = []
  for name in sorted(loop_computations(comps)):
    for line in comps[name]:
      for kind, pattern in _HOST_PATTERNS:
        if pattern.search(line):
          found.append(f"{kind}: {name}: {line.strip()[:200]}")
          break
  return found


def count_whiles(hlo_text: str) -> int:
  return sum(1 for line in hlo_text.splitlines() if _WHILE.search(line))
