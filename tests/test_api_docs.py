"""The API reference (docs/api.md) is generated from the code and committed current.

Why: a hand-kept reference drifts; `python scripts/api_docs.py` regenerates the page.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_committed_api_reference_matches_the_code():
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "api_docs.py"), "--check"],
                        capture_output=True, text=True, cwd=ROOT)
  assert proc.returncode == 0, proc.stdout + proc.stderr
