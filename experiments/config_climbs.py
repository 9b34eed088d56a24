r"""How the run's config travels: the modules it enters from `run.run`, and how often a call
carrying it climbs from a lower module back up to a higher one (issue 48's measure).

Why: a config read in one place and passed down stays easy to follow; one that lower modules
hand back to higher ones (closures calling into the pipeline, a tuner calling its caller) makes a
reader climb the same stairs again. The issue counted 57 modules and 52 climbs; this script
counts by a stated rule, so the figure can be rerun after any change:

  python experiments/config_climbs.py                       # the smoke run (seconds)
  python experiments/config_climbs.py --gin_file=configs/local/smoke.gin \
      --gin_bindings="GAMMA='auto'" --gin_bindings="RunConfig.auto_timing_examples=2"

The rule.
- Levels from imports: a module of the package stands above everything of the package it imports
  (at top level or inside a function): level = 1 + the highest level among its imports, 0 for a
  module importing nothing of the package.
- Calls followed: `run.run` is followed; a call made from a followed frame is followed when one
  of its arguments carries the config: the `RunConfig` itself, one of its fields' values that is
  not a number, a string, a bool or None (those would match any equal constant: the nested
  schedule objects, tuples of sweeps, `Auto`, `FeatureChain`), or an object holding one of those
  as an attribute (a dataclass built from the config, e.g. the decoder the run builds, keeps
  following it).
- A climb: a followed call whose callee's module stands above its caller's module (only a
  callback, a closure or an injected object can do that, since a lower module cannot import the
  higher one). Counted per call site (caller function -> callee function, once however often it
  runs) and per call event.
Prints the modules entered, their levels and every climbing call site; `--output` writes JSON.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "specdec_jax"
SCALARS = (int, float, bool, str, bytes, type(None))


def module_levels(root: str = ROOT) -> dict[str, int]:
  """{dotted module: level} over the package by the rule above (the import graph is acyclic:
  `shared/tools/structure_check.py` checks it)."""
  imports = {}
  pkg_dir = os.path.join(root, PACKAGE)
  for dirpath, _, files in os.walk(pkg_dir):
    for fname in files:
      if not fname.endswith(".py"):
        continue
      path = os.path.join(dirpath, fname)
      rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
      name = rel[:-len(".__init__")] if rel.endswith(".__init__") else rel
      with open(path) as f:
        tree = ast.parse(f.read())
      imports[name] = [node for node in ast.walk(tree)
                       if isinstance(node, (ast.Import, ast.ImportFrom))]
  # `from P import x`: the module P.x where there is one (a package's __init__ is not what the
  # importer reads), else P itself.
  for name, nodes in imports.items():
    deps = set()
    for node in nodes:
      if isinstance(node, ast.Import):
        deps.update(a.name for a in node.names if a.name.startswith(PACKAGE))
      elif node.module and node.module.startswith(PACKAGE):
        for a in node.names:
          sub = f"{node.module}.{a.name}"
          deps.add(sub if sub in imports else node.module)
    imports[name] = deps
  levels: dict[str, int] = {}

  def level(m: str, stack=()) -> int:
    if m in levels:
      return levels[m]
    if m in stack:  # a cycle: report it rather than recurse (structure_check forbids them)
      raise ValueError(f"import cycle through {m}")
    deps = [d for d in imports.get(m, ()) if d in imports and d != m]
    levels[m] = 1 + max((level(d, stack + (m,)) for d in deps), default=-1)
    return levels[m]

  for m in imports:
    level(m)
  return levels


def _carriers(cfg) -> set[int]:
  """Ids of the config and of its field values that are not scalars."""
  ids = {id(cfg)}
  for f in dataclasses.fields(cfg):
    v = getattr(cfg, f.name)
    if not isinstance(v, SCALARS):
      ids.add(id(v))
  return ids


def _carries(value, ids: set[int], depth: int = 0) -> bool:
  if id(value) in ids:
    return True
  if depth >= 1 or isinstance(value, SCALARS):
    return False
  attrs = getattr(value, "__dict__", None)
  if attrs is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
    attrs = {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
  return bool(attrs) and any(_carries(v, ids, depth + 1) for v in list(attrs.values())[:64])


def trace(gin_files, gin_bindings, output_dir: str) -> dict:
  """Runs `run.run` under a profiler; returns the followed calls' modules and climbs."""
  from specdec_jax import run as run_mod
  levels = module_levels()
  state = {"ids": None, "followed": set(), "events": 0, "climb_events": 0}
  modules: set[str] = set()
  climbs: dict[tuple[str, str], int] = {}
  orig_parse = run_mod.parse

  def parse(*a, **k):  # the config object the run builds, caught as it is made
    cfg = orig_parse(*a, **k)
    state["ids"] = _carriers(cfg)
    return cfg

  def module_of(frame) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if name in levels else None

  def profiler(frame, event, _arg):
    if event != "call":
      return
    callee_mod = module_of(frame)
    caller = frame.f_back
    if callee_mod is None or caller is None:
      return
    if frame.f_code is run_mod.run.__code__:
      state["followed"].add(id(frame))
      modules.add(callee_mod)
      return
    if id(caller) not in state["followed"] or state["ids"] is None:
      return
    code = frame.f_code
    args = [frame.f_locals.get(n) for n in code.co_varnames[:code.co_argcount
                                                             + code.co_kwonlyargcount]]
    if not any(_carries(a, state["ids"]) for a in args):
      return
    state["followed"].add(id(frame))
    state["events"] += 1
    modules.add(callee_mod)
    caller_mod = module_of(caller)
    if caller_mod is not None and levels[callee_mod] > levels[caller_mod]:
      state["climb_events"] += 1
      site = (f"{caller_mod}.{caller.f_code.co_name}", f"{callee_mod}.{code.co_name}")
      climbs[site] = climbs.get(site, 0) + 1

  run_mod.parse = parse
  sys.setprofile(profiler)
  try:
    run_mod.run(gin_files, output_dir, gin_bindings)
  finally:
    sys.setprofile(None)
    run_mod.parse = orig_parse
  return {"modules": {m: levels[m] for m in sorted(modules, key=lambda m: (-levels[m], m))},
          "followed_calls": state["events"], "climb_sites": len(climbs),
          "climb_events": state["climb_events"],
          "climbs": [{"from": a, "to": b, "times": n} for (a, b), n in sorted(climbs.items())]}


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--gin_file", action="append", default=None)
  ap.add_argument("--gin_bindings", action="append", default=[])
  ap.add_argument("--output", default=None, help="write the figures to this JSON file")
  args = ap.parse_args(argv)
  sys.path.insert(0, ROOT)
  os.chdir(ROOT)
  gin_files = args.gin_file or ["configs/local/smoke.gin"]
  with tempfile.TemporaryDirectory() as out:
    res = trace(gin_files, args.gin_bindings, out)
  res.update(gin_files=gin_files, gin_bindings=args.gin_bindings)
  print(f"modules entered: {len(res['modules'])}; followed calls: {res['followed_calls']}; "
        f"climbs: {res['climb_sites']} call sites, {res['climb_events']} calls")
  for m, lvl in res["modules"].items():
    print(f"  level {lvl:2d}  {m}")
  for c in res["climbs"]:
    print(f"  climb: {c['from']} -> {c['to']} (x{c['times']})")
  if args.output:
    with open(args.output, "w") as f:
      json.dump(res, f, indent=1)
  return res


if __name__ == "__main__":
  main()
