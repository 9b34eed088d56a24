"""Results as data: a committed record per measured row, and the docs' tables generated from them.

Why: a figure typed into the README cannot be traced, and figures typed in different sessions
contradicted each other (1.27x beside 1.35x, three code speedups for one command). A record holds
what a reader needs to judge and repeat a figure: the metrics object as the run wrote it, the
command, the commit, the date, the machine and its load; a table in the docs is then rendered from
records by one command (`python scripts/results.py tables`), between markers

  <!-- results:NAME -->
  ...generated...
  <!-- /results:NAME -->

and a test fails when a table in the docs differs from what the records give.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specdec_jax.metrics import compare
from specdec_jax.metrics import diagnostics
from specdec_jax.metrics import established
from specdec_jax.metrics import findings
from specdec_jax.metrics import machine as machine_lib
from specdec_jax.metrics.machine import machine  # noqa: F401  (results.machine: the old name)

RECORD_KEYS = ("name", "command", "commit", "date", "machine", "load_average", "metrics")


def make_record(name: str, metrics: Mapping[str, Any], *, command: str, commit: str, date: str,
                machine: Mapping[str, Any], load_average: Sequence[float]) -> dict[str, Any]:
  """A record: a metrics.json object (one row) with where and how it was measured."""
  if not re.fullmatch(r"[a-z0-9_]+", name):
    raise ValueError(f"a record name is lower case letters, digits and _, got {name!r}")
  return {"name": name, "command": command, "commit": commit, "date": date,
          "machine": dict(machine), "load_average": [round(float(x), 2) for x in load_average],
          "metrics": dict(metrics)}


def row_name(prefix: str, metrics: Mapping[str, Any]) -> str:
  """`<prefix>_<draft>_t<T>_g<gamma>`: a sweep row's record name, from what the row measured."""
  draft = re.sub(r"[^a-z0-9]+", "_", str(metrics["draft"]).rsplit("/", 1)[-1].lower()).strip("_")
  temperature = format(float(metrics["temperature"]), "g").replace(".", "p")
  return f"{prefix}_{draft}_t{temperature}_g{metrics['gamma']}"


def save_record(directory: str, name: str, metrics: Mapping[str, Any], *, command: str,
                commit: str | None = None, load: str | Sequence[float] | None = None,
                run_segments: Sequence[Mapping[str, Any]] | None = None) -> str:
  """`make_record` with where and when filled in, written by `write_record`; its path.

  commit: None reads the checkout's HEAD (give the commit a run started at when HEAD has moved
  since). load: the run's load average, 'l1,l5,l15' or numbers; None takes the run's (from
  `run_segments`) or else the current one. run_segments: the run's machine.json
  (`machine.read_run`): the machine as the run found it; None measures it now.
  Why one function: five scripts each assembled commit, date, machine and load by hand, and
  one of them (compare_points) could not be told the commit a run had started at."""
  if commit is None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True,
                            text=True, check=True).stdout.strip()
  if isinstance(load, str):
    load = [float(x) for x in load.split(",")]
  measured, run_load = machine_lib.for_record(run_segments)
  if load is None:
    load = os.getloadavg() if run_load is None else run_load
  rec = make_record(name, metrics, command=command, commit=commit, date=time.strftime("%Y-%m-%d"),
                    machine=measured, load_average=load)
  return write_record(directory, rec)


def write_record(directory: str, record: Mapping[str, Any]) -> str:
  """Writes `record` as `<directory>/<name>.json` (sorted keys, one line per key); its path.

  Records are append-only: a name already taken is refused (a rerun is a new record under a new
  name), so no measured outcome is ever replaced by a later one (two records were rewritten
  four and seven times before this rule; their earlier outcomes survive only in git)."""
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, f"{record['name']}.json")
  if os.path.exists(path):
    raise FileExistsError(f"record {record['name']!r} exists ({path}): records are append-only; "
                          "give the rerun a new name")
  with open(path, "x") as f:
    json.dump(record, f, indent=1, sort_keys=True)
    f.write("\n")
  with open(os.path.join(directory, LEDGER), "a") as f:
    f.write(f"{_digest(path)}  {os.path.basename(path)}\n")
  return path


# `sha256sum -c ledger.sha256` format: one line per record, appended when it is written. Why:
# refusing a taken name stops a script from replacing a record, not a hand edit or a rewrite; the
# ledger makes any change to a committed record's bytes, or its deletion, fail a test
# (`ledger_problems`), so an outcome once recorded stays as measured.
LEDGER = "ledger.sha256"


