"""`python -m specdec_jax.convert`: any input format -> our Orbax dir with model_config.json."""
import os
import subprocess
import sys

import numpy as np
import pytest

from ckpt_testutil import BF16, assert_trees_bit_identical, random_params
from specdec_jax.checkpoints import load_checkpoint, t5x_legacy, t5x_orbax, hf
from specdec_jax.checkpoints.tree import flatten
from specdec_jax.convert import convert

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_convert_library_each_format(tmp_path, small_config):
  params = random_params(small_config)
  t5x_legacy.write(str(tmp_path / "t5x"), params)
  t5x_orbax.write(str(tmp_path / "t5xo"), params)
  hf.to_hf(small_config, params, str(tmp_path / "hf"))
  for fmt, src in (("t5x", "t5x"), ("t5x_orbax", "t5xo"), ("hf", "hf")):
    out = convert(fmt, str(tmp_path / src), str(tmp_path / f"out_{fmt}"), config=small_config)
    config, loaded = load_checkpoint(out)
    assert config == small_config
    assert_trees_bit_identical(loaded, params)
  with pytest.raises(ValueError, match="looks like 't5x'"):
    convert("hf", str(tmp_path / "t5x"), str(tmp_path / "x"))


def test_convert_cli_bf16(tmp_path, t5x_tiny_path):
  out = tmp_path / "tiny"
  cmd = [sys.executable, "-m", "specdec_jax.convert", "--input_format=t5x",
         f"--input={t5x_tiny_path}", f"--output={out}", "--dtype=bfloat16", "--preset=t5_1_1_tiny"]
  res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  assert "arrays: 100%" in res.stderr  # the tqdm bar over arrays
  assert sorted(os.listdir(out)) == ["model_config.json", "params"]
  config, params = load_checkpoint(str(out))
  assert config.emb_dim == 8 and config.vocab_size == 32128
  assert {v.dtype for v in flatten(params).values()} == {np.dtype(BF16)}


def test_convert_cli_usage_error(tmp_path):
  res = subprocess.run([sys.executable, "-m", "specdec_jax.convert", "--input_format=t5x",
                        f"--input={tmp_path}", f"--output={tmp_path}/o", "--preset=a",
                        "--config_json={}"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert res.returncode != 0 and "--preset or --config_json" in res.stderr
