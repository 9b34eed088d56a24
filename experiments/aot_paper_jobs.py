r"""The paper configs' TPU v4 compile jobs (docs/aot_results.md), run one at a time and recorded.

Why: docs/aot_results.md's job tables ("Per config", "Per program", the Chen jobs) were the
printed reports of compile jobs whose aot.json files stayed under /tmp, so they could not be
generated from records (all 41 jobs are recorded since 2026-12-06). This script holds the
jobs as data (what each compiled, with which gin files and flags), runs those that have no
record yet, and writes each job's aot.json as the record `aot_paper_<job>` (`{"aot": rows,
"layout": mesh file}`, the form the other aot_* records take), so the tables render from
records (`results:aot_programs`, `results:aot_configs`).

  python experiments/aot_paper_jobs.py --list              # the jobs, and which are recorded
  python experiments/aot_paper_jobs.py --run [--jobs=a,b]  # compile the unrecorded ones

Hours of compilation on a 2-core host (the pasted tables' compile seconds add to ~7 h; T5-XXL
fine-tuning programs take 2-40 minutes each): it runs at the lowest priority, one job at a time,
and resumes where it stopped (a job whose record exists is skipped; `aot` itself resumes a job's
programs from its output directory). Needs libtpu (`pip install -e .[tpu]`); no TPU attached.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = os.path.join(ROOT, "docs", "results")
PAPER = "configs/paper/"
V4_8, V4_32 = PAPER + "mesh_tpu_v4_8.gin", PAPER + "mesh_tpu_v4_32.gin"
SPEC_LOOP, BOTH_T = ("--only=spec_loop",), ("--only=spec_loop", "--gin.TEMPERATURE=[0.0,1.0]")


def _t2(name: str) -> str:
  return f"{PAPER}table2/{name}.gin"


# job -> (topology, gin files, extra flags), as docs/aot_results.md's tables list them.
JOBS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "ende_small_t0_v4_8b": ("v4-8", (_t2("ende_t5_small_t0"), V4_8), ()),
    "ende_small_t1_v4_8": ("v4-8", (_t2("ende_t5_small_t1"), V4_8), SPEC_LOOP),
    "ende_base_t0_v4_8": ("v4-8", (_t2("ende_t5_base_t0"), V4_8), SPEC_LOOP),
    "ende_base_t1_v4_8": ("v4-8", (_t2("ende_t5_base_t1"), V4_8), BOTH_T),
    "ende_large_t0_v4_8": ("v4-8", (_t2("ende_t5_large_t0"), V4_8), BOTH_T),
    "cnndm_small_t0_v4_8": ("v4-8", (_t2("cnndm_t5_small_t0"), V4_8), ()),
    "cnndm_small_t1_v4_8": ("v4-8", (_t2("cnndm_t5_small_t1"), V4_8), SPEC_LOOP),
    "cnndm_base_t1_v4_8": ("v4-8", (_t2("cnndm_t5_base_t1"), V4_8), SPEC_LOOP),
    "cnndm_large_t0_v4_8": ("v4-8", (_t2("cnndm_t5_large_t0"), V4_8), SPEC_LOOP),
    "cnndm_large_t1_v4_8": ("v4-8", (_t2("cnndm_t5_large_t1"), V4_8), ()),
    "table3_ngram_v4_8": ("v4-8", (PAPER + "table3/ende.gin", V4_8),
                          ("--gin.DRAFT=['unigram','bigram']",)),
    "table3_base_t1_v4_8": ("v4-8", (PAPER + "table3/ende.gin", V4_8),
                            ("--gin.DRAFT='model'", "--gin.DRAFT_CHECKPOINT=%T5_1_1_BASE_CHECKPOINT",
                             "--gin.TEMPERATURE=1.0")),
    **{f"gamma_sweep_{size}_v4_8": (
        "v4-8", (PAPER + "gamma_sweep.gin", V4_8),
        ("--only=spec_loop", f"--gin.DRAFT_CHECKPOINT=%T5_1_1_{size.upper()}_CHECKPOINT"))
       for size in ("small", "base", "large")},
    "ende_small_t0_v4_32": ("v4-32", (_t2("ende_t5_small_t0"), V4_32), ()),
    "ende_small_t1_v4_32": ("v4-32", (_t2("ende_t5_small_t1"), V4_32), SPEC_LOOP),
    "ende_base_t0_v4_32": ("v4-32", (_t2("ende_t5_base_t0"), V4_32), SPEC_LOOP),
    "ende_large_t0_v4_32": ("v4-32", (_t2("ende_t5_large_t0"), V4_32), SPEC_LOOP),
    "cnndm_small_t0_v4_32": ("v4-32", (_t2("cnndm_t5_small_t0"), V4_32), ()),
    "cnndm_small_t1_v4_32": ("v4-32", (_t2("cnndm_t5_small_t1"), V4_32), SPEC_LOOP),
    "cnndm_base_t0_v4_32": ("v4-32", (_t2("cnndm_t5_base_t0"), V4_32), BOTH_T),
    "cnndm_base_t1_v4_32": ("v4-32", (_t2("cnndm_t5_base_t1"), V4_32), SPEC_LOOP),
    "cnndm_large_t1_v4_32": ("v4-32", (_t2("cnndm_t5_large_t1"), V4_32), BOTH_T),
    "ar_t1_v4_32": ("v4-32", (_t2("ende_t5_small_t1"), V4_32), ("--only=ar_loop",)),
    **{f"train_{task}_{size}_v4_8": ("v4-8", (f"{PAPER}train/{task}_t5_{size}.gin",), ())
       for task in ("ende", "cnndm") for size in ("small", "base", "large")},
    "xxl_train_v4_8": ("v4-8", (PAPER + "train/ende_t5_xxl.gin",), ()),
    "xxl_train_v4_16": ("v4-16", (PAPER + "train/ende_t5_xxl.gin",), ()),
    "xxl_train_v4_32": ("v4-32", (PAPER + "train/ende_t5_xxl.gin", "gin/mesh/tpu_v4_32.gin"), ()),
    "cnndm_xxl_train_v4_32": ("v4-32", (PAPER + "train/cnndm_t5_xxl.gin",
                                        "gin/mesh/tpu_v4_32.gin"), ()),
    **{f"chen_{exp}_v4_{n}": ("v4-" + n, (f"{PAPER}chen/{exp}.gin",
                                          f"{PAPER}chen/mesh_tpu_v4_{n}.gin"), ())
       for exp in ("xsum_greedy", "xsum_nucleus", "humaneval") for n in ("16", "32")},
}
PREFIX = "aot_paper_"


def command(job: str, output_dir: str) -> list[str]:
  topology, gin_files, flags = JOBS[job]
  return ([sys.executable, "-m", "specdec_jax.aot"] + [f"--gin_file={g}" for g in gin_files]
          + [f"--topology={topology}", f"--output_dir={output_dir}"] + list(flags))


def recorded(job: str) -> bool:
  return os.path.exists(os.path.join(RECORDS, f"{PREFIX}{job}.json"))


def run_job(job: str, out_root: str) -> str:
  """Compiles one job (lowest priority), then records its aot.json; the record's path."""
  sys.path.insert(0, ROOT)
  from specdec_jax.metrics import results  # pylint: disable=import-outside-toplevel
  out = os.path.join(out_root, job)
  cmd = command(job, out)
  env = dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  env.pop("JAX_PLATFORMS", None)
  done = subprocess.run(["nice", "-n", "19"] + cmd, cwd=ROOT, env=env, check=False)
  path = os.path.join(out, "aot.json")
  rows = []
  if os.path.exists(path):
    with open(path) as f:
      rows = json.load(f)
  # `aot` exits non-zero when a program does not fit: a finding to record (T5-XXL fine-tuning
  # on a v4-8), not a failed job; any other failure stops the queue.
  if done.returncode and not any(r.get("fits") is False for r in rows):
    raise subprocess.CalledProcessError(done.returncode, cmd)
  mesh = next((g for g in JOBS[job][1] if "mesh" in g), None)
  shown = " ".join(c if " " not in c else repr(c) for c in ["python"] + cmd[1:])
  return results.save_record(RECORDS, PREFIX + job, {"aot": rows, "layout": mesh, "job": job},
                             command=f"ALLOW_MULTIPLE_LIBTPU_LOAD=1 nice -n 19 {shown}")


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--list", action="store_true", help="list the jobs and which are recorded")
  ap.add_argument("--run", action="store_true", help="compile and record the unrecorded jobs")
  ap.add_argument("--jobs", default="", help="comma list of jobs (default: all)")
  ap.add_argument("--out_root", default="/tmp/aot_paper", help="the jobs' output directories")
  args = ap.parse_args(argv)
  jobs = [j for j in args.jobs.split(",") if j] or list(JOBS)
  unknown = [j for j in jobs if j not in JOBS]
  if unknown:
    raise SystemExit(f"unknown jobs {unknown}; --list shows them")
  if args.list or not args.run:
    for j in jobs:
      print(f"{'recorded' if recorded(j) else 'missing ':8s}  {j}: {' '.join(command(j, '…')[3:])}")
    return
  for j in jobs:
    if not recorded(j):
      print(f"{j}: compiling ...", flush=True)
      print(f"{j}: wrote {run_job(j, args.out_root)}", flush=True)


if __name__ == "__main__":
  main()