def _digest(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def ledger_problems(directory: str) -> list[str]:
  """What breaks append-only in `directory`: a record whose bytes differ from its ledger line, a
  ledger line whose record is gone, a record the ledger does not list. Empty when all hold."""
  ledger = {}
  path = os.path.join(directory, LEDGER)
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        digest, fname = line.rstrip("\n").split("  ", 1)
        if fname in ledger and ledger[fname] != digest:
          return [f"{fname}: listed twice in {LEDGER} with different digests"]
        ledger[fname] = digest
  files = {f for f in os.listdir(directory) if f.endswith(".json")}
  out = [f"{f}: changed after it was recorded" for f in sorted(files & ledger.keys())
         if _digest(os.path.join(directory, f)) != ledger[f]]
  out += [f"{f}: recorded, now deleted" for f in sorted(ledger.keys() - files)]
  out += [f"{f}: not in {LEDGER} (write records with scripts/results.py record)"
          for f in sorted(files - ledger.keys())]
  return out


def load_records(directory: str) -> dict[str, dict[str, Any]]:
  """{name: record} of every *.json record in `directory`."""
  out = {}
  for fname in sorted(os.listdir(directory)):
    if fname.endswith(".json"):
      with open(os.path.join(directory, fname)) as f:
        rec = json.load(f)
      missing = [k for k in RECORD_KEYS if k not in rec]
      if missing:
        raise ValueError(f"{os.path.join(directory, fname)}: not a results record (missing "
                         f"{missing})")
      out[rec["name"]] = rec
  return out


def _speedup_cell(m: dict) -> str:
  """The speedup and its interval, or why a row has none (a gamma-0 row decoded autoregressively;
  a speculative-mode run timed no baseline)."""
  runs = m.get("between_runs")
  if runs:  # the median of several processes (scripts/reproduce.py --processes)
    lo, hi = runs["speedup_range"]
    head = (f"{_f(m['speedup'])}x {_interval(m.get('speedup_interval95'))}"
            if m.get("speedup") is not None else "none (gamma 0)")
    return f"{head}, median of {runs['processes']} processes: {lo:.2f}-{hi:.2f}x"
  if m.get("speedup") is not None:
    return f"{_f(m['speedup'])}x {_interval(m.get('speedup_interval95'))}"
  if m.get("mode") == "speculative":
    return "- (speculative mode: no baseline timed)"
  return "- (gamma 0: nothing speculative to time)"


def _f(x, spec: str = ".2f") -> str:
  return "-" if x is None else format(x, spec)


def _interval(pair, spec: str = ".2f") -> str:
  return "-" if not pair else f"[{format(pair[0], spec)}, {format(pair[1], spec)}]"


def headline_table(records: Sequence[Mapping[str, Any]]) -> str:
  """The main-command table: one line per record, the speedup with its interval, the prediction
  made out of sample beside the in-sample one, and where it was measured."""
  head = ("record", "task", "T", "gamma", "prompts", "alpha [95% CI]", "tokens/call",
          "speedup [95% CI]", "predicted", "in-sample", "held out", "machine", "load", "commit")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in records:
    m = r["metrics"]
    cal = m.get("calibration") or {}
    lines.append("| " + " | ".join((
        r["name"], str(m["task"]), _f(m["temperature"], "g"), str(m["gamma"]),
        str(m["num_examples"]), f"{_f(m['alpha'], '.3f')} {_interval(m.get('alpha_interval95'), '.3f')}",
        _f(m.get("tokens_per_target_call")),
        _speedup_cell(m),
        _f(m.get("speedup_predicted")), _f(m.get("speedup_predicted_in_sample")),
        {True: "yes", False: "no"}.get(cal.get("held_out"), "-"), compare.machine_label(r),
        _f(r["load_average"][0], ".1f"), r["commit"][:7])) + " |")
  return "\n".join(lines)


def costs_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Where a speedup comes from, one line per record: tokens per target call against what an
  iteration costs (the draft's step c, the timed loop's ms per iteration beside the
  autoregressive one's). Why beside the headline: two drafts that write the same tokens per call
  differ in speedup only through these (`runner/costs.py`; docs/feature_draft.md)."""
  head = ("record", "draft", "T", "gamma", "alpha", "tokens/call", "c", "draft ms/step",
          "ms/iteration", "AR ms/iteration", "speedup [95% CI]", "machine", "load")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in records:
    m = r["metrics"]
    lines.append("| " + " | ".join((
        r["name"], str(m["draft"]), _f(m["temperature"], "g"), str(m["gamma"]),
        _f(m.get("alpha"), ".3f"), _f(m.get("tokens_per_target_call")), _f(m.get("c"), ".3f"),
        _f(m.get("draft_ms_per_call"), ".3f"), _f(m.get("iteration_ms")),
        _f(m.get("ar_iteration_ms")),
        f"{_f(m.get('speedup'))}x {_interval(m.get('speedup_interval95'))}",
        compare.machine_label(r), _f(r["load_average"][0], ".1f"))) + " |")
  return "\n".join(lines)


def repeats_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Several processes of one command, as one headline (issue 46): each run's gamma and speedup,
  their median, the between-run range beside the median run's own bootstrap interval (which
  covers the prompts only), and the machine. A run whose 'auto' chose gamma 0 decoded plainly:
  it counts as 1.00x (what its user got), marked. Refuses records of different commands (a
  note after two spaces, '  (run 2 of 3)', is not part of the command)."""
  commands = {r["command"].split("  (")[0] for r in records}
  if len(commands) != 1:
    raise ValueError(f"a repeats table is one command's runs, got {sorted(commands)}")
  runs = []
  for r in records:
    m = r["metrics"]
    x = m.get("speedup")
    runs.append((1.0 if x is None and m.get("gamma") == 0 else x, r))
  if any(x is None for x, _ in runs):
    raise ValueError("a repeats table needs every run's speedup (or gamma 0)")
  ordered = sorted(runs, key=lambda t: t[0])
  median_x, median_r = ordered[(len(ordered) - 1) // 2]
  machines = sorted({f"{r['machine'].get('cpu')}, {r['machine'].get('cores')} cores"
                     for _, r in runs})
  head = ("runs", "gamma per run", "speedup per run", "median", "between-run range",
          "median run's 95% CI (prompts)", "machine")
  cells = (str(len(runs)), ", ".join(str(r["metrics"]["gamma"]) for _, r in runs),
           ", ".join(f"{_f(x)}x" + (" (gamma 0)" if r["metrics"].get("speedup") is None else "")
                     for x, r in runs),
           f"{_f(median_x)}x", f"{_f(ordered[0][0])}-{_f(ordered[-1][0])}x",
           _interval(median_r["metrics"].get("speedup_interval95")), "; ".join(machines))
  return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                    "| " + " | ".join(cells) + " |"])


# The measured runs' tables. The TPU roofline's (from records holding AOT jobs' aot.json) live
# with the roofline, in `aot.tables.TABLES`, and are passed in by the caller (scripts/results.py):
# metrics/ imports nothing of aot/, which imports metrics/.
TABLES: dict[str, Callable[[Sequence[Mapping[str, Any]]], str]] = {
    "headline": headline_table, "costs": costs_table, "repeats": repeats_table,
    "alpha": findings.alpha_table, "findings": findings.findings_table,
    "comparison": compare.comparison_table,      # two points of one run, paired (compare.py)
    "established": established.established_table,
    "anatomy_goal": diagnostics.anatomy_goal_table,  # experiments/loop_anatomy.py --goal
    "tree_bound": diagnostics.tree_bound_table,      # experiments/tree_bound.py
    "peer": diagnostics.peer_table,                  # scripts/compare_hf.py
    "draft_alpha": diagnostics.draft_alpha_table,    # experiments/feature_draft_alpha.py
    "cache_update": diagnostics.cache_update_table,  # experiments/cache_update_ab.py
    "head_ab": diagnostics.head_ab_table,            # experiments/tied_head_ab.py
    "weight_floor": diagnostics.weight_floor_table,  # scripts/bench_loop.py (one layout a record)
}
# Tables over every committed record: their marker names none (a claim counts all it can test).
ALL_RECORDS = frozenset({"established"})


def render(text: str, records: Mapping[str, Mapping[str, Any]],
           tables: Mapping[str, Callable] | None = None) -> str:
  """`text` with every `<!-- results:KIND rec1 rec2 ... -->` block re-rendered from records, by
  `TABLES` and the caller's `tables` (the roofline's, `aot.tables.TABLES`)."""
  registry = {**TABLES, **(tables or {})}
  pattern = re.compile(r"(<!-- results:(\w+)((?: \w+)*) -->\n)(.*?)(<!-- /results:\2 -->)",
                       re.S)

  def one(m):
    kind, names = m.group(2), m.group(3).split()
    if kind not in registry:
      raise ValueError(f"unknown results table {kind!r} (known: {sorted(registry)})")
    if kind in ALL_RECORDS:
      if names:
        raise ValueError(f"results table {kind!r} counts every record; it takes no names")
      names = sorted(records)
    missing = [n for n in names if n not in records]
    if missing:
      raise ValueError(f"results table {kind!r} names records that do not exist: {missing}")
    return m.group(1) + registry[kind]([records[n] for n in names]) + "\n" + m.group(5)
  return pattern.sub(one, text)


def typed_table_lines(text: str) -> list[int]:
  """The 1-based lines of markdown table rows outside every `results:` block: a table typed by
  hand, which no record checks (`scripts/results.py tables --check` refuses them in docs/)."""
  inside, lines = False, []
  for i, line in enumerate(text.splitlines(), 1):
    if re.match(r"<!-- results:\w+", line):
      inside = True
    elif line.startswith("<!-- /results:"):
      inside = False
    elif line.lstrip().startswith("|") and not inside:
      lines.append(i)
  return lines
