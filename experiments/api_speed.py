r"""The README's Python snippet against the main command, on the same prompts: both speedups.

  python experiments/api_speed.py [--output_dir=/tmp/api_speed]

Why: the API promises the CLI's speed. This runs the snippet of README.md's "Python API" section
as a new user runs it (it decodes its en-de sentences and prints the API's speedup), then the
main command (`python -m specdec_jax.run --gin_file=configs/local/default.gin`) on the same
sentences (written as an `en` JSONL; GAMMA fixed to the snippet's; calibrated in sample, since a
handful of prompts cannot spare held-out ones), and prints both speedups, their ratio and the load
average. A timing: run it alone on the machine, never beside tests.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_snippet() -> str:
  """The first python block of README.md's "Python API" section."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    section = f.read().split("## Python API", 1)[1]
  return section.split("```python\n", 1)[1].split("```", 1)[0]


def run_snippet() -> dict:
  """Executes the snippet; returns its namespace (texts, out, bench) and what it printed."""
  namespace: dict = {}
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    exec(compile(readme_snippet(), "README.md", "exec"), namespace)  # pylint: disable=exec-used
  namespace["printed"] = printed.getvalue()
  return namespace


def run_cli(texts: list[str], gamma: int, output_dir: str) -> dict:
  """The main command on `texts` at `gamma`; its metrics.json."""
  prompts = os.path.join(output_dir, "prompts.jsonl")
  with open(prompts, "w", encoding="utf-8") as f:
    for text in texts:
      f.write(json.dumps({"en": text}) + "\n")
  run_dir = os.path.join(output_dir, "run")
  cmd = [sys.executable, "-m", "specdec_jax.run", "--gin_file=configs/local/default.gin",
         f"--output_dir={run_dir}", f"--gin.TASK='{prompts}'", f"--gin.NUM_EXAMPLES={len(texts)}",
         f"--gin.GAMMA={gamma}", "--gin.RunConfig.calibration='in_sample'",
         "--gin.RunConfig.sample_examples=False"]
  print("$", " ".join(cmd), flush=True)
  subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
  with open(os.path.join(run_dir, "metrics.json"), encoding="utf-8") as f:
    return json.load(f)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--output_dir", default=None, help="where the CLI run goes (default: a temp dir)")
  args = p.parse_args(argv)
  output_dir = args.output_dir or tempfile.mkdtemp(prefix="api_speed_")
  os.makedirs(output_dir, exist_ok=True)
  load_before = os.getloadavg()
  snippet = run_snippet()
  print(snippet["printed"], end="")
  bench = snippet["bench"]
  gamma = bench.speculative.gamma
  metrics = run_cli(snippet["texts"], gamma, output_dir)
  load_after = os.getloadavg()
  api_speedup, cli_speedup = bench.speedup, metrics["speedup"]
  print(f"prompts {len(snippet['texts'])}, gamma {gamma}, batch size 1")
  print(f"API (README snippet): speedup {api_speedup:.3f}x, autoregressive "
        f"{1e3 * bench.autoregressive.seconds:.1f} ms, speculative "
        f"{1e3 * bench.speculative.seconds:.1f} ms, tokens/call "
        f"{bench.speculative.tokens_per_call:.2f}, greedy match {bench.greedy_match_rate:.2f}")
  print(f"CLI (specdec_jax.run): speedup {cli_speedup:.3f}x "
        f"{metrics.get('speedup_interval95')}, tokens/call "
        f"{metrics['tokens_per_target_call']:.2f}, greedy match {metrics['greedy_match_rate']:.2f}")
  print(f"API / CLI = {api_speedup / cli_speedup:.3f} (within 10 %: "
        f"{abs(api_speedup / cli_speedup - 1) <= 0.10}); load average before "
        f"{load_before[0]:.2f}, after {load_after[0]:.2f}; CLI run in {output_dir}")


if __name__ == "__main__":
  main()
